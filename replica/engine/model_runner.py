"""ModelRunner: packs one step's sequences into a single forward pass and returns their next-token logits."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from replica.engine.cuda_graphs import DecodeGraphs, can_capture
from replica.engine.decode_step import DecodeRow, DecodeStep
from replica.forward_context import Context, PrefillSpan, set_context
from replica.kv.paged_cache import PagedKVCache
from replica.lora.batch_meta import build_batch_meta
from replica.lora.slots import SlotRef
from replica.model.llama import LlamaForCausalLM

log = logging.getLogger(__name__)

DEFAULT_BLOCK_SIZE = 16


@dataclass(frozen=True)
class StepInput:
    """One sequence's share of a step: new tokens, the position of the first, its blocks and LoRA slot."""

    token_ids: list[int]
    start_pos: int
    block_table: list[int]  # its blocks in position order, covering start_pos + len(token_ids) positions
    slot: SlotRef | None = None  # None: base only
    wants_logits: bool = True  # False for a prompt chunk that does not reach its last token


class ModelRunner:
    """Owns the model and its paged KV cache; run() is one forward over prefill and decode rows together."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        max_num_seqs: int,
        max_model_len: int,
        num_blocks: int | None = None,
        block_size: int = DEFAULT_BLOCK_SIZE,
        cuda_graphs: bool = False,
    ) -> None:
        """cuda_graphs: replay pure-decode steps from captured CUDA graphs where the kernels allow it."""
        self.model = model
        w = model.lm_head.weight
        self.device, self.dtype = w.device, w.dtype
        self.max_num_seqs, self.max_model_len, self.block_size = max_num_seqs, max_model_len, block_size
        self.blocks_per_seq = -(-max_model_len // block_size)
        if num_blocks is None:  # callers without a budget: room for every row at full length
            num_blocks = max_num_seqs * self.blocks_per_seq
        if num_blocks < self.blocks_per_seq:
            raise ValueError(
                f"a KV cache of {num_blocks} blocks of {block_size} tokens cannot hold one sequence of "
                f"max_model_len {max_model_len} (one more block of the budget is the padding rows' sink): "
                "raise the KV budget or lower max_model_len"
            )
        self.kv = PagedKVCache(model, num_blocks, block_size, self.dtype, self.device)
        self.decode = DecodeStep(model, max_num_seqs, self.blocks_per_seq, block_size, self.kv.sink_block)
        self.graphs: DecodeGraphs | None = None
        if cuda_graphs and can_capture(self.device):
            self.graphs = DecodeGraphs(self.decode)
        elif cuda_graphs:  # a GPU without the Triton kernels is worth a warning; the CPU is expected
            level = logging.WARNING if self.device.type == "cuda" else logging.INFO
            log.log(level, "CUDA graphs need CUDA and the Triton kernels; %s steps run eagerly", self.device)

    def row_table(self, row: int) -> list[int]:
        """A fixed block table for callers that drive the runner without a block manager (tests,
        benchmarks): row i owns the i-th run of blocks_per_seq blocks."""
        first = row * self.blocks_per_seq
        if first + self.blocks_per_seq > self.kv.num_blocks:
            raise ValueError(f"row {row} is past the cache's {self.kv.num_blocks} blocks")
        return list(range(first, first + self.blocks_per_seq))

    def _slots(self, s: StepInput) -> list[int]:
        bs = self.block_size
        return [
            s.block_table[p // bs] * bs + p % bs for p in range(s.start_pos, s.start_pos + len(s.token_ids))
        ]

    def _context(self, steps: list[StepInput]) -> Context:
        dev = self.device
        slot_mapping: list[int] = []
        prefills: list[PrefillSpan] = []
        dec_idx: list[int] = []
        dec_tables: list[list[int]] = []
        dec_lens: list[int] = []
        offset = 0
        for s in steps:
            n = len(s.token_ids)
            context_len = s.start_pos + n
            slot_mapping.extend(self._slots(s))
            used = s.block_table[: -(-context_len // self.block_size)]
            if n == 1:
                dec_idx.append(offset)
                dec_tables.append(used)
                dec_lens.append(context_len)
            else:
                blocks = torch.tensor(used, dtype=torch.long, device=dev)
                prefills.append(PrefillSpan(offset, n, context_len, blocks))
            offset += n
        width = max((len(t) for t in dec_tables), default=0)
        tables = [t + [0] * (width - len(t)) for t in dec_tables]  # padding is never read
        segmented = offset > len(steps)  # some row prefills: the Triton path launches per segment
        lora = build_batch_meta([(s.slot, len(s.token_ids)) for s in steps], dev, segmented)
        return Context(
            slot_mapping=torch.tensor(slot_mapping, dtype=torch.long, device=dev),
            prefills=prefills,
            decode_token_idx=torch.tensor(dec_idx, dtype=torch.long, device=dev),
            block_tables=torch.tensor(tables, dtype=torch.int32, device=dev).reshape(len(tables), width),
            context_lens=torch.tensor(dec_lens, dtype=torch.int32, device=dev),
            max_decode_blocks=width,
            lora=lora,
        )

    @torch.inference_mode()
    def run(self, steps: list[StepInput], all_logits: bool = False) -> torch.Tensor:
        """Return fp32 logits: [num_wanting, vocab] for the last token of each step that wants logits, in
        order, or [num_tokens, vocab] with all_logits."""
        for s in steps:
            end = s.start_pos + len(s.token_ids)
            if end > self.max_model_len or -(-end // self.block_size) > len(s.block_table):
                raise ValueError(
                    f"{end} positions pass max_model_len or the step's {len(s.block_table)} blocks"
                )
        if not all_logits and 0 < len(steps) <= self.max_num_seqs and all(_decodes(s) for s in steps):
            return self.run_decode(steps)
        ids = torch.tensor([t for s in steps for t in s.token_ids], dtype=torch.long, device=self.device)
        positions = torch.tensor(
            [s.start_pos + i for s in steps for i in range(len(s.token_ids))],
            dtype=torch.long,
            device=self.device,
        )
        set_context(self._context(steps))
        try:
            hidden = self.model(ids, positions)  # [num_tokens, hidden]
        finally:
            set_context(None)
        if not all_logits:
            ends = torch.tensor([len(s.token_ids) for s in steps]).cumsum(0) - 1
            wanted = [int(e) for e, s in zip(ends, steps, strict=True) if s.wants_logits]
            hidden = hidden[
                torch.tensor(wanted, dtype=torch.long, device=self.device)
            ]  # [num_wanting, hidden]
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def capture_graphs(self, buckets: tuple[int, ...]) -> int:
        """Capture the decode graphs ahead of the first request (buckets: the replica's rank buckets, sorted);
        returns how many were captured (0 where the runner is eager)."""
        self.decode.check_buckets(buckets)
        if self.graphs is None:
            return 0
        count = self.graphs.capture_all(buckets)
        log.info("captured %d decode graphs up to %d rows", count, self.max_num_seqs)
        return count

    def stage_ahead(self, steps: list[StepInput]) -> None:
        """Stage the decoding rows the next step is expected to run (token ids unknown, written when it
        comes) while the device computes this one; the next run_decode keeps what still holds."""
        self.decode.stage_ahead([DecodeRow(0, s.start_pos, s.block_table, s.slot) for s in steps])

    @torch.inference_mode()
    def run_decode(self, steps: list[StepInput]) -> torch.Tensor:
        """fp32 logits [num_steps, vocab] of a batch of decoding rows, through the static decode buffers
        (replayed from a CUDA graph when the runner captures them: then a view valid until the next step)."""
        rows = [DecodeRow(s.token_ids[0], s.start_pos, s.block_table, s.slot) for s in steps]
        batch = self.decode.prepare(rows)
        if self.graphs is not None:
            return self.graphs.run(batch)
        logits = self.decode.forward(batch.padded, batch.buckets, batch.max_blocks, batch.distinct)
        return logits[: batch.rows]


def _decodes(s: StepInput) -> bool:
    """A row that decodes: one new token whose logits are wanted."""
    return len(s.token_ids) == 1 and s.wants_logits
