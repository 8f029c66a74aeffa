"""AdmissionTrace: monotonic timestamps of one request's way from arrival to its first token.

The HTTP layer stamps the event-loop side (arrival, parsed, templated, tokenized, queued, delivered), the
engine thread the rest (picked up, step start and end of its first step). Each field is written once, by
one thread, before the first token is handed back; the event loop reads them all after that hand-back.
"""

from __future__ import annotations

from dataclasses import dataclass

# stage -> (from, to): consecutive marks, so the stages add up to arrival -> first token delivered
STAGES: dict[str, tuple[str, str]] = {
    "http": ("arrived", "parsed"),  # body read, JSON parsed and validated, service token checked
    "template": ("parsed", "templated"),  # chat template rendered
    "tokenize": ("templated", "tokenized"),
    "admit": ("tokenized", "queued"),  # request checks, adapter hold, response start
    "step_wait": ("queued", "boundary"),  # the engine finishing the step it was running
    "handoff": ("boundary", "picked"),  # the engine thread taking the request off its queue
    "schedule": ("picked", "step_start"),  # until the step that admits it starts
    "prefill": ("step_start", "step_end"),  # that step: prefill, sampling, the first token's text
    "first_token_back": ("step_end", "delivered"),  # engine thread -> event loop
}


@dataclass
class AdmissionTrace:
    """time.perf_counter() marks of one request; a mark the request skipped equals the one before it."""

    arrived: float
    parsed: float = 0.0
    templated: float = 0.0
    tokenized: float = 0.0
    queued: float = 0.0
    boundary: float = 0.0  # when the engine was free to take the request: max(queued, end of its step)
    picked: float = 0.0
    step_start: float = 0.0
    step_end: float = 0.0
    delivered: float = 0.0

    def stages(self) -> dict[str, float]:
        """Seconds per stage (STAGES order); never negative."""
        return {name: max(0.0, getattr(self, b) - getattr(self, a)) for name, (a, b) in STAGES.items()}
