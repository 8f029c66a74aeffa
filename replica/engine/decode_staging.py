"""The decode step's inputs, staged on the host and copied to the device in one transfer.

One int32 buffer holds every per-step input for up to max_rows rows: _SCALARS rows of scalars (token id,
position, KV slot, context length, rank bucket and slot index), one row per rank bucket giving each row's
slot in it (-1: none), then each row's block table, width columns. Padding rows write their K and V into
the sink block, attend to it alone and have no adapter. Every column past a row's blocks names the sink.

Two host buffers alternate, pinned on CUDA, so one can be written while the other's copy is in flight.
While the device runs step N, the engine may stage step N+1 ahead (stage_ahead): the rows it expects,
each one position on, its token not known yet. prepare() of the real rows then writes only their token ids,
and rebuilds any row that differs from the one staged for it: a row that crossed into a new block, or one
that another sequence took over. Rows are compared in full, block table included, since a stale table
would read another sequence's KV; a different row count or set of rank buckets is built from scratch.

A buffer is rewritten only after its last copy has landed (each copy records an event and a write waits
on it).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch

from replica.kernels.gathered import is_mostly_distinct
from replica.lora.slots import SlotRef

MAX_RANK_BUCKETS = 8  # rank buckets a replica may serve at once (the production profile has 3)
_SCALARS = 6  # ids, positions, slot_mapping, context_lens, each row's rank bucket (0: none) and slot

# a row as staged: position, rank bucket and slot index (-1: none), the blocks it reads; None: not staged
RowKey = tuple[int, int, int, list[int]] | None


@dataclass(frozen=True)
class DecodeRow:
    """One decoding row: its new token, that token's position, its block table and its slot."""

    token_id: int
    position: int
    block_table: list[int]
    slot: SlotRef | None


@dataclass(frozen=True)
class Staged:
    """What a prepare() staged: rows real rows padded to padded, and the rank buckets present."""

    rows: int
    padded: int
    buckets: tuple[int, ...]
    max_blocks: int  # blocks the longest row spans (bounds the CPU attention path's reads)
    # the buckets whose rows mostly read distinct slots (kernels.gathered.is_mostly_distinct), counted here
    # on the host so the forward does not sync to count them
    distinct: tuple[int, ...]


class _Buffer:
    """One flat staging tensor and its views: scalars [_SCALARS, r], slots [MAX_RANK_BUCKETS, r] and
    tables [r, width]."""

    def __init__(self, flat: torch.Tensor, rows: int, width: int) -> None:
        self.flat = flat
        self.scalars = flat[: _SCALARS * rows].view(_SCALARS, rows)
        self.slots = flat[_SCALARS * rows : (_SCALARS + MAX_RANK_BUCKETS) * rows].view(MAX_RANK_BUCKETS, rows)
        self.tables = flat[(_SCALARS + MAX_RANK_BUCKETS) * rows :].view(rows, width)
        self.copied: torch.cuda.Event | None = None  # its last copy to the device

    def writable(self, counts: Counter[str]) -> _Buffer:
        """This buffer, once its last copy has landed (a wait the engine's order should never need: each
        step's read of its tokens comes after the copy; counted in copy_waits)."""
        if self.copied is not None and not self.copied.query():
            counts["copy_waits"] += 1
            self.copied.synchronize()
        return self


@dataclass(frozen=True)
class _Ahead:
    buffer: _Buffer
    padded: int
    buckets: tuple[int, ...]
    keys: list[RowKey]


