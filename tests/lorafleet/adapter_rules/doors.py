"""The two doors an adapter passes, run as production runs them: the registry validator's fetch (with its
byte caps) and checks, and the replica's three load paths (a download through the object-store tier, a disk
entry found unverified, a local folder)."""

from __future__ import annotations

import asyncio
import hashlib
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gateway.config import GatewaySettings
from gateway.errors import InvalidRegistration
from gateway.registry.registration_rules import RegistryRules, check_fields
from gateway.registry.validator.artifact_checks import verify_artifact
from gateway.registry.validator.artifact_fetch import fetch_artifact
from lorafleet.adapter_rules.errors import AdapterRejected
from lorafleet.client.errors import PeftDirError
from lorafleet.client.peft_dir import describe_peft_dir
from replica.adapter_cache.gpu import GpuTier
from replica.adapter_cache.object_store import ObjectStore
from replica.adapter_cache.promote import read_entry, validate_and_pack
from replica.adapter_cache.record import AdapterRecord
from replica.errors import ReplicaError
from replica.lora.replace import lora_layers
from replica.lora.spec import AdapterSpec
from replica.lora.weights import read_adapter
from schemas.events import AdapterRegistered
from tests.lorafleet.adapter_rules.artifacts import MAX_RANK, SERVED, SPEC, Artifact

ACCEPTED = "accepted"
PREFIX = "s3://lorafleet-adapters/adapters/"
FOLDER = "adapters/acme/acme-prop"  # the registration's weights_uri, as a key under the bucket
RULES = RegistryRules.build(SERVED, MAX_RANK, [PREFIX])
REPLICA_SPEC = AdapterSpec(SPEC.num_layers, dict(SPEC.shapes), MAX_RANK, SERVED)
_BASES = {
    (layer, m): nn.Linear(i, o, bias=False)
    for layer in range(SPEC.num_layers)
    for m, (i, o) in SPEC.shapes.items()
}
GPU = GpuTier(lora_layers(_BASES, {MAX_RANK: 1}), {MAX_RANK: 1})  # rank buckets up to the cap


class _Body:
    def __init__(self, data: bytes) -> None:
        self.data = data

    async def iter_chunks(self, size: int) -> AsyncIterator[bytes]:
        for i in range(0, len(self.data), size):
            yield self.data[i : i + size]

    def close(self) -> None:
        pass


class FolderS3:
    """The object-store calls fetch_artifact makes, answered from a local folder (a key is a path in it)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def get_paginator(self, _operation: str) -> FolderS3:
        return self

    async def paginate(self, Bucket: str, Prefix: str) -> AsyncIterator[dict[str, Any]]:  # noqa: N803
        files = [p for p in sorted((self.root / Prefix).rglob("*")) if p.is_file()]
        yield {"Contents": [{"Key": str(p.relative_to(self.root)), "Size": p.stat().st_size} for p in files]}

    async def get_object(self, Bucket: str, Key: str) -> dict[str, Any]:  # noqa: N803
        return {"Body": _Body((self.root / Key).read_bytes())}


def write_folder(art: Artifact, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_bytes(art.config)
    (folder / "adapter_model.safetensors").write_bytes(art.weights)
    return folder


def registration(art: Artifact, folder: Path) -> AdapterRegistered:
    """What `lorafleet adapters register` sends for the folder; a pipeline's own facts when the CLI refuses."""
    rank, alpha, modules = art.rank, art.alpha, art.modules
    try:
        facts = describe_peft_dir(folder)
        rank, alpha, modules = facts.rank, facts.alpha, facts.target_modules
    except PeftDirError:
        pass
    return AdapterRegistered(
        adapter_id="acme-prop",
        tenant_id="acme",
        version=1,
        base_model_hash=SERVED,
        rank=rank,
        alpha=alpha,
        target_modules=modules,
        weights_uri=PREFIX + FOLDER.removeprefix("adapters/"),
        checksum=art.checksum,
    )


def registry_verdict(root: Path, event: AdapterRegistered) -> str:
    """The validator's verify() on the folder under root: the field checks, the capped fetch, verify_artifact."""
    settings = GatewaySettings()
    try:
        location = check_fields(
            RULES,
            base_model_hash=event.base_model_hash,
            rank=event.rank,
            target_modules=event.target_modules,
            weights_uri=event.weights_uri,
            checksum=event.checksum,
        )
        fetched = asyncio.run(
            fetch_artifact(FolderS3(root), location, settings.config_cap(), settings.weights_cap())  # type: ignore[arg-type]
        )
        verify_artifact(fetched, event, SPEC, RULES.max_rank, RULES.served_base_hash)
    except InvalidRegistration as exc:
        return exc.code
    except AdapterRejected as exc:
        return exc.code.value
    return ACCEPTED


def replica_verdicts(art: Artifact, folder: Path) -> dict[str, str]:
    """path -> the replica's verdict: the load error's code, or accepted."""
    digest = hashlib.sha256(art.weights).hexdigest()
    config_digest = hashlib.sha256(art.config).hexdigest()
    record = AdapterRecord("a", f"file://{folder}", digest, SERVED, tuple(art.modules))

    def download() -> object:
        fetched = asyncio.run(ObjectStore(None, [folder]).fetch(record))
        return validate_and_pack(
            fetched.weights,
            fetched.config,
            adapter_id="a",
            base_model_hash=SERVED,
            digest=digest,
            spec=REPLICA_SPEC,
            dtype=torch.float32,
            pin=False,
            row_for=GPU.row_layout,
        )

    runs = {
        "download": download,
        "disk": lambda: read_entry(
            folder,
            None,
            weights_digest=digest,
            config_digest=config_digest,
            adapter_id="a",
            base_model_hash=SERVED,
            spec=REPLICA_SPEC,
            dtype=torch.float32,
            pin=False,
            row_for=GPU.row_layout,
        ),
        "local_folder": lambda: read_adapter(folder, "a", REPLICA_SPEC, SERVED),
    }
    verdicts = {}
    for path, run in runs.items():
        try:
            run()
            verdicts[path] = ACCEPTED
        except ReplicaError as exc:
            verdicts[path] = exc.code
    return verdicts


def both_doors(art: Artifact) -> tuple[str, dict[str, str]]:
    """(the registry's verdict, the replica's verdict per load path) for one artifact."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_folder(art, Path(tmp) / FOLDER)
        return registry_verdict(Path(tmp), registration(art, folder)), replica_verdicts(art, folder)
