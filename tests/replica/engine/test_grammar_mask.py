"""The mask step: a constrained row samples only what its grammar allows; the other rows are untouched."""

from __future__ import annotations

import asyncio
from pathlib import Path

import torch

from replica.engine.grammar_mask import constrain, unpack_bits
from replica.engine.sampler import SamplingParams
from tests.replica.engine.engine_util import greedy, make_engine, tokens

PROMPT = [5, 17, 42, 99, 7, 3]


class FixedGrammar:
    """A grammar over explicit token sets: step i allows allowed[i]; done after the last step."""

    def __init__(self, allowed: list[set[int]], vocab: int) -> None:
        self.allowed = allowed
        self.vocab = vocab
        self.taken: list[int] = []

    def allowed_bitmask(self) -> bytes:
        words = [0] * ((self.vocab + 31) // 32)
        for t in self.allowed[len(self.taken)]:
            words[t // 32] |= 1 << (t % 32)
        return torch.tensor(words, dtype=torch.int64).to(torch.int32).numpy().tobytes()

    def advance(self, token_id: int) -> bool:
        assert token_id in self.allowed[len(self.taken)]
        self.taken.append(token_id)
        return len(self.taken) == len(self.allowed)


def test_unpacked_bits_are_each_byte_lowest_bit_first() -> None:
    packed = torch.tensor([[0b101, 0, 0, 0, 0, 0, 0, 0b10000000]], dtype=torch.uint8)  # bits 0, 2 and 63
    bits = unpack_bits(packed, 70)
    assert bits.shape == (1, 70)
    assert bits[0].nonzero().flatten().tolist() == [0, 2, 63]


def test_a_batch_without_grammars_is_returned_as_it_is() -> None:
    logits = torch.randn(3, 50)
    assert constrain(logits, [None, None, None]) is logits


def test_only_the_constrained_row_is_masked() -> None:
    logits = torch.randn(3, 50)
    masked = constrain(logits, [None, FixedGrammar([{3, 40}], 50), None])
    assert torch.equal(masked[0], logits[0]) and torch.equal(masked[2], logits[2])
    assert torch.isfinite(masked[1]).nonzero().flatten().tolist() == [3, 40]
    assert torch.equal(masked[1, [3, 40]], logits[1, [3, 40]])


def test_tokens_past_the_grammars_vocabulary_are_masked() -> None:
    logits = torch.zeros(1, 70)
    masked = constrain(logits, [FixedGrammar([{1}], 32)])
    assert torch.isfinite(masked[0]).nonzero().flatten().tolist() == [1]


def test_a_constrained_row_takes_allowed_tokens_and_ends_with_its_grammar(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    served = make_engine(tiny_model_dir, {}, {8: 1}, tmp_path / "c")
    steps = [{11, 12}, {200}, {7, 9, 301}]
    grammar = FixedGrammar(steps, 320)
    served.engine.add_request("json", PROMPT, greedy(max_tokens=20), grammar=grammar)
    out = served.run_all()["json"]
    assert [t in s for t, s in zip(tokens(out), steps, strict=True)] == [True] * 3
    assert out[-1].finish_reason == "stop" and out[-1].completion_tokens == 3


def test_an_unconstrained_row_samples_as_it_does_alone(tiny_model_dir: Path, tmp_path: Path) -> None:
    served = make_engine(tiny_model_dir, {}, {8: 1}, tmp_path / "c")
    asyncio.run(served.add("alone", PROMPT, greedy(max_tokens=8)))
    alone = tokens(served.run_all()["alone"])
    served.engine.add_request("plain", PROMPT, greedy(max_tokens=8))
    served.engine.add_request("json", PROMPT[:3], greedy(max_tokens=8), grammar=FixedGrammar([{4}] * 8, 320))
    together = served.run_all()
    assert tokens(together["plain"]) == alone
    assert tokens(together["json"]) == [4] * 8


def test_a_sampled_constrained_row_stays_in_its_grammar(tiny_model_dir: Path, tmp_path: Path) -> None:
    served = make_engine(tiny_model_dir, {}, {8: 1}, tmp_path / "c")
    params = SamplingParams(temperature=0.7, top_p=0.9, max_tokens=6, seed=3, ignore_eos=True)
    served.engine.add_request("json", PROMPT, params, grammar=FixedGrammar([{1, 2, 3}] * 6, 320))
    assert set(tokens(served.run_all()["json"])) <= {1, 2, 3}
