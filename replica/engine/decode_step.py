"""The decode step on static buffers: every input at a fixed address, so a CUDA graph can replay it.

A batch of decoding rows (one new token each) is padded to a batch-size bucket. Every per-step input (token
ids, positions, KV slots, context lengths, block tables, each rank bucket's slot of every row) is staged on
the host and reaches the device in one non-blocking copy (replica.engine.decode_staging, which can also
stage the next step's rows while the device runs this one). The forward then reads only views of the
device copy: no tensor is built from a Python list inside the step, no value is read back to the host, and
no shape depends on the data (the attention kernel on CUDA reads each row's blocks up to its own length).
On the CPU the same function runs eagerly on the same buffers.

Padding rows write their K and V into the cache's sink block, which no sequence owns, attend to it alone,
and have no adapter; their logits are never returned.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from replica.engine.decode_staging import MAX_RANK_BUCKETS, DecodeRow, DecodeStaging, Staged
from replica.forward_context import Context, set_context
from replica.kernels import ops
from replica.lora.batch_meta import LoraBatchMeta
from replica.lora.slots import SlotRef
from replica.model.llama import LlamaForCausalLM

__all__ = ["MAX_RANK_BUCKETS", "DecodeRow", "DecodeStep", "PreparedBatch", "batch_buckets"]


def batch_buckets(max_rows: int) -> list[int]:
    """Padded batch sizes: 1, 2, 4, 8, then every 8 up to max_rows (which is always one)."""
    sizes = [b for b in (1, 2, 4) if b < max_rows] + list(range(8, max_rows, 8)) + [max_rows]
    return sorted(set(sizes))


@dataclass(frozen=True)
class PreparedBatch(Staged):
    """What the staged buffers hold (Staged), and what a captured step of them depends on."""

    graph_buckets: tuple[int, ...] = ()  # the part of the rank buckets present a captured step depends on


class DecodeStep:
    """Static decode buffers for up to max_rows rows, and the forward that reads them."""

    def __init__(
        self, model: LlamaForCausalLM, max_rows: int, width: int, block_size: int, sink_block: int
    ) -> None:
        w = model.lm_head.weight
        self.model, self.device = model, w.device
        self.max_rows, self.width, self.block_size, self.sink_block = max_rows, width, block_size, sink_block
        self.buckets = batch_buckets(max_rows)
        self.staging = DecodeStaging(max_rows, width, block_size, sink_block, self.device)
        self.row_index = torch.arange(max_rows, dtype=torch.long, device=self.device)  # [max_rows]

    def dummy_rows(self, n: int, bucket: int | None) -> list[DecodeRow]:
        """n rows that touch nothing but the sink block (and read slot 0 of bucket, if given): for capturing
        a padded size before any request needs it."""
        slot = SlotRef(bucket, 0) if bucket is not None else None
        return [DecodeRow(0, 0, [self.sink_block], slot) for _ in range(n)]

    def padded_size(self, rows: int) -> int:
        """The smallest batch bucket holding rows."""
        return next(b for b in self.buckets if b >= rows)

    def check_buckets(self, buckets: tuple[int, ...]) -> None:
        """Refuse, at start, more rank buckets than the slot block has rows for."""
        if len(buckets) > MAX_RANK_BUCKETS:
            raise ValueError(f"{len(buckets)} rank buckets; a decode step serves at most {MAX_RANK_BUCKETS}")

    def prepare(self, rows: list[DecodeRow]) -> PreparedBatch:
        """Stage rows (padded) on the host and start their one copy to the device."""
        n = len(rows)
        if not 0 < n <= self.max_rows:
            raise ValueError(f"a decode step takes 1 to {self.max_rows} rows, got {n}")
        s = self.staging.prepare(rows, self.padded_size(n))
        return PreparedBatch(
            s.rows, s.padded, s.buckets, s.max_blocks, s.distinct, self.graph_buckets(s.buckets)
        )

    def stage_ahead(self, rows: list[DecodeRow]) -> None:
        """Stage the rows the next step is expected to run, their token ids still unknown, while the device
        runs this one; the next prepare() uses what still holds (DecodeStaging)."""
        n = len(rows)
        self.staging.stage_ahead(rows, self.padded_size(n) if 0 < n <= self.max_rows else 0)

    def graph_buckets(self, present: tuple[int, ...]) -> tuple[int, ...]:
        """What a captured step depends on: the buckets present, or only whether any is where one launch
        covers every bucket (ops.one_launch_for)."""
        if ops.one_launch_for(self.device) is not None:
            return (0,) if present else ()
        return present

    def context(
        self, padded: int, buckets: tuple[int, ...], max_blocks: int, distinct: tuple[int, ...] = ()
    ) -> Context:
        """The forward's metadata: views of the device buffers for the first padded rows (distinct: as
        PreparedBatch has it)."""
        dev = self.staging.dev
        scalars, slots, tables = dev.scalars, dev.slots, dev.tables
        lora = None
        if buckets:
            slot_of_row = {
                bk: slots[self.staging.bucket_column[bk], :padded] for bk in buckets
            }  # [padded] each
            # None on the CUDA kernels
            layouts = {bk: ops.prepare(s, distinct=bk in distinct) for bk, s in slot_of_row.items()}
            rows = (scalars[4, :padded], scalars[5, :padded]) if ops.one_launch_for(self.device) else None
            lora = LoraBatchMeta(slot_of_row, layouts, rows)
        return Context(
            slot_mapping=scalars[2, :padded].long(),
            prefills=[],
            decode_token_idx=self.row_index[:padded],
            block_tables=tables[:padded],
            context_lens=scalars[3, :padded],
            max_decode_blocks=max_blocks,
            lora=lora,
            all_decode=True,
        )

    def forward(
        self, padded: int, buckets: tuple[int, ...], max_blocks: int, distinct: tuple[int, ...] = ()
    ) -> torch.Tensor:
        """Logits [padded, vocab] (fp32) of the staged rows; the caller keeps the real rows'."""
        scalars = self.staging.dev.scalars
        set_context(self.context(padded, buckets, max_blocks, distinct))
        try:
            hidden = self.model(scalars[0, :padded].long(), scalars[1, :padded].long())  # [padded, hidden]
        finally:
            set_context(None)
        return self.model.compute_logits(hidden)
