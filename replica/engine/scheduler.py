"""Continuous-batching scheduler: plain Python state (waiting, running), KV rows and adapter pins.

Each step admits waiting requests while rows and the prompt-token budget allow, and runs them together with
every running request (their prefill beside the others' decode). An adapted request's adapter is in a slot
before it is queued; admission pins that slot for the row, and a request whose adapter is in none fails alone.
"""

from __future__ import annotations

import logging
from collections import deque

from replica.engine.kv_cache import RowAllocator
from replica.engine.sequence import Sequence, SequenceStatus
from replica.engine.slot_pins import SlotPins
from replica.errors import AdapterNotFoundError

log = logging.getLogger(__name__)


class Scheduler:
    """Decides which sequences run in the next step."""

    def __init__(
        self, max_num_seqs: int, max_num_batched_tokens: int, rows: RowAllocator, pins: SlotPins | None
    ) -> None:
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.rows = rows
        self.pins = pins
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def schedule(self) -> tuple[list[Sequence], list[Sequence]]:
        """Admit what fits; return (sequences to run this step, sequences that failed admission)."""
        failed: list[Sequence] = []
        budget = self.max_num_batched_tokens
        kept: deque[Sequence] = deque()
        while self.waiting:
            seq = self.waiting.popleft()
            fits = len(self.running) < self.max_num_seqs and self.rows.num_free > 0
            if not fits or (len(seq.prompt_token_ids) > budget and budget < self.max_num_batched_tokens):
                kept.append(seq)
                continue
            slot = None
            if seq.adapter_id is not None and self.pins is not None:
                try:
                    slot = self.pins.acquire(seq.adapter_id)
                except AdapterNotFoundError as exc:
                    seq.status, seq.finish_reason, seq.error = SequenceStatus.FINISHED, "error", str(exc)
                    failed.append(seq)
                    continue
            seq.row, seq.slot, seq.status = self.rows.allocate(), slot, SequenceStatus.RUNNING
            log.info(
                "admitted request %s adapter=%s slot=%s row=%s", seq.request_id, seq.adapter_id, slot, seq.row
            )
            budget -= len(seq.prompt_token_ids)
            self.running.append(seq)
        self.waiting = kept
        return list(self.running), failed

    def finish(self, seq: Sequence, reason: str) -> None:
        """Free the sequence's KV row and adapter pin at once."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            assert seq.row is not None
            self.rows.free(seq.row)
            if seq.adapter_id is not None and self.pins is not None:
                self.pins.release(seq.adapter_id)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        seq.row, seq.slot = None, None
        seq.status, seq.finish_reason = SequenceStatus.FINISHED, reason

    def tokens_in_flight(self) -> int:
        """Tokens held or about to be held in KV: every running and waiting sequence's length so far."""
        return sum(s.num_tokens for s in self.running) + sum(len(s.prompt_token_ids) for s in self.waiting)
