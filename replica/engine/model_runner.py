"""ModelRunner: packs one step's sequences into a single forward pass and returns their next-token logits."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from replica.engine.kv_cache import KVCache
from replica.forward_context import Context, set_context
from replica.lora.batch_meta import build_batch_meta
from replica.lora.slots import SlotRef
from replica.model.llama import LlamaForCausalLM


@dataclass(frozen=True)
class StepInput:
    """One sequence's share of a step: its KV row, new tokens, first new position and LoRA slot."""

    row: int
    token_ids: list[int]
    start_pos: int
    slot: SlotRef | None = None  # None: base only


class ModelRunner:
    """Owns the model and its KV cache; run() is one forward over prefill and decode rows together."""

    def __init__(self, model: LlamaForCausalLM, max_num_seqs: int, max_model_len: int) -> None:
        self.model = model
        w = model.lm_head.weight
        self.device, self.dtype = w.device, w.dtype
        self.kv = KVCache(model, max_num_seqs, max_model_len, self.dtype, self.device)
        self.max_num_seqs, self.max_model_len = max_num_seqs, max_model_len

    def _context(self, steps: list[StepInput]) -> Context:
        dev = self.device
        token_rows: list[int] = []
        prefills: list[tuple[int, int, int, int]] = []
        dec_idx: list[int] = []
        dec_rows: list[int] = []
        dec_lens: list[int] = []
        offset = 0
        for s in steps:
            n = len(s.token_ids)
            token_rows.extend([s.row] * n)
            if n == 1:
                dec_idx.append(offset)
                dec_rows.append(s.row)
                dec_lens.append(s.start_pos + 1)
            else:
                prefills.append((s.row, offset, n, s.start_pos + n))
            offset += n
        span = max(dec_rows, default=-1) + 1
        segmented = offset > len(steps)  # some row prefills: the Triton path launches per segment
        lora = build_batch_meta([(s.slot, len(s.token_ids)) for s in steps], dev, segmented)
        return Context(
            token_rows=torch.tensor(token_rows, dtype=torch.long, device=dev),
            prefills=prefills,
            decode_token_idx=torch.tensor(dec_idx, dtype=torch.long, device=dev),
            decode_rows=torch.tensor(dec_rows, dtype=torch.long, device=dev),
            decode_span=span,
            decode_mask=self._decode_mask(dec_rows, dec_lens, span),
            max_decode_context_len=max(dec_lens, default=0),
            lora=lora,
        )

    def _decode_mask(self, rows: list[int], lens: list[int], span: int) -> torch.Tensor:
        """[span, 1, 1, width] bool: row r sees its first lens positions; rows not decoding see position 0."""
        width = max(lens, default=0)
        row_len = torch.ones(span, dtype=torch.long)
        row_len[torch.tensor(rows, dtype=torch.long)] = torch.tensor(lens, dtype=torch.long)
        keep = torch.arange(width)[None, :] < row_len[:, None]  # [span, width]
        return keep[:, None, None, :].to(self.device)

    @torch.inference_mode()
    def run(self, steps: list[StepInput], all_logits: bool = False) -> torch.Tensor:
        """Return fp32 logits: [num_seqs, vocab] for each sequence's last token, or [num_tokens, vocab]."""
        for s in steps:
            if s.start_pos + len(s.token_ids) > self.max_model_len:
                raise ValueError(f"row {s.row} would pass max_model_len {self.max_model_len}")
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
            last = torch.tensor(
                [i - 1 for i in torch.tensor([len(s.token_ids) for s in steps]).cumsum(0).tolist()],
                device=self.device,
            )
            hidden = hidden[last]  # [num_seqs, hidden]
        return self.model.compute_logits(hidden)
