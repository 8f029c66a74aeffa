"""A tiny engine for tests: random Llama, LoRA slots, and a one-character-per-token detokenizer."""

from __future__ import annotations

from pathlib import Path

from replica.engine.engine import LLMEngine, StepOutput
from replica.engine.model_runner import ModelRunner
from replica.engine.sampler import SamplingParams
from replica.lora.manager import LoraManager
from replica.lora.weights import read_adapter
from tests.replica.peft_util import build_lora_model

EOS = 0


class CharDetokenizer:
    """Token t is the letter chr(97 + t % 26): a real, simple detokenizer for a tiny vocabulary."""

    def push(self, token_id: int) -> str:
        return chr(97 + token_id % 26)

    def flush(self) -> str:
        return ""


def make_engine(
    base_dir: Path, adapters: dict[str, Path], capacities: dict[int, int], max_num_seqs: int = 8
) -> tuple[LLMEngine, LoraManager]:
    model, manager, spec = build_lora_model(base_dir, capacities)
    for name, path in adapters.items():
        manager.add_to_host(read_adapter(path, name, spec))
    runner = ModelRunner(model, max_num_seqs=max_num_seqs, max_model_len=128)
    return LLMEngine(runner, manager, {EOS}, detokenizer_factory=CharDetokenizer), manager


def run_all(engine: LLMEngine) -> dict[str, list[StepOutput]]:
    """Step until every request finished; return each request's outputs."""
    out: dict[str, list[StepOutput]] = {}
    while engine.has_work():
        for o in engine.step():
            out.setdefault(o.request_id, []).append(o)
    return out


def tokens(outs: list[StepOutput]) -> list[int]:
    return [o.token_id for o in outs if o.token_id is not None]


def greedy(max_tokens: int = 10, **kw: object) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)
