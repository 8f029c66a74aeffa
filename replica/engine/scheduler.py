"""Continuous-batching scheduler: plain Python state (waiting, running), KV rows and adapter pins.

Each step admits waiting requests while rows and the prompt-token budget allow, and runs them together with
every running request (their prefill beside the others' decode). Which waiting request goes next is the
admission queue's choice (replica.engine.admission_queue: fifo, or a fair share of tokens across tenants
with a cap on each tenant's rows); the scheduler charges each tenant its prompt at admission and each
token its rows generate. An adapted request's adapter is in a slot
before it is queued; admission pins that slot for the row, and a request whose adapter is in none fails alone.
"""

from __future__ import annotations

import logging
from collections import Counter

from replica.engine.admission_queue import AdmissionQueue, FifoQueue
from replica.engine.kv_cache import RowAllocator
from replica.engine.sequence import Sequence, SequenceStatus
from replica.engine.slot_pins import SlotPins
from replica.errors import AdapterNotFoundError

log = logging.getLogger(__name__)


class Scheduler:
    """Decides which sequences run in the next step."""

    def __init__(
        self,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        rows: RowAllocator,
        pins: SlotPins | None,
        waiting: AdmissionQueue[Sequence] | None = None,
    ) -> None:
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.rows = rows
        self.pins = pins
        self.waiting: AdmissionQueue[Sequence] = waiting if waiting is not None else FifoQueue()
        self.running: list[Sequence] = []
        self.rows_of: Counter[str | None] = Counter()  # tenant -> running rows

    def add(self, seq: Sequence) -> None:
        self.waiting.push(seq.tenant_id, seq)

    def _charge_generated(self) -> None:
        """Charge each running row's tenant for the tokens generated since its last charge."""
        for seq in self.running:
            new = seq.num_tokens - seq.charged
            if new > 0:
                self.waiting.charge(seq.tenant_id, new)
                seq.charged = seq.num_tokens

    def schedule(self) -> tuple[list[Sequence], list[Sequence]]:
        """Admit what fits; return (sequences to run this step, sequences that failed admission)."""
        failed: list[Sequence] = []
        budget = self.max_num_batched_tokens
        self._charge_generated()

        def fits(seq: Sequence) -> bool:
            return len(seq.prompt_token_ids) <= budget or budget == self.max_num_batched_tokens

        while len(self.running) < self.max_num_seqs and self.rows.num_free > 0:
            seq = self.waiting.pick(self.rows_of, fits)
            if seq is None:
                break
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
            self.waiting.charge(seq.tenant_id, len(seq.prompt_token_ids))
            seq.charged = seq.num_tokens
            self.running.append(seq)
            self.rows_of[seq.tenant_id] += 1
        return list(self.running), failed

    def finish(self, seq: Sequence, reason: str) -> None:
        """Free the sequence's KV row and adapter pin at once."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self.rows_of[seq.tenant_id] -= 1
            if not self.rows_of[seq.tenant_id]:
                del self.rows_of[seq.tenant_id]
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
