"""The device sampler: greedy, temperature, top-k and top-p draws, penalties and bias, seeded batch invariance,
validation, and no copy of the logits to the host."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

from replica.engine import sampler as sampler_module
from replica.engine.grammar_mask import constrain
from replica.engine.sampler import SamplingParams, row_seed, sample
from replica.engine.sampling_hash import MASK32, mix32, row_keys, uniforms
from replica.errors import InvalidRequestError

GREEDY = SamplingParams(temperature=0.0)
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")),
]


def _counts(tokens: list[int], vocab: int) -> torch.Tensor:
    return torch.bincount(torch.tensor(tokens), minlength=vocab).double()  # [vocab]


def _chi2(tokens: list[int], probs: torch.Tensor) -> float:
    """Pearson's statistic of the drawn tokens against probs [vocab] over the tokens probs allows."""
    expected = probs.double() * len(tokens)  # [vocab]
    seen = _counts(tokens, len(probs))
    allowed = expected > 0
    assert seen[~allowed].sum() == 0, "a token outside the distribution was drawn"
    return float(((seen - expected)[allowed] ** 2 / expected[allowed]).sum())


def _draws(row: torch.Tensor, params: SamplingParams, n: int, device: str = "cpu") -> list[int]:
    """n draws from one logits row [vocab], one per seed, in one batched call."""
    logits = row.to(device).repeat(n, 1)  # [n, vocab]
    return sample(logits, [params] * n, list(range(n)), [[] for _ in range(n)])


def _refuse(*_: Any, **__: Any) -> Any:
    raise AssertionError("called on a path that must not call it")


# greedy and the fast paths


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_takes_the_argmax_without_sorting_or_hashing(
    device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    logits = torch.randn(16, 300, generator=torch.Generator().manual_seed(0)).to(device)  # [16, 300]
    monkeypatch.setattr(torch, "sort", _refuse)
    monkeypatch.setattr(sampler_module, "gumbel", _refuse)
    assert sample(logits, [GREEDY] * 16, list(range(16)), [[1, 2]] * 16) == logits.argmax(-1).tolist()


def test_only_top_p_or_top_k_rows_sort(monkeypatch: pytest.MonkeyPatch) -> None:
    sorts: list[int] = []
    real_sort = torch.sort

    def counting_sort(*args: Any, **kwargs: Any) -> Any:
        sorts.append(1)
        return real_sort(*args, **kwargs)

    monkeypatch.setattr(torch, "sort", counting_sort)
    logits = torch.randn(4, 50)  # [4, 50]
    sample(logits, [SamplingParams(temperature=0.8)] * 4, [1, 2, 3, 4], [[]] * 4)
    assert sorts == []
    sample(logits, [SamplingParams(temperature=0.8)] * 3 + [SamplingParams(top_k=5)], [1, 2, 3, 4], [[]] * 4)
    sample(
        logits, [SamplingParams(temperature=0.8)] * 3 + [SamplingParams(top_p=0.9)], [1, 2, 3, 4], [[]] * 4
    )
    assert sorts == [1, 1]


# the drawn distribution


@pytest.mark.parametrize("device", DEVICES)
def test_draws_follow_softmax_of_logits_over_temperature(device: str) -> None:
    row = torch.tensor([1.0, 0.5, 0.0, -0.5, 2.0, -1.0])  # [6]
    tokens = _draws(row, SamplingParams(temperature=0.7), 12000, device)
    assert _chi2(tokens, torch.softmax(row / 0.7, dim=-1)) < 25.0  # 5 degrees of freedom: p < 2e-4 by chance
    assert _chi2(tokens, torch.softmax(row, dim=-1)) > 200.0  # the temperature is really applied


def test_top_k_draws_only_the_k_largest_renormalised() -> None:
    row = torch.tensor([0.3, 2.0, -1.0, 1.5, 0.0, 1.8, -0.5, 0.9])  # [8]: the top 3 are 1, 5, 3
    tokens = _draws(row, SamplingParams(top_k=3), 9000)
    assert set(tokens) == {1, 3, 5}
    top = torch.full_like(row, float("-inf"))
    top[[1, 3, 5]] = row[[1, 3, 5]]
    assert _chi2(tokens, torch.softmax(top, dim=-1)) < 20.0  # 2 degrees of freedom


@pytest.mark.parametrize(
    ("top_p", "kept"),
    [(0.49, {0}), (0.51, {0, 1}), (0.74, {0, 1}), (0.76, {0, 1, 2}), (1.0, {0, 1, 2, 3, 4})],
)
def test_top_p_keeps_the_smallest_prefix_whose_mass_reaches_it(top_p: float, kept: set[int]) -> None:
    probs = torch.tensor([0.5, 0.25, 0.125, 0.0625, 0.0625])  # prefix masses 0.5, 0.75, 0.875, ...
    tokens = _draws(probs.log(), SamplingParams(top_p=top_p), 6000)
    assert set(tokens) == kept
    allowed = torch.zeros_like(probs)
    allowed[list(kept)] = probs[list(kept)]
    assert _chi2(tokens, allowed / allowed.sum()) < 25.0


def test_top_p_applies_to_the_top_k_renormalised() -> None:
    probs = torch.tensor([0.5, 0.25, 0.125, 0.125])
    # top 2 renormalised is (2/3, 1/3): token 0 alone reaches 0.6 (on the full distribution it would not)
    assert set(_draws(probs.log(), SamplingParams(top_k=2, top_p=0.6), 2000)) == {0}
    assert set(_draws(probs.log(), SamplingParams(top_k=3, top_p=0.6), 2000)) == {0, 1}


# seeds and batch invariance


def _mixed_batch(vocab: int) -> tuple[torch.Tensor, list[SamplingParams], list[int], list[list[int]]]:
    """Six other rows: greedy, top-p, top-k with bias, penalties, a high temperature, greedy with a penalty."""
    logits = torch.randn(6, vocab, generator=torch.Generator().manual_seed(5)) * 3  # [6, vocab]
    params = [
        GREEDY,
        SamplingParams(top_p=0.8),
        SamplingParams(top_k=4, logit_bias=((3, 5.0),)),
        SamplingParams(presence_penalty=1.5, frequency_penalty=0.5),
        SamplingParams(temperature=2.5),
        SamplingParams(temperature=0.0, frequency_penalty=2.0),
    ]
    outputs = [[1, 2], [], [4, 4, 4], [0, 1, 1, 7], [9], [3, 3]]
    return logits, params, [11, 12, 13, 14, 15, 16], outputs


ROW_PARAMS = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.9, top_p=0.9),
    SamplingParams(temperature=1.2, top_k=8, presence_penalty=0.8),
    SamplingParams(temperature=1.0, frequency_penalty=1.0, logit_bias=((2, 1.0),)),
]


