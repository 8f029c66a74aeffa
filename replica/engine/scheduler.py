"""Continuous-batching scheduler over a paged KV cache: plain Python state (waiting, running), blocks, pins.

Each step has a budget of tokens (max_num_batched_tokens). Decoding rows go first, one token each, so a
long prompt never stalls them; rows still prefilling take the next chunk of their prompt; then waiting
requests are admitted while rows, blocks and budget allow, the admission queue choosing which (fifo, or
a fair share of tokens across tenants). A request is admitted only when blocks for its whole prompt are
free, less what the prefix cache already holds for it. When a decoding row needs a block and none is
free, the most recently admitted row is preempted: its blocks are freed (they stay cached), it waits at
the head of its tenant's queue and is computed again when readmitted (recompute, not swap). It keeps
its adapter pin while it waits, so its adapter stays in its slot; nothing is dropped.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass

from replica.engine.admission_queue import AdmissionQueue, FifoQueue
from replica.engine.sequence import Sequence, SequenceStatus
from replica.engine.slot_pins import SlotPins
from replica.errors import AdapterNotFoundError
from replica.kv.block_hash import extend_keys
from replica.kv.blocks import BlockManager

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Scheduled:
    """One row of a step: compute num_new tokens of seq from position seq.num_cached."""

    seq: Sequence
    num_new: int

    @property
    def completes(self) -> bool:
        """Whether this step reaches the sequence's last token, so it samples the next one."""
        return self.seq.num_cached + self.num_new == self.seq.num_tokens


@dataclass
class CacheCounters:
    """Prefix-cache queries and hits in tokens, and preemptions, since start (read by the metrics)."""

    queries: int = 0
    hits: int = 0
    preemptions: int = 0


