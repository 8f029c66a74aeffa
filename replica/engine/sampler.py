"""Sampling parameters and the per-row sampler: greedy at temperature 0, else temperature + top-p."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from replica.errors import InvalidRequestError


@dataclass(frozen=True)
class SamplingParams:
    """What a request asks of the sampler and of the stop logic."""

    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def validate(self) -> None:
        """Raise InvalidRequestError for values outside their range."""
        checks = [
            ("temperature", 0.0 <= self.temperature <= 100.0),
            ("top_p", 0.0 < self.top_p <= 1.0),
            ("max_tokens", self.max_tokens >= 1),
            ("stop", len(self.stop) <= 16 and all(0 < len(s) <= 256 for s in self.stop)),
        ]
        for name, ok in checks:
            if not ok:
                raise InvalidRequestError(f"{name}={getattr(self, name)!r} is out of range", param=name)


def make_generator(params: SamplingParams) -> torch.Generator | None:
    """A CPU generator per seeded request, so its samples do not depend on the rest of the batch."""
    if params.seed is None:
        return None
    return torch.Generator(device="cpu").manual_seed(params.seed)


def _sample_row(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator | None) -> int:
    # logits [vocab] fp32 on CPU
    probs = torch.softmax(logits / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        cum = torch.cumsum(sorted_probs, dim=-1)
        keep = (cum - sorted_probs) < params.top_p  # the smallest prefix whose mass reaches top_p
        sorted_probs = sorted_probs * keep
        choice = torch.multinomial(sorted_probs / sorted_probs.sum(), 1, generator=gen)
        return int(order[choice])
    return int(torch.multinomial(probs, 1, generator=gen))


def sample(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> list[int]:
    """Pick one token per row of logits [num_seqs, vocab]."""
    greedy = logits.argmax(dim=-1).tolist()  # [num_seqs]
    out: list[int] = []
    cpu_logits: torch.Tensor | None = None
    for i, p in enumerate(params):
        if p.temperature == 0.0:
            out.append(greedy[i])
            continue
        if cpu_logits is None:
            cpu_logits = logits.float().cpu()
        out.append(_sample_row(cpu_logits[i], p, generators[i]))
    return out
