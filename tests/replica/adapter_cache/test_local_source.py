"""Configured PEFT folders become file:// records; record sources are asked in order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replica.adapter_cache.errors import AdapterNotRegisteredError
from replica.adapter_cache.local_source import FirstFound, LocalRecords
from replica.adapter_cache.record import AdapterRecord
from tests.replica.adapter_cache.helpers import DictRegistry, digest, write_peft


async def test_a_configured_folder_is_a_file_record_with_its_digest_and_declared_base(tmp_path: Path) -> None:
    folder = tmp_path / "a1"
    write_peft(folder, seed=1, rank=4)
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(
        json.dumps(config | {"base_model_hash": "sha256:" + "c" * 64})
    )
    local = LocalRecords({"a1": folder})
    record = await local.get("a1")
    assert record.weights_uri == f"file://{folder.resolve()}" and record.digest == digest(folder)
    assert record.base_model_hash == "sha256:" + "c" * 64
    assert local.roots == [folder.resolve()]
    with pytest.raises(AdapterNotRegisteredError):
        await local.get("a2")


async def test_the_first_source_that_knows_an_adapter_answers(tmp_path: Path) -> None:
    write_peft(tmp_path / "a1", seed=1)
    remote = DictRegistry()
    remote.records["a2"] = AdapterRecord("a2", "s3://b/a2", "d" * 64, "sha256:" + "e" * 64, 4, ("q_proj",))
    sources = FirstFound([LocalRecords({"a1": tmp_path / "a1"}), remote])
    assert (await sources.get("a1")).weights_uri.startswith("file://") and remote.calls == 0
    assert (await sources.get("a2")).weights_uri == "s3://b/a2"
    with pytest.raises(AdapterNotRegisteredError):
        await sources.get("a3")