class DecodeStaging:
    """The host buffers, the device buffer the forward reads, and what was staged ahead."""

    def __init__(
        self,
        max_rows: int,
        width: int,
        block_size: int,
        sink: int,
        device: torch.device,
        separate: bool | None = None,
    ) -> None:
        """separate: keep the buffer the forward reads apart from the host buffers, each step copied into
        it from the one written (default: on any device but the CPU; tests set it on the CPU to run the
        device path's alternation)."""
        self.max_rows, self.width, self.block_size, self.sink = max_rows, width, block_size, sink
        n = max_rows * (_SCALARS + MAX_RANK_BUCKETS + width)
        pin = device.type == "cuda"
        self.hosts = [
            _Buffer(torch.zeros(n, dtype=torch.int32, pin_memory=pin), max_rows, width) for _ in "ab"
        ]
        self.events = device.type == "cuda"  # each copy records an event, waited for before a rewrite
        # the forward reads hosts[0] itself: nothing to copy
        self.on_host = not separate if separate is not None else device.type == "cpu"
        flat = self.hosts[0].flat if self.on_host else torch.zeros(n, dtype=torch.int32, device=device)
        self.dev = _Buffer(flat, max_rows, width)
        self._last = 1  # the host buffer copied last
        self.ahead: _Ahead | None = None
        self.bucket_column: dict[int, int] = {}  # rank bucket -> its row of the slot block, fixed once given
        self.counts: Counter[str] = Counter()  # ahead_used, ahead_missed, rows_rebuilt, copy_waits

    def stage_ahead(self, rows: list[DecodeRow], padded: int) -> None:
        """Stage the rows expected next (their token ids unknown) for prepare() to finish. A row whose table
        does not reach its position yet is staged as padding and rebuilt then."""
        self.ahead = None
        if not 0 < len(rows) <= padded <= self.max_rows:
            return
        buf = self._target(ahead=True)
        keys = [self._key(r) for r in rows]
        staged = [  # a row not staged yet stands in as padding (rebuilt in full when it comes)
            r if k is not None else DecodeRow(0, 0, [self.sink], None)
            for r, k in zip(rows, keys, strict=True)
        ]
        present = _present(rows)
        self._build(buf, staged, padded, present)
        self.ahead = _Ahead(buf, padded, present, keys)

    def prepare(self, rows: list[DecodeRow], padded: int) -> Staged:
        """Stage rows, padded to padded, and start their copy to the device."""
        n, present = len(rows), _present(rows)
        ahead, self.ahead = self.ahead, None
        if ahead is not None and len(ahead.keys) == n and ahead.padded == padded and ahead.buckets == present:
            buf = ahead.buffer
            keys = zip(rows, ahead.keys, strict=True)
            changed = [i for i, (r, k) in enumerate(keys) if k is None or self._key(r) != k]
            holds = 2 * len(changed) <= n  # else a fresh build is the cheaper
            self.counts["ahead_used" if holds else "ahead_missed"] += 1
            if holds:
                self._rebuild(buf, rows, changed, present)
                buf.scalars[0, :n] = torch.tensor([r.token_id for r in rows], dtype=torch.int32)
                self.counts["rows_rebuilt"] += len(changed)
            else:
                self._build(buf, rows, padded, present)
        else:
            if ahead is not None:
                self.counts["ahead_missed"] += 1
            buf = self._target(ahead=False)
            self._build(buf, rows, padded, present)
        self._publish(buf)
        widest = max(r.position for r in rows) // self.block_size + 1
        return Staged(n, padded, present, widest, _distinct(rows, present, padded))

    def column(self, bucket: int) -> int:
        """The slot block's row for a rank bucket, given once and kept."""
        if bucket not in self.bucket_column:
            if len(self.bucket_column) == MAX_RANK_BUCKETS:
                raise ValueError(f"more than {MAX_RANK_BUCKETS} rank buckets in one replica")
            self.bucket_column[bucket] = len(self.bucket_column)
        return self.bucket_column[bucket]

    def _key(self, r: DecodeRow) -> RowKey:
        used = r.position // self.block_size + 1
        if used > len(r.block_table):
            return None
        slot = r.slot
        return (r.position, slot.bucket if slot else -1, slot.index if slot else -1, r.block_table[:used])

    def _target(self, ahead: bool) -> _Buffer:
        """The host buffer to write: on the CPU the forward's own, or the spare for a staging ahead; on CUDA
        the one not copied last."""
        if self.on_host:
            return self.hosts[1 if ahead else 0]
        return self.hosts[1 - self._last].writable(self.counts)

    def _publish(self, buf: _Buffer) -> None:
        """Make buf what the forward reads."""
        if self.on_host:
            if buf is not self.dev:
                self.dev.flat.copy_(buf.flat)
            return
        self.dev.flat.copy_(buf.flat, non_blocking=True)
        if self.events:
            buf.copied = torch.cuda.Event()
            buf.copied.record()
        self._last = self.hosts.index(buf)

    def _build(self, buf: _Buffer, rows: list[DecodeRow], b: int, present: tuple[int, ...]) -> None:
        """Write every input of rows, padded to b rows."""
        bs, sink, pad = self.block_size, self.sink, b - len(rows)
        used = [r.position // bs + 1 for r in rows]  # blocks each row attends to
        buf.scalars[:, :b] = torch.tensor(
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
        buf.tables[:b, :widest] = torch.tensor(flat + [sink] * (pad * widest), dtype=torch.int32).view(
            b, widest
        )
        buf.tables[:b, widest:] = sink
        for bucket in present:
            column = [r.slot.index if r.slot is not None and r.slot.bucket == bucket else -1 for r in rows]
            buf.slots[self.column(bucket), :b] = torch.tensor(column + [-1] * pad, dtype=torch.int32)

    def _rebuild(
        self, buf: _Buffer, rows: list[DecodeRow], changed: list[int], present: tuple[int, ...]
    ) -> None:
        """Rewrite the rows at changed in full (every input but the token ids, written after)."""
        bs, sink = self.block_size, self.sink
        for i in changed:
            r = rows[i]
            u, slot = r.position // bs + 1, r.slot
            buf.scalars[1:, i] = torch.tensor(
                [
                    r.position,
                    r.block_table[r.position // bs] * bs + r.position % bs,
                    r.position + 1,
                    slot.bucket if slot is not None else 0,
                    slot.index if slot is not None else 0,
                ],
                dtype=torch.int32,
            )
            buf.tables[i, :u] = torch.tensor(r.block_table[:u], dtype=torch.int32)
            buf.tables[i, u:] = sink
            for bucket in present:
                held = slot is not None and slot.bucket == bucket
                buf.slots[self.column(bucket), i] = slot.index if held and slot is not None else -1


def _distinct(rows: list[DecodeRow], present: tuple[int, ...], padded: int) -> tuple[int, ...]:
    """The buckets whose rows mostly read distinct slots, counted here so the forward need not sync."""
    slots: dict[int, set[int]] = {b: set() for b in present}
    for r in rows:
        if r.slot is not None:
            slots[r.slot.bucket].add(r.slot.index)
    return tuple(b for b in present if is_mostly_distinct(len(slots[b]), padded))


def _present(rows: list[DecodeRow]) -> tuple[int, ...]:
    """The rank buckets the rows' slots are in, sorted."""
    return tuple(sorted({r.slot.bucket for r in rows if r.slot is not None}))
