"""Demo and load-test adapters, written without peft: peft loads them with the very tensors written, and
the registry's checks and the replica's reader both accept them."""

from __future__ import annotations

from pathlib import Path

import torch

from harness.adapters import RandomLora, make_peft_adapters, random_tensors, write_random_adapter
from lorafleet.adapter_rules.base_spec import BaseSpec
from replica.lora.spec import AdapterSpec
from replica.lora.weights import read_adapter
from replica.model.llama import LlamaConfig
from schemas.api import ADAPTER_WEIGHTS_NAME
from schemas.llama import LLAMA_MODULES
from tests.gateway.adapter_files import (
    TARGETS,
    TINY_BASE_HASH,
    TINY_CONFIG,
    verify_on_tiny_base,
    write_base_config,
)

LORA = RandomLora(rank=4, alpha=8.0, target_modules=tuple(TARGETS), b_std=0.05)


def test_peft_loads_the_tensors_that_were_written(tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import LlamaConfig as HFConfig
    from transformers import LlamaForCausalLM

    base = write_base_config(tmp_path / "base")
    out = write_random_adapter(base, tmp_path / "a", LORA, seed=3, base_hash=TINY_BASE_HASH)
    model = PeftModel.from_pretrained(LlamaForCausalLM(HFConfig(**TINY_CONFIG)), out)
    cfg = model.peft_config["default"]
    assert (cfg.r, cfg.lora_alpha, set(cfg.target_modules)) == (4, 8.0, set(TARGETS))
    loaded = dict(model.named_parameters())
    expected = random_tensors(BaseSpec.from_config(TINY_CONFIG), LORA, seed=3)
    assert len(expected) == TINY_CONFIG["num_hidden_layers"] * len(TARGETS)
    for (layer, module), (a, b) in expected.items():
        prefix = f"base_model.model.model.layers.{layer}.{LLAMA_MODULES[module]}.{module}"
        torch.testing.assert_close(loaded[f"{prefix}.lora_A.default.weight"], a, rtol=0, atol=0)
        torch.testing.assert_close(loaded[f"{prefix}.lora_B.default.weight"], b, rtol=0, atol=0)


def test_the_registry_and_the_replica_accept_it(tmp_path: Path) -> None:
    base = write_base_config(tmp_path / "base")
    out = write_random_adapter(base, tmp_path / "a", LORA, seed=1, base_hash=TINY_BASE_HASH)
    verify_on_tiny_base(out, rank=4, alpha=8.0, targets=TARGETS)
    spec = BaseSpec.from_model_dir(base)
    replica_spec = AdapterSpec.for_model(LlamaConfig.from_dict(TINY_CONFIG), TARGETS, 16, TINY_BASE_HASH)
    weights = read_adapter(out, "a", replica_spec)
    written = random_tensors(spec, LORA, seed=1)
    assert weights.rank == 4 and set(weights.modules) == set(written)
    for key, (a, b) in written.items():
        torch.testing.assert_close(weights.modules[key].a.float(), a, rtol=0, atol=0)
        torch.testing.assert_close(weights.modules[key].b.float(), b, rtol=0, atol=0)


def test_demo_adapters_are_seeded_by_name_and_kept_once_made(tmp_path: Path) -> None:
    base = write_base_config(tmp_path / "base")
    first = make_peft_adapters(base, tmp_path / "one", ["x", "y"], TINY_BASE_HASH, rank=2)
    again = make_peft_adapters(base, tmp_path / "two", ["y"], TINY_BASE_HASH, rank=2)
    weights = {k: (d / ADAPTER_WEIGHTS_NAME).read_bytes() for k, d in first.items()}
    assert weights["y"] == (again["y"] / ADAPTER_WEIGHTS_NAME).read_bytes()
    assert weights["x"] != weights["y"]
    (first["x"] / ADAPTER_WEIGHTS_NAME).write_bytes(b"kept")
    make_peft_adapters(base, tmp_path / "one", ["x", "y"], TINY_BASE_HASH, rank=2)
    assert (first["x"] / ADAPTER_WEIGHTS_NAME).read_bytes() == b"kept"