def test_a_seeded_row_draws_the_same_token_alone_first_or_last_in_a_mixed_batch() -> None:
    vocab = 40
    others, other_params, other_seeds, other_outputs = _mixed_batch(vocab)
    gen = torch.Generator().manual_seed(9)
    drawn = []
    for trial in range(48):
        row = torch.randn(1, vocab, generator=gen)  # [1, vocab]
        params, seed, output = ROW_PARAMS[trial % 4], 1000 + trial, [5, 6, 5][: trial % 4]
        alone = sample(row, [params], [seed], [output])
        first = sample(
            torch.cat([row, others]), [params, *other_params], [seed, *other_seeds], [output, *other_outputs]
        )
        last = sample(
            torch.cat([others, row]), [*other_params, params], [*other_seeds, seed], [*other_outputs, output]
        )
        assert alone == first[:1] == last[-1:], f"trial {trial}"
        assert first[1:] == last[:-1]  # the other rows do not depend on where this one is either
        drawn.append(alone[0])
    assert len(set(drawn)) > 10


def test_the_seed_and_the_output_index_each_change_the_draw() -> None:
    row = torch.zeros(1, 64)  # [1, 64]: uniform, so only the noise decides
    params = SamplingParams(temperature=1.0)
    by_seed = [sample(row, [params], [seed], [[]])[0] for seed in range(32)]
    by_index = [sample(row, [params], [7], [[0] * n])[0] for n in range(32)]
    assert len(set(by_seed)) > 16 and len(set(by_index)) > 16
    assert [sample(row, [params], [seed], [[]])[0] for seed in range(32)] == by_seed


