"""Logprobs from the sampler: the log-softmax of the processed logits the token was drawn from, top-k
included, per row alone; asking for them changes no token."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from replica.engine.sampler import SamplingParams, choice_seed, sample_step
from replica.errors import InvalidRequestError

VOCAB = 64


def _logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3  # [rows, vocab]


def test_logprobs_are_the_log_softmax_of_the_biased_and_penalised_logits() -> None:
    logits = _logits(2)
    params = SamplingParams(
        temperature=0.7,
        top_p=0.5,
        logit_bias=((3, 5.0),),
        presence_penalty=1.0,
        frequency_penalty=0.5,
        logprobs=4,
    )
    outputs = [[1, 1, 2], [5]]
    sampled = sample_step(logits, [params, params], [11, 12], outputs)
    for row, out in enumerate(outputs):
        processed = logits[row].clone()
        processed[3] += 5.0
        for t in set(out):
            processed[t] -= 1.0 + 0.5 * out.count(t)
        expected = torch.log_softmax(processed, dim=-1)  # [vocab]
        got = sampled.logprobs[row]
        assert got is not None
        token = sampled.token_ids[row]
        assert got.logprob == pytest.approx(float(expected[token]), abs=1e-5)
        values, ids = expected.topk(4)
        assert [t for t, _ in got.top] == ids.tolist()
        assert [v for _, v in got.top] == pytest.approx(values.tolist(), abs=1e-5)


def test_greedy_tokens_are_the_same_with_logprobs_on_and_off() -> None:
    logits = _logits(4, seed=1)
    off = [SamplingParams(temperature=0.0, logit_bias=((7, 2.0),))] * 4
    on = [replace(p, logprobs=20) for p in off]
    outputs: list[list[int]] = [[], [7], [7, 7], [1]]
    plain, with_logprobs = (
        sample_step(logits, off, [0] * 4, outputs),
        sample_step(logits, on, [0] * 4, outputs),
    )
    assert plain.token_ids == with_logprobs.token_ids
    assert plain.logprobs == [None] * 4
    for token, lp in zip(with_logprobs.token_ids, with_logprobs.logprobs, strict=True):
        assert lp is not None and lp.top[0][0] == token and lp.top[0][1] == lp.logprob


def test_a_rows_logprobs_do_not_depend_on_the_rest_of_the_batch() -> None:
    logits = _logits(5, seed=2)
    mine = SamplingParams(temperature=1.0, seed=3, logprobs=2)
    others = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.5, logprobs=9, top_k=3)] * 2
    alone = sample_step(logits[2:3], [mine], [3], [[4]])
    batch = sample_step(
        logits,
        [others[0], others[1], mine, others[2], others[3]],
        [1, 2, 3, 4, 5],
        [[]] * 2 + [[4]] + [[]] * 2,
    )
    assert batch.token_ids[2] == alone.token_ids[0]
    assert batch.logprobs[2] == alone.logprobs[0]
    assert batch.logprobs[0] is None
    assert len(batch.logprobs[1].top) == 9 and len(batch.logprobs[2].top) == 2  # type: ignore[union-attr]


def test_zero_top_logprobs_still_gives_the_chosen_tokens_logprob() -> None:
    sampled = sample_step(_logits(1), [SamplingParams(temperature=0.0, logprobs=0)], [0], [[]])
    lp = sampled.logprobs[0]
    assert lp is not None and lp.top == () and lp.logprob <= 0.0


def test_more_than_twenty_top_logprobs_is_refused() -> None:
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams(logprobs=21).validate(VOCAB)
    assert err.value.param == "logprobs"


def test_choice_seeds_differ_per_choice_and_repeat() -> None:
    seeds = [choice_seed(42, i) for i in range(8)]
    assert seeds[0] == 42 and len(set(seeds)) == 8
    assert seeds == [choice_seed(42, i) for i in range(8)]
    assert choice_seed(-5, 1) != choice_seed(-5, 2) and all(0 <= s < 2**63 for s in seeds)
