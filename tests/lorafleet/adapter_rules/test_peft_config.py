"""adapter_config.json means what it means to PEFT: targets, per-module ranks and alphas match peft's own
matching on every module; features the fleet does not serve are refused, and so are patterns outside the
bounded regex subset."""

from __future__ import annotations

import json
import time
import warnings
from typing import Any

import pytest
from hypothesis import given, settings

from lorafleet.adapter_rules.errors import AdapterRejected
from lorafleet.adapter_rules.lora_tensors import module_path
from lorafleet.adapter_rules.patterns import check_pattern
from lorafleet.adapter_rules.peft_config import parse_adapter_config
from tests.lorafleet.adapter_rules.artifacts import BOILERPLATE, KEYS, configs


def _parse(config: dict[str, Any]) -> Any:
    return parse_adapter_config(json.dumps(config).encode())


def _code(config: dict[str, Any] | bytes) -> str:
    with pytest.raises(AdapterRejected) as info:
        parse_adapter_config(config if isinstance(config, bytes) else json.dumps(config).encode())
    return info.value.code.value


@settings(max_examples=200, deadline=None)
@given(configs())
def test_targets_ranks_and_alphas_are_peft_s_on_every_module(config: dict[str, Any]) -> None:
    from peft import LoraConfig
    from peft.tuners.tuners_utils import check_target_module_exists
    from peft.utils.other import get_pattern_key

    ours = _parse(config)
    fields = ("r", "lora_alpha", "use_rslora", "target_modules", "exclude_modules", "layers_to_transform")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = LoraConfig(
            **{k: config[k] for k in fields if k in config},
            rank_pattern=config["rank_pattern"],
            alpha_pattern=config["alpha_pattern"],
        )
    if theirs.target_modules == "all-linear":  # peft expands it against the model's linears
        theirs.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    for layer, module in KEYS:
        path = module_path(layer, module)
        assert ours.targets(path) == bool(check_target_module_exists(theirs, path)), path
        rank = theirs.rank_pattern.get(get_pattern_key(theirs.rank_pattern.keys(), path), theirs.r)
        alpha = theirs.alpha_pattern.get(
            get_pattern_key(theirs.alpha_pattern.keys(), path), theirs.lora_alpha
        )
        assert (ours.rank_for(path), ours.alpha_for(path)) == (rank, alpha), path


def test_the_scale_is_alpha_over_rank_or_over_its_root_under_rslora() -> None:
    base = {**BOILERPLATE, "r": 16, "lora_alpha": 8, "target_modules": ["q_proj"]}
    assert _parse(base).scale(8.0, 16) == 0.5
    assert _parse({**base, "use_rslora": True}).scale(8.0, 16) == 2.0


def test_defaults_and_ignored_fields_follow_peft() -> None:
    cfg = _parse(
        {"target_modules": ["q_proj"], "lora_dropout": 0.3, "task_type": "SEQ_CLS", "new_flag": False}
    )
    assert (cfg.r, cfg.lora_alpha, cfg.use_rslora) == (8, 8.0, False)


@pytest.mark.parametrize(
    "change, code",
    [
        ({"use_dora": True}, "unsupported_adapter_feature"),
        ({"bias": "all"}, "unsupported_adapter_feature"),
        ({"lora_bias": True}, "unsupported_adapter_feature"),
        ({"modules_to_save": ["lm_head"]}, "unsupported_adapter_feature"),
        ({"fan_in_fan_out": True}, "unsupported_adapter_feature"),
        ({"init_lora_weights": "pissa_niter_4"}, "unsupported_adapter_feature"),
        ({"init_lora_weights": "loftq"}, "unsupported_adapter_feature"),
        ({"trainable_token_indices": [1, 2]}, "unsupported_adapter_feature"),
        ({"target_parameters": ["mlp.experts.down_proj"]}, "unsupported_adapter_feature"),
        ({"layer_replication": [[0, 2]]}, "unsupported_adapter_feature"),
        ({"peft_type": "LOHA"}, "unsupported_adapter_feature"),
        ({"a_future_feature": {"on": True}}, "unsupported_adapter_feature"),
        ({"r": 0}, "invalid_adapter_config"),
        ({"r": True}, "invalid_adapter_config"),
        ({"lora_alpha": "16"}, "invalid_adapter_config"),
        ({"use_rslora": "yes"}, "invalid_adapter_config"),
        ({"rank_pattern": {"q_proj": 0}}, "invalid_adapter_config"),
        ({"alpha_pattern": ["q_proj", 2]}, "invalid_adapter_config"),
        ({"target_modules": []}, "invalid_adapter_config"),
        ({"target_modules": "q_proj", "layers_to_transform": [0]}, "invalid_adapter_config"),
        ({"layers_pattern": "layers"}, "invalid_adapter_config"),
        ({"layers_to_transform": [0], "layers_pattern": "lay(ers)+"}, "invalid_adapter_config"),
        ({"base_model_hash": 7}, "invalid_adapter_config"),
    ],
)
def test_what_the_fleet_does_not_serve_is_refused(change: dict[str, Any], code: str) -> None:
    assert _code({**BOILERPLATE, "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"], **change}) == code


@pytest.mark.parametrize(
    "raw",
    [
        b"{not json",
        b"[]",
        b'{"r": 4, "r": 8}',
        b'{"lora_alpha": NaN}',
        b'{"r": 1' + b"0" * 30 + b"}",
        b"\xff",
    ],
)
def test_the_config_must_be_a_strict_json_object(raw: bytes) -> None:
    assert _code(raw) == "invalid_adapter_config"


@pytest.mark.parametrize(
    "pattern",
    [
        "q_proj",
        r"layers\.[0-3]\.self_attn\.(q|v)_proj",
        "^model.layers.0.mlp.up_proj",
        r".*\.mlp\.down_proj",
        "o_proj|k_proj",
    ],
)
def test_patterns_people_write_are_served(pattern: str) -> None:
    assert check_pattern(pattern, "rank_pattern") == pattern


@pytest.mark.parametrize(
    "pattern",
    [
        "(a+)+$",
        "(q|q)*",
        r"(x+x+)+y",
        r".*.*.*q",
        "a{2,}",
        r"(?=q)q",
        r"(q)\1",
        "((q))",
        "q_proj" * 30,
        r"\s",
        "é",
    ],
)
def test_patterns_outside_the_bounded_subset_are_refused_without_running(pattern: str) -> None:
    start = time.perf_counter()
    config = {**BOILERPLATE, "target_modules": ["q_proj"], "rank_pattern": {pattern: 2}}
    assert _code(config) == "unsupported_adapter_feature"
    assert time.perf_counter() - start < 0.05


def test_at_most_a_few_patterns_may_use_groups_or_repetition() -> None:
    many = {f"layers.{i}.(q|v)_proj": 2 for i in range(9)}
    assert (
        _code({**BOILERPLATE, "target_modules": ["q_proj"], "rank_pattern": many})
        == "unsupported_adapter_feature"
    )
    literal = {f"layers.{i}.self_attn.q_proj": 2 for i in range(500)}
    assert (
        _parse({**BOILERPLATE, "target_modules": ["q_proj"], "rank_pattern": literal}).rank_for(
            module_path(7, "q_proj")
        )
        == 2
    )