def test_an_unseeded_request_gets_a_random_63_bit_seed_and_a_seeded_one_keeps_its_own() -> None:
    drawn = {row_seed(SamplingParams()) for _ in range(8)}
    assert len(drawn) == 8 and all(0 <= s < 2**63 for s in drawn)
    assert row_seed(SamplingParams(seed=-5)) == -5


def _mix32_exact(x: int) -> int:
    """mix32 in Python's unbounded ints: what int64 must reproduce if nothing overflows."""
    x ^= x >> 16
    for mult, shift in ((0x7FEB352D, 15), (0x21F0AAAD, 15), (0x31848BAB, 14)):
        x = (x * mult) & MASK32
        x ^= x >> shift
    return x


@pytest.mark.parametrize("device", DEVICES)
def test_the_noise_hash_is_exact_in_int64_and_its_uniforms_stay_inside_0_1(device: str) -> None:
    edge = [0, 1, 2**31 - 1, 2**31, MASK32 - 1, MASK32, 0x9E3779B9]
    assert mix32(torch.tensor(edge, device=device)).tolist() == [_mix32_exact(x) for x in edge]
    seeds = [0, 1, -1, 2**63 - 1, -(2**63), 2**62 + 12345] * 2
    steps = [0] * 6 + [MASK32, 1, 2**20, 7, 9, 3]
    keys = row_keys(seeds, steps, torch.device(device))  # [12, 2]
    assert (keys >= 0).all() and (keys[:, 0] < 2**31).all() and (keys[:, 1] <= MASK32).all()
    assert (keys[:, 0] % 2 == 1).all()
    u = uniforms(keys, 300_000)  # [12, 300000]
    assert 0.0 < float(u.min()) and float(u.max()) < 1.0
    assert torch.isfinite(torch.log(-torch.log(u))).all()
    assert abs(float(u.mean()) - 0.5) < 2e-3 and abs(float(u.var()) - 1 / 12) < 1e-3
    assert len({tuple(k) for k in keys.tolist()}) == 12  # every (seed, index) pair has its own key


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")
def test_the_noise_is_the_same_on_cpu_and_cuda() -> None:
    seeds, steps = [3, 2**63 - 1, -7], [0, 5, 2**31]
    on_cpu = uniforms(row_keys(seeds, steps, torch.device("cpu")), 32000)
    on_gpu = uniforms(row_keys(seeds, steps, torch.device("cuda")), 32000)
    assert torch.equal(on_cpu, on_gpu.cpu())


# penalties and logit_bias


def test_a_large_presence_penalty_never_repeats_a_generated_token() -> None:
    row = torch.tensor([[4.0, 3.9, 3.8, 3.7, 3.6, 0.0, 0.0, 0.0]])  # [1, 8]: token 0 is always preferred

    def run(params: SamplingParams) -> list[int]:
        out: list[int] = []
        for _ in range(5):
            out += sample(row, [params], [0], [out])
        return out

    assert run(SamplingParams(temperature=0.0, presence_penalty=2.0)) == [0, 1, 2, 3, 4]
    assert run(GREEDY) == [0] * 5


def test_the_frequency_penalty_scales_with_the_count_and_presence_does_not() -> None:
    row = torch.tensor([[3.0, 2.0, 0.0]])  # [1, 3]
    freq = SamplingParams(temperature=0.0, frequency_penalty=0.6)
    pres = SamplingParams(temperature=0.0, presence_penalty=0.6)
    assert sample(row, [freq], [0], [[0]]) == [0]  # 3.0 - 0.6 > 2.0
    assert sample(row, [freq], [0], [[0, 0]]) == [1]  # 3.0 - 1.2 < 2.0
    assert sample(row, [pres], [0], [[0, 0, 0]]) == [0]  # once, however often it came
    assert sample(row, [SamplingParams(temperature=0.0, presence_penalty=-2.0)], [0], [[1]]) == [1]


def test_a_penalised_row_does_not_change_the_logits_it_was_given() -> None:
    row = torch.tensor([[3.0, 2.0, 0.0]])  # [1, 3]
    sample(row, [SamplingParams(frequency_penalty=2.0, logit_bias=((2, 50.0),))], [0], [[0, 0]])
    assert row.tolist() == [[3.0, 2.0, 0.0]]


