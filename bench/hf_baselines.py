"""Reference generators for `bench engine`: transformers generate and PEFT mixed-adapter generate.

Both time decode the same way as our engine: from the moment every row has its first token (prefill done)
to the last token, counting rows x (tokens - 1). A StoppingCriteria is called once per generated token,
which gives the timestamps without touching transformers' loop.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench._util import DTYPES, sync

ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass
class GenerateTiming:
    """Decode throughput of one batched generate call, plus the tokens it produced."""

    decode_tokens: int
    decode_s: float
    prefill_s: float
    tokens: list[list[int]]

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else float("nan")


class _StepClock:
    """A StoppingCriteria that never stops and records when each token was produced."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.times: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        sync(self.device)
        self.times.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def load_hf_model(model_dir: Path, dtype: str, device: torch.device) -> Any:
    """transformers' LlamaForCausalLM for the same checkpoint our engine serves."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(str(model_dir), dtype=DTYPES[dtype])
    # transformers wraps to() with functools.wraps(nn.Module.to), which types it as the unbound function
    model = model.to(device)  # type: ignore[arg-type]
    return model.eval()


def make_peft_adapters(
    model: Any, out_dir: Path, count: int, rank: int, base_hash: str, seed: int = 0
) -> Any:
    """Add `count` rank-r LoRA adapters (random, non-zero B) with peft; save each as a PEFT directory.

    Returns the PeftModel; adapter i is named f"a{i}" and saved to out_dir / f"a{i}".
    """
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=ALL_TARGETS, lora_dropout=0.0)
    peft_model = None
    for i in range(count):
        if peft_model is None:
            peft_model = get_peft_model(model, config, adapter_name=f"a{i}")
        else:
            peft_model.add_adapter(f"a{i}", config)
    assert peft_model is not None
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # one pass over the parameters; B non-zero so every adapter changes the output
        for pname, p in peft_model.named_parameters():
            if ".lora_A." in pname:
                p.copy_(torch.randn(p.shape, generator=gen) * p.shape[1] ** -0.5)
            elif ".lora_B." in pname:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.01)
    for i in range(count):
        name = f"a{i}"
        peft_model.save_pretrained(str(out_dir), selected_adapters=[name])
        cfg_path = next(p for p in out_dir.rglob("adapter_config.json") if p.parent.name == name)
        raw = json.loads(cfg_path.read_text())
        raw["base_model_hash"] = base_hash
        cfg_path.write_text(json.dumps(raw))
    return peft_model.eval()


def adapter_dir(out_dir: Path, name: str) -> Path:
    """Where make_peft_adapters saved adapter `name` (peft nests non-default adapters by name)."""
    return next(p.parent for p in out_dir.rglob("adapter_config.json") if p.parent.name == name)


def timed_generate(
    model: Any,
    prompts: list[list[int]],
    new_tokens: int,
    pad_id: int,
    device: torch.device,
    adapter_names: list[str] | None = None,
) -> GenerateTiming:
    """Greedy batched generate of exactly new_tokens per row (left padding, EOS ignored)."""
    from transformers import GenerationConfig, StoppingCriteriaList

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)  # [batch, width], left padded
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    config = GenerationConfig(
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=pad_id,
        eos_token_id=None,
    )
    clock = _StepClock(device)
    extra: dict[str, Any] = {} if adapter_names is None else {"adapter_names": adapter_names}
    sync(device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            generation_config=config,
            stopping_criteria=StoppingCriteriaList([clock]),
            **extra,
        )
    tokens = out[:, width:].tolist()  # [batch, new_tokens]
    first, last = clock.times[0], clock.times[-1]
    return GenerateTiming(len(prompts) * (len(clock.times) - 1), last - first, first - start, tokens)