class Scheduler:
    """Decides which sequences run in the next step, and how many of their tokens."""

    def __init__(
        self,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        blocks: BlockManager,
        pins: SlotPins | None,
        waiting: AdmissionQueue[Sequence] | None = None,
        chunked_prefill: bool = True,
        watermark_blocks: int = 0,
    ) -> None:
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.blocks = blocks
        self.pins = pins
        self.waiting: AdmissionQueue[Sequence] = waiting if waiting is not None else FifoQueue()
        self.chunked_prefill = chunked_prefill
        self.watermark_blocks = watermark_blocks  # kept free at admission, so decoding rarely preempts
        self.running: list[Sequence] = []  # in admission order
        self.rows_of: Counter[str | None] = Counter()  # tenant -> running rows
        self.counters = CacheCounters()

    def add(self, seq: Sequence) -> None:
        self.waiting.push(seq.tenant_id, seq)

    def _charge_generated(self) -> None:
        """Charge each running row's tenant for the tokens generated since its last charge."""
        for seq in self.running:
            new = seq.num_tokens - seq.charged
            if new > 0:
                self.waiting.charge(seq.tenant_id, new)
                seq.charged = seq.num_tokens

    def schedule(self) -> tuple[list[Scheduled], list[Sequence]]:
        """Plan one step; return (rows to run, sequences that failed admission)."""
        self._charge_generated()
        budget = self.max_num_batched_tokens
        plan: list[Scheduled] = []
        preempted = False
        decoding = [s for s in self.running if s.num_uncomputed == 1]
        prefilling = [s for s in self.running if s.num_uncomputed > 1]
        for seq in decoding + prefilling:
            if seq.status is not SequenceStatus.RUNNING or budget == 0:
                continue  # preempted to make room for an earlier row this step, or out of budget
            n = seq.num_uncomputed if not self.chunked_prefill else min(seq.num_uncomputed, budget)
            if n > budget:
                continue  # an unchunked prompt waits for a step with room for all of it
            grown, victims = self._grow(seq, seq.num_cached + n)
            if victims:
                preempted = True
                budget += sum(p.num_new for p in plan if any(p.seq is v for v in victims))
                plan = [p for p in plan if not any(p.seq is v for v in victims)]
            if grown:
                plan.append(Scheduled(seq, n))
                budget -= n
        failed: list[Sequence] = []
        if not preempted:  # memory is short this step: admit nobody
            budget = self._admit(plan, failed, budget)
        return plan, failed

    def _grow(self, seq: Sequence, num_tokens: int) -> tuple[bool, list[Sequence]]:
        """Give seq blocks for num_tokens positions, preempting the latest admitted rows until they fit;
        (whether seq got them, the rows preempted). seq itself is the last to go."""
        victims: list[Sequence] = []
        while not self.blocks.allocate(seq.request_id, num_tokens):
            victim = self.running[-1]
            self.preempt(victim)
            victims.append(victim)
            if victim is seq:
                return False, victims
        return True, victims

    def _admit(self, plan: list[Scheduled], failed: list[Sequence], budget: int) -> int:
        def fits(seq: Sequence) -> bool:
            if not self.chunked_prefill and seq.num_tokens > budget and budget < self.max_num_batched_tokens:
                return False  # an unchunked prompt runs in one step: it needs the whole budget's room
            hits = self._hits(seq)
            return self.blocks.can_allocate(seq.request_id, seq.num_tokens, hits, self.watermark_blocks)

        while budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting.pick(self.rows_of, fits)
            if seq is None:
                break
            if seq.slot is None and seq.adapter_id is not None and self.pins is not None:
                try:
                    seq.slot = self.pins.acquire(seq.adapter_id)
                except AdapterNotFoundError as exc:
                    seq.status, seq.finish_reason, seq.error = SequenceStatus.FINISHED, "error", str(exc)
                    failed.append(seq)
                    continue
            hits = self._hits(seq)
            allocated = self.blocks.allocate(seq.request_id, seq.num_tokens, hits)
            assert allocated, "fits() saw these blocks free a moment ago"
            seq.num_cached = len(hits) * self.blocks.block_size
            self.counters.queries += seq.num_tokens
            self.counters.hits += seq.num_cached
            if not seq.admitted:
                seq.cached_tokens, seq.admitted = seq.num_cached, True
            seq.status = SequenceStatus.RUNNING
            log.info(
                "admitted request %s adapter=%s slot=%s cached=%d/%d",
                seq.request_id,
                seq.adapter_id,
                seq.slot,
                seq.num_cached,
                seq.num_tokens,
            )
            self.waiting.charge(seq.tenant_id, seq.num_tokens - seq.charged)
            seq.charged = seq.num_tokens
            self.running.append(seq)
            self.rows_of[seq.tenant_id] += 1
            n = seq.num_uncomputed if not self.chunked_prefill else min(seq.num_uncomputed, budget)
            plan.append(Scheduled(seq, n))
            budget -= n
        return budget

    def _hits(self, seq: Sequence) -> list[int]:
        """The cached blocks a sequence holding no block can start from; at least its last token is left
        to compute, since that step yields the logits of the next."""
        extend_keys(seq.block_keys, seq.token_ids, seq.scope, self.blocks.block_size)
        return self.blocks.cached_prefix(seq.block_keys, (seq.num_tokens - 1) // self.blocks.block_size)

    def computed(self, scheduled: Scheduled) -> None:
        """After a step ran it: its tokens' K/V are in the cache, and its full blocks become shareable."""
        seq = scheduled.seq
        seq.num_cached += scheduled.num_new
        extend_keys(seq.block_keys, seq.token_ids[: seq.num_cached], seq.scope, self.blocks.block_size)
        self.blocks.cache(seq.request_id, seq.block_keys[: seq.num_cached // self.blocks.block_size])

    def preempt(self, seq: Sequence) -> None:
        """Free a running row's blocks and queue it again, first in its tenant's line; its pin stays."""
        log.warning("preempting request %s (%d tokens) to free KV blocks", seq.request_id, seq.num_tokens)
        self._leave_running(seq)
        seq.status, seq.num_cached = SequenceStatus.WAITING, 0
        seq.preemptions += 1
        self.counters.preemptions += 1
        self.waiting.push_front(seq.tenant_id, seq)

    def _leave_running(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.rows_of[seq.tenant_id] -= 1
        if not self.rows_of[seq.tenant_id]:
            del self.rows_of[seq.tenant_id]
        self.blocks.free_sequence(seq.request_id)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Free the sequence's blocks and adapter pin at once."""
        if seq.status is SequenceStatus.RUNNING:
            self._leave_running(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        if seq.slot is not None and seq.adapter_id is not None and self.pins is not None:
            self.pins.release(seq.adapter_id)
        seq.slot = None
        seq.status, seq.finish_reason = SequenceStatus.FINISHED, reason
