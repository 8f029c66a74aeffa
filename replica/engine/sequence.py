"""A request as the engine sees it: tokens, sampling state, its KV blocks and its adapter slot."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Protocol

from replica.engine.grammar_mask import Grammar
from replica.engine.sampler import SamplingParams
from replica.engine.trace import AdmissionTrace
from replica.lora.slots import SlotRef


class Detokenizer(Protocol):
    """Turns token ids into text deltas that never split a UTF-8 character."""

    def push(self, token_id: int) -> str: ...

    def flush(self) -> str: ...


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """One generation request in flight (compared by identity)."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    adapter_id: str | None = None  # stable adapter id; None = base model
    tenant_id: str | None = None  # whose fair share it counts against; None = no tenant
    output_token_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    slot: SlotRef | None = None  # GPU slot pinned for adapter_id from admission to the end (preemption too)
    num_cached: int = 0  # tokens whose K/V are in its blocks (0 again after a preemption)
    scope: bytes = b""  # CacheScope digest: whose blocks it may share (base, adapter version, salt)
    block_keys: list[bytes] = field(default_factory=list)  # keys of its full blocks' tokens so far
    cached_tokens: int = 0  # prompt tokens its first admission found in the prefix cache
    admitted: bool = False  # admitted once already (a preempted sequence waits again)
    preemptions: int = 0
    charged: int = 0  # tokens already charged to its tenant's fair share
    seed: int = 0  # keys the sampler's noise: the request's seed, or a random one (sampler.row_seed)
    detokenizer: Detokenizer | None = None
    text: str = ""
    emitted: int = 0  # characters of text already sent
    finish_reason: str | None = None
    error: str | None = None
    trace: AdmissionTrace | None = None  # stamped by the engine until its first step ends
    grammar: Grammar | None = None  # its own structured-output state; None = unconstrained

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_uncomputed(self) -> int:
        """Tokens whose K/V are not in its blocks yet: 1 while it decodes, more while it prefills."""
        return self.num_tokens - self.num_cached
