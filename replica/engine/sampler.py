"""Sampling parameters and the batched sampler, on the logits' device: only the chosen ids (and, for rows
that ask, their logprobs and the top-k: replica.engine.logprobs) come back.

Per row: logit_bias and the presence/frequency penalties adjust the raw logits; temperature 0 takes their
argmax; otherwise divide by the temperature, keep the top_k, keep the smallest prefix whose mass reaches
top_p, and draw with Gumbel noise keyed by (seed, output index, token id) (sampling_hash), so a row's draw
never depends on the rest of the batch.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import torch

from replica.engine.host_values import from_host
from replica.engine.logprobs import MAX_TOP_LOGPROBS, TokenLogprobs, gather, unpack
from replica.engine.sampling_hash import gumbel, mix32, row_keys
from replica.errors import InvalidRequestError


@dataclass(frozen=True)
class SamplingParams:
    """What a request asks of the sampler and of the stop logic."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None
    presence_penalty: float = 0.0  # subtracted once from each token id in the output so far (not the prompt)
    frequency_penalty: float = 0.0  # subtracted once per occurrence in the output so far
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit), ids distinct
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # None: no logprobs; k: the chosen token's and the k most likely tokens'

    def validate(self, vocab_size: int | None = None) -> None:
        """Raise InvalidRequestError for values outside their range (logit_bias ids: below vocab_size)."""
        ids = [t for t, _ in self.logit_bias]
        checks = [
            ("temperature", 0.0 <= self.temperature <= 100.0),
            ("top_p", 0.0 < self.top_p <= 1.0),
            ("top_k", self.top_k >= 0),
            ("presence_penalty", -2.0 <= self.presence_penalty <= 2.0),
            ("frequency_penalty", -2.0 <= self.frequency_penalty <= 2.0),
            (
                "logit_bias",
                len(set(ids)) == len(ids)
                and all(0 <= t < (vocab_size or 2**31) and -100.0 <= b <= 100.0 for t, b in self.logit_bias),
            ),
            ("max_tokens", self.max_tokens >= 1),
            ("stop", len(self.stop) <= 16 and all(0 < len(s) <= 256 for s in self.stop)),
            ("logprobs", self.logprobs is None or 0 <= self.logprobs <= MAX_TOP_LOGPROBS),
        ]
        for name, ok in checks:
            if not ok:
                raise InvalidRequestError(f"{name}={getattr(self, name)!r} is out of range", param=name)

    @property
    def adjusts_logits(self) -> bool:
        return bool(self.logit_bias) or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


def row_seed(params: SamplingParams) -> int:
    """The request's noise seed: its own, or a random 63-bit one drawn once, so every row takes one path."""
    return params.seed if params.seed is not None else secrets.randbits(63)


def choice_seed(seed: int, index: int) -> int:
    """Choice index's seed among a request's n: the request's own for choice 0, a distinct 63-bit mix of
    (seed, index) for the others, so a seeded request's choices differ yet repeat."""
    if index == 0:
        return seed
    words = torch.tensor([seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF], dtype=torch.int64)
    lo, hi = mix32(words ^ index).tolist()
    return ((hi & 0x7FFFFFFF) << 32) | lo


@dataclass(frozen=True)
class Sampled:
    """One step's chosen ids [rows] and, per row, its logprobs (None where the row asked for none)."""

    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]


def sample(
    logits: torch.Tensor, params: list[SamplingParams], seeds: list[int], outputs: list[list[int]]
) -> list[int]:
    """The chosen ids of sample_step."""
    return sample_step(logits, params, seeds, outputs).token_ids


def sample_step(
    logits: torch.Tensor, params: list[SamplingParams], seeds: list[int], outputs: list[list[int]]
) -> Sampled:
    """Pick one token per row of logits [rows, vocab]; outputs[i] is row i's generated ids so far.

    Contract: row i's token and logprobs are a function of (logits[i], params[i], seeds[i], outputs[i])
    alone. Everything runs with torch ops on logits.device; the only host transfer is one tensor: the
    chosen ids [rows], or with any row asking for logprobs, [rows, 2 + 2k] (logprobs.gather).
    """
    return launch_sample(logits, params, seeds, outputs).read()


@dataclass(frozen=True)
class PendingSample:
    """A draw queued on the logits' device; read() waits for it and brings the ids (and logprobs) back."""

    packed: torch.Tensor  # [rows] chosen ids, or [rows, 2 + 2k] with logprobs (logprobs.gather)
    wants: list[int | None] | None  # each row's logprobs ask; None when no row asked

    def read(self) -> Sampled:
        if self.wants is None:
            ids: list[int] = self.packed.tolist()
            return Sampled(ids, [None] * len(ids))
        return Sampled(*unpack(self.packed.tolist(), self.wants))


