"""The replica's cache: configured folders are served from file:// records before the registry is asked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replica.adapter_cache.assemble import adapter_cache
from replica.adapter_cache.errors import AdapterNotRegisteredError
from replica.adapter_cache.gpu import GpuTier
from replica.adapter_cache.tier import CacheEvent
from tests.replica.adapter_cache.helpers import (
    BASE_HASH,
    SPEC,
    DictRegistry,
    make_layers,
    slot_holds,
    write_peft,
)


async def test_a_configured_folder_reaches_a_slot_without_the_registry(tmp_path: Path) -> None:
    folder = tmp_path / "store" / "a1"
    tensors = write_peft(folder, seed=1)
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps(config | {"base_model_hash": BASE_HASH}))
    layers = make_layers({8: 2})
    registry, events = DictRegistry(), list[CacheEvent]()
    cache = adapter_cache(
        SPEC,
        GpuTier(layers, {8: 2}),
        {"a1": folder},
        tmp_path / "disk",
        1 << 30,
        1 << 30,
        registry=registry,
        on_event=events.append,
    )
    lease = await cache.acquire("a1")
    assert lease.found_in == "remote" and slot_holds(layers, lease.ref, tensors)
    assert registry.calls == 0 and [e.adapter_id for e in events if e.kind == "load"]
    cache.release(lease)
    with pytest.raises(AdapterNotRegisteredError):
        await cache.acquire("a2")  # not configured here: asked of the registry, which does not know it
    assert registry.calls == 1
