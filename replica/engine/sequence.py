"""A request as the engine sees it: tokens, sampling state, its KV row and its adapter slot."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Protocol

import torch

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


@dataclass
class Sequence:
    """One generation request in flight."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    adapter_id: str | None = None  # stable adapter id; None = base model
    tenant_id: str | None = None  # whose fair share it counts against; None = no tenant
    output_token_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    row: int | None = None  # KV-cache row while running
    slot: SlotRef | None = None  # GPU slot pinned for adapter_id while running
    num_cached: int = 0  # tokens whose K/V are in the cache
    charged: int = 0  # tokens already charged to its tenant's fair share
    generator: torch.Generator | None = None
    detokenizer: Detokenizer | None = None
    text: str = ""
    emitted: int = 0  # characters of text already sent
    finish_reason: str | None = None
    error: str | None = None
    trace: AdmissionTrace | None = None  # stamped by the engine until its first step ends

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def next_input(self) -> tuple[list[int], int]:
        """Tokens to feed this step and the position of the first one."""
        all_ids = self.prompt_token_ids + self.output_token_ids
        return all_ids[self.num_cached :], self.num_cached