def launch_sample(
    logits: torch.Tensor, params: list[SamplingParams], seeds: list[int], outputs: list[list[int]]
) -> PendingSample:
    """sample_step's device work, queued without waiting for the device: the host may do other work
    (the next step's staging, the last step's text) before read()."""
    adjusted = logits  # [rows, vocab]
    if any(p.adjusts_logits for p in params):
        adjusted = _adjust(logits.to(torch.float32, copy=True), params, outputs)
    if all(p.temperature == 0.0 for p in params):
        chosen = adjusted.argmax(dim=-1)  # [rows]
    else:
        chosen = _draw(adjusted.float(), params, seeds, [len(o) for o in outputs])
    wants = [p.logprobs for p in params]
    k = max((w for w in wants if w is not None), default=None)
    if k is None:
        return PendingSample(chosen, None)
    return PendingSample(gather(adjusted, chosen, k), wants)


def _adjust(logits: torch.Tensor, params: list[SamplingParams], outputs: list[list[int]]) -> torch.Tensor:
    """Add logit_bias and subtract the penalties, in place, on logits [rows, vocab] fp32 (a copy)."""
    rows, vocab = logits.shape
    device = logits.device
    bias = [(i, t, b) for i, p in enumerate(params) for t, b in p.logit_bias]
    if bias:
        at = from_host([(i, t) for i, t, _ in bias], torch.int64, device)  # [n, 2]: row, token id
        value = from_host([b for _, _, b in bias], torch.float32, device)  # [n]
        logits.index_put_((at[:, 0], at[:, 1]), value, accumulate=True)
    penalised = [i for i, p in enumerate(params) if p.presence_penalty != 0.0 or p.frequency_penalty != 0.0]
    seen = [(i, t) for i in penalised for t in outputs[i]]
    if seen:
        pairs = from_host(seen, torch.int64, device)  # [n, 2]: row, token id
        counts = torch.zeros(rows * vocab, dtype=torch.float32, device=device)  # [rows * vocab]
        counts.scatter_add_(
            0, pairs[:, 0] * vocab + pairs[:, 1], torch.ones(len(seen), dtype=torch.float32, device=device)
        )
        counts = counts.view(rows, vocab)
        weights = from_host(
            [(p.presence_penalty, p.frequency_penalty) for p in params], torch.float32, device
        )  # [rows, 2]: presence, frequency
        logits -= weights[:, :1] * (counts > 0) + weights[:, 1:] * counts
    return logits


def _draw(
    logits: torch.Tensor, params: list[SamplingParams], seeds: list[int], steps: list[int]
) -> torch.Tensor:
    """Chosen ids [rows] for adjusted logits [rows, vocab] fp32: argmax at temperature 0, else a draw."""
    rows, vocab = logits.shape
    device = logits.device
    knobs = from_host(
        [(p.temperature, p.top_p, min(p.top_k or vocab, vocab)) for p in params], torch.float32, device
    )  # [rows, 3]: temperature, top_p, top_k (off = vocab); top_k < 2**24 is exact in fp32
    temperature, top_p, top_k = knobs.unbind(dim=1)  # [rows] each
    greedy = temperature == 0.0  # [rows]
    scaled = logits / torch.where(greedy, 1.0, temperature)[:, None]  # [rows, vocab]
    if any(p.top_p < 1.0 or 0 < p.top_k < vocab for p in params):
        scaled = scaled.masked_fill(~_nucleus(scaled, top_p, top_k), float("-inf"))
    noisy = scaled + gumbel(row_keys(seeds, steps, device), vocab)  # [rows, vocab]
    return torch.where(greedy, logits.argmax(dim=-1), noisy.argmax(dim=-1))


def _nucleus(scaled: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """Kept tokens [rows, vocab] bool: the top_k [rows] largest of scaled [rows, vocab], then the smallest
    prefix of those, renormalised, whose mass reaches top_p [rows]. The largest is always kept."""
    ordered, order = torch.sort(scaled, dim=-1, descending=True, stable=True)  # [rows, vocab] each
    rank = torch.arange(scaled.shape[-1], device=scaled.device)  # [vocab]
    keep = rank < top_k[:, None]  # [rows, vocab], in sorted order
    probs = torch.softmax(ordered.masked_fill(~keep, float("-inf")), dim=-1)  # [rows, vocab]
    before = torch.cumsum(probs, dim=-1) - probs  # [rows, vocab]: mass of the larger tokens
    keep &= (before < top_p[:, None]) | (top_p[:, None] >= 1.0)
    return torch.empty_like(keep).scatter_(1, order, keep)
