"""A merged replica's adapter: fetched through the cache's record sources and object store, verified."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from replica.adapter_cache.errors import AdapterNotRegisteredError, ChecksumMismatchError
from replica.adapter_cache.local_source import LocalRecords
from replica.adapter_cache.merged_fetch import fetch_adapter
from replica.adapter_cache.object_store import ObjectStore
from replica.adapter_cache.record import AdapterRecord
from replica.errors import AdapterBaseMismatchError
from replica.lora.spec import AdapterSpec
from replica.lora.weights import read_adapter
from replica.model.loader import load_model
from tests.replica.peft_util import TEST_BASE_HASH, AdapterRecipe, make_peft_adapters


class Tampered:
    """A record source that answers with a changed record (the registry lying, or bytes swapped)."""

    def __init__(self, inner: LocalRecords, **change: str) -> None:
        self.inner, self.change = inner, change

    async def get(self, adapter_id: str) -> AdapterRecord:
        return dataclasses.replace(await self.inner.get(adapter_id), **self.change)


def _spec(model_dir: Path) -> AdapterSpec:
    model = load_model(model_dir, "float32", "cpu")
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    return AdapterSpec.for_model(model.config, targets, 64, TEST_BASE_HASH)


async def test_the_fetched_adapter_equals_the_folder_read_and_a_bad_checksum_is_refused(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    _, dirs = make_peft_adapters(tiny_model_dir, tmp_path, [AdapterRecipe("heavy", 8, 16, seed=3)])
    spec, local = _spec(tiny_model_dir), LocalRecords(dirs)
    store = ObjectStore(None, local.roots)
    got = await fetch_adapter("heavy", local, store, spec)
    want = read_adapter(dirs["heavy"], "heavy", spec)
    assert got.modules.keys() == want.modules.keys()
    for key, m in want.modules.items():
        assert torch.equal(got.modules[key].a, m.a) and torch.equal(got.modules[key].b, m.b)
        assert got.modules[key].scale == m.scale
    with pytest.raises(ChecksumMismatchError):
        await fetch_adapter("heavy", Tampered(local, digest="0" * 64), store, spec)
    with pytest.raises(AdapterBaseMismatchError):
        await fetch_adapter("heavy", Tampered(local, base_model_hash="sha256:" + "b" * 64), store, spec)
    with pytest.raises(AdapterNotRegisteredError):
        await fetch_adapter("light", local, store, spec)