def test_logit_bias_forces_and_bans_tokens() -> None:
    row = torch.randn(50, generator=torch.Generator().manual_seed(3))  # [50]
    top = int(row.argmax())
    assert set(_draws(row, SamplingParams(logit_bias=((17, 100.0),)), 500)) == {17}
    assert set(_draws(row, SamplingParams(temperature=0.0, logit_bias=((17, 100.0),)), 4)) == {17}
    banned = SamplingParams(temperature=0.0, logit_bias=((top, -100.0),))
    assert sample(row[None], [banned], [0], [[]]) == [int(row.topk(2).indices[1])]
    flat = torch.zeros(8)  # [8]: every token equally likely, but for the ban
    assert set(_draws(flat, SamplingParams(logit_bias=((4, -100.0),)), 2000)) == {0, 1, 2, 3, 5, 6, 7}


# validation


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"top_k": -1}, "top_k"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -2.01}, "frequency_penalty"),
        ({"frequency_penalty": math.nan}, "frequency_penalty"),
        ({"logit_bias": ((5, 100.5),)}, "logit_bias"),
        ({"logit_bias": ((-1, 1.0),)}, "logit_bias"),
        ({"logit_bias": ((5, 1.0), (5, -1.0))}, "logit_bias"),
        ({"temperature": -0.1}, "temperature"),
    ],
)
def test_out_of_range_values_are_refused_naming_the_param(kwargs: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams(**kwargs).validate(vocab_size=320)
    assert err.value.param == param


def test_logit_bias_ids_are_checked_against_the_vocab() -> None:
    params = SamplingParams(
        top_k=5, presence_penalty=-2.0, frequency_penalty=2.0, logit_bias=((319, -100.0),)
    )
    params.validate(vocab_size=320)
    with pytest.raises(InvalidRequestError) as err:
        params.validate(vocab_size=319)
    assert err.value.param == "logit_bias"


# the logits stay on their device


def test_sampling_never_copies_the_logits_to_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    logits, params, seeds, outputs = _mixed_batch(40)
    real_to: Callable[..., torch.Tensor] = torch.Tensor.to

    def to_checked(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        target = [a for a in (*args, kwargs.get("device")) if isinstance(a, (str, torch.device))]
        if self.data_ptr() == logits.data_ptr() and any(torch.device(t).type == "cpu" for t in target):
            raise AssertionError("the logits were moved to the host")
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "cpu", _refuse)
    monkeypatch.setattr(torch.Tensor, "numpy", _refuse)
    monkeypatch.setattr(torch.Tensor, "to", to_checked)
    tokens = sample(logits, params, seeds, outputs)
    assert len(tokens) == 6 and all(0 <= t < 40 for t in tokens)


def test_no_per_row_value_is_built_straight_on_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.tensor(list, device=...) syncs the CUDA stream: the sampler, queued behind a decode step, would
    wait out the forward pass. Every per-row value goes through host_values.from_host instead."""
    logits, params, seeds, outputs = _mixed_batch(40)
    real_tensor = torch.tensor

    real_to = torch.Tensor.to

    def tensor_checked(*args: Any, **kwargs: Any) -> torch.Tensor:
        if kwargs.get("device") is not None:
            raise AssertionError("a list was copied to the device with a stream sync")
        return real_tensor(*args, **kwargs)

    def to_checked(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        # a copy from pageable memory may block the host: host_values.to_device pins it first
        if kwargs.get("non_blocking"):
            raise AssertionError("a host tensor was copied past host_values.to_device")
        return real_to(self, *args, **kwargs)

    expected = sample(logits, params, seeds, outputs)
    monkeypatch.setattr(torch, "tensor", tensor_checked)
    monkeypatch.setattr(torch.Tensor, "to", to_checked)
    assert sample(logits, params, seeds, outputs) == expected
    grammar = _AllowOnly(3)
    assert constrain(logits, [None, grammar, None, None, None, None])[1].argmax().item() == 3


class _AllowOnly:
    """A grammar allowing one token id."""

    def __init__(self, token: int) -> None:
        self.token = token

    def allowed_bitmask(self) -> bytes:
        bits = bytearray(8)
        bits[self.token // 8] |= 1 << (self.token % 8)
        return bytes(bits)

    def advance(self, token_id: int) -> bool:
        return False
