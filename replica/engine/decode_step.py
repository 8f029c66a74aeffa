"""The decode step on static buffers: every input at a fixed address, so a CUDA graph can replay it.

A batch of decoding rows (one new token each) is padded to a batch-size bucket. Every per-step input (token
ids, positions, KV slots, context lengths, block tables, each rank bucket's slot of every row) is written
on the host into one staging tensor, pinned on CUDA, and reaches the device in one non-blocking copy. The
forward then reads only views of the device copy: no tensor is built from a Python list inside the step, no
value is read back to the host, and no shape depends on the data (the attention kernel on CUDA reads each
row's blocks up to its own length). On the CPU the same function runs eagerly on the same buffers.

Padding rows write their K and V into the cache's sink block, which no sequence owns, attend to it alone,
and have no adapter; their logits are never returned.

The staging tensor is rewritten at the next step's prepare(), after the last copy from it has landed (the
engine's read-back of each step's tokens has waited for it already; prepare() also waits on its event).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from replica.forward_context import Context, set_context
from replica.kernels import ops
from replica.kernels.gathered import is_mostly_distinct
from replica.lora.batch_meta import LoraBatchMeta
from replica.lora.slots import SlotRef
from replica.model.llama import LlamaForCausalLM

MAX_RANK_BUCKETS = 8  # rank buckets a replica may serve at once (the production profile has 3)
_SCALARS = 6  # ids, positions, slot_mapping, context_lens, each row's rank bucket (0: none) and slot


def batch_buckets(max_rows: int) -> list[int]:
    """Padded batch sizes: 1, 2, 4, 8, then every 8 up to max_rows (which is always one)."""
    sizes = [b for b in (1, 2, 4) if b < max_rows] + list(range(8, max_rows, 8)) + [max_rows]
    return sorted(set(sizes))


@dataclass(frozen=True)
class DecodeRow:
    """One decoding row: its new token, that token's position, its block table and its slot."""

    token_id: int
    position: int
    block_table: list[int]
    slot: SlotRef | None


@dataclass(frozen=True)
class PreparedBatch:
    """What the staged buffers hold: rows real rows padded to padded, and the rank buckets present."""

    rows: int
    padded: int
    buckets: tuple[int, ...]
    max_blocks: int  # blocks the longest row spans (bounds the CPU attention path's reads)
    graph_buckets: tuple[int, ...]  # the part of the rank buckets present that a captured step depends on
    # the buckets whose rows mostly read distinct slots (kernels.gathered.mostly_distinct), counted here on
    # the host so the forward does not sync to count them
    distinct: tuple[int, ...] = ()


class DecodeStep:
    """Static decode buffers for up to max_rows rows, and the forward that reads them."""

    def __init__(
        self, model: LlamaForCausalLM, max_rows: int, width: int, block_size: int, sink_block: int
    ) -> None:
        w = model.lm_head.weight
        self.model, self.device = model, w.device
        self.max_rows, self.width, self.block_size, self.sink_block = max_rows, width, block_size, sink_block
        self.buckets = batch_buckets(max_rows)
        n = max_rows * (_SCALARS + MAX_RANK_BUCKETS + width)
        pin = self.device.type == "cuda"
        self.host = torch.zeros(n, dtype=torch.int32, pin_memory=pin)  # [n] the staging copy
        self.dev = (
            self.host if self.device.type == "cpu" else torch.zeros(n, dtype=torch.int32, device=w.device)
        )
        self._host_views = self._views(self.host)
        self._dev_views = self._views(self.dev)
        self.row_index = torch.arange(max_rows, dtype=torch.long, device=self.device)  # [max_rows]
        self.bucket_column: dict[int, int] = {}  # rank bucket -> its row of the slot block, fixed once given
        self.copied: torch.cuda.Event | None = None  # the last staging copy, waited for before a rewrite

    def _views(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        r = self.max_rows
        scalars = flat[: _SCALARS * r].view(_SCALARS, r)  # as _SCALARS lists them
        slots = flat[_SCALARS * r : (_SCALARS + MAX_RANK_BUCKETS) * r].view(MAX_RANK_BUCKETS, r)
        tables = flat[(_SCALARS + MAX_RANK_BUCKETS) * r :].view(r, self.width)
        return scalars, slots, tables

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

    def _column(self, bucket: int) -> int:
        if bucket not in self.bucket_column:
            if len(self.bucket_column) == MAX_RANK_BUCKETS:
                raise ValueError(f"more than {MAX_RANK_BUCKETS} rank buckets in one replica")
            self.bucket_column[bucket] = len(self.bucket_column)
        return self.bucket_column[bucket]

    def prepare(self, rows: list[DecodeRow]) -> PreparedBatch:
        """Stage rows (padded) on the host and start their one copy to the device."""
        n, bs = len(rows), self.block_size
        if not 0 < n <= self.max_rows:
            raise ValueError(f"a decode step takes 1 to {self.max_rows} rows, got {n}")
        b = self.padded_size(n)
        pad, sink = b - n, self.sink_block
        if self.copied is not None:  # the engine's token read-back has waited already; other callers may not
            self.copied.synchronize()
        used = [r.position // bs + 1 for r in rows]  # blocks each row attends to
        scalars, slots, tables = self._host_views
        scalars[:, :b] = torch.tensor(
            [
                [r.token_id for r in rows] + [0] * pad,
                [r.position for r in rows] + [0] * pad,
                [r.block_table[r.position // bs] * bs + r.position % bs for r in rows] + [sink * bs] * pad,
                [r.position + 1 for r in rows] + [1] * pad,
                [r.slot.bucket if r.slot is not None else 0 for r in rows] + [0] * pad,
                [r.slot.index if r.slot is not None else 0 for r in rows] + [0] * pad,
            ],
            dtype=torch.int32,
        )  # [_SCALARS, b]
        # Only the widest row's blocks are built in Python: at 64 rows of 1,500 tokens against a width of 512
        # blocks, a list of every column cost 1.6 ms a step. The columns past it are set to the sink in place.
        widest = max(used)
        flat = [
            blk for r, u in zip(rows, used, strict=True) for blk in r.block_table[:u] + [sink] * (widest - u)
        ]
        tables[:b, :widest] = torch.tensor(flat + [sink] * (pad * widest), dtype=torch.int32).view(b, widest)
        tables[:b, widest:] = sink
        present = tuple(sorted({r.slot.bucket for r in rows if r.slot is not None}))
        distinct = []
        for bucket in present:
            column = [r.slot.index if r.slot is not None and r.slot.bucket == bucket else -1 for r in rows]
            slots[self._column(bucket), :b] = torch.tensor(column + [-1] * pad, dtype=torch.int32)
            if is_mostly_distinct(len(set(column) - {-1}), b):
                distinct.append(bucket)
        if self.dev is not self.host:
            self.dev.copy_(self.host, non_blocking=True)
            self.copied = torch.cuda.Event()
            self.copied.record()
        return PreparedBatch(n, b, present, widest, self.graph_buckets(present), tuple(distinct))

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
        scalars, slots, tables = self._dev_views
        lora = None
        if buckets:
            slot_of_row = {bk: slots[self.bucket_column[bk], :padded] for bk in buckets}  # [padded] each
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
        scalars = self._dev_views[0]
        set_context(self.context(padded, buckets, max_blocks, distinct))
        try:
            hidden = self.model(scalars[0, :padded].long(), scalars[1, :padded].long())  # [padded, hidden]
        finally:
            set_context(None)
        return self.model.compute_logits(hidden)
