"""`lorafleet loadtest --setup`'s adapters: every adaptable projection at the asked rank, adapter i the same
bytes whatever N is, and accepted by the registry's checks."""

from __future__ import annotations

from pathlib import Path

from loadtest.setup import TARGETS, make_adapters
from lorafleet.adapter_rules.peft_config import parse_adapter_config
from schemas.api import ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME
from tests.gateway.adapter_files import TINY_BASE_HASH, verify_on_tiny_base, write_base_config


def _weights(adapter_dir: Path) -> bytes:
    return (adapter_dir / ADAPTER_WEIGHTS_NAME).read_bytes()


def test_adapter_i_has_the_same_bytes_whatever_n_is(tmp_path: Path) -> None:
    base = write_base_config(tmp_path / "base")
    three = make_adapters(base, tmp_path / "three", ["a0", "a1", "a2"], TINY_BASE_HASH, rank=4)
    two = make_adapters(base, tmp_path / "two", ["a0", "a1"], TINY_BASE_HASH, rank=4)
    assert [_weights(two[a]) for a in two] == [_weights(three[a]) for a in two]
    assert len({_weights(d) for d in three.values()}) == 3


def test_every_projection_at_the_rank_passes_the_registry(tmp_path: Path) -> None:
    base = write_base_config(tmp_path / "base")
    (path,) = make_adapters(base, tmp_path / "one", ["a0"], TINY_BASE_HASH, rank=4).values()
    cfg = parse_adapter_config((path / ADAPTER_CONFIG_NAME).read_bytes())
    assert set(cfg.target_modules) == set(TARGETS) and cfg.base_model_hash == TINY_BASE_HASH
    verify_on_tiny_base(path, rank=4, alpha=8.0, targets=list(TARGETS))
