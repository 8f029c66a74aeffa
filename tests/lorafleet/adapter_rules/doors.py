"""The two doors an adapter passes, run as production runs them: the registry validator's checks and the
replica's three load paths (a download, a disk entry found unverified, a local folder)."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

import torch
from torch import nn

from gateway.artifact_checks import verify_artifact
from gateway.artifact_fetch import Artifact as Fetched
from gateway.errors import InvalidRegistration
from gateway.registration_rules import RegistryRules, check_fields
from lorafleet.adapter_rules.errors import AdapterRejected
from lorafleet.client.errors import PeftDirError
from lorafleet.client.peft_dir import describe_peft_dir
from replica.adapter_cache.gpu import GpuTier
from replica.adapter_cache.promote import read_entry, validate_and_pack
from replica.errors import AdapterError
from replica.lora.replace import lora_layers
from replica.lora.spec import AdapterSpec
from replica.lora.weights import read_adapter
from schemas.events import AdapterRegistered
from tests.lorafleet.adapter_rules.artifacts import MAX_RANK, SERVED, SPEC, Artifact

ACCEPTED = "accepted"
PREFIX = "s3://lorafleet-adapters/adapters/"
RULES = RegistryRules.build(SERVED, MAX_RANK, [PREFIX])
REPLICA_SPEC = AdapterSpec(SPEC.num_layers, dict(SPEC.shapes), MAX_RANK, SERVED)
_BASES = {
    (layer, m): nn.Linear(i, o, bias=False)
    for layer in range(SPEC.num_layers)
    for m, (i, o) in SPEC.shapes.items()
}
GPU = GpuTier(lora_layers(_BASES, {MAX_RANK: 1}), {MAX_RANK: 1})  # rank buckets up to the cap


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
        weights_uri=PREFIX + "acme/acme-prop",
        checksum=art.checksum,
    )


def registry_verdict(art: Artifact, event: AdapterRegistered) -> str:
    """The validator's verify() after its fetch: the field checks, then verify_artifact."""
    try:
        check_fields(
            RULES,
            base_model_hash=event.base_model_hash,
            rank=event.rank,
            target_modules=event.target_modules,
            weights_uri=event.weights_uri,
            checksum=event.checksum,
        )
        verify_artifact(Fetched(art.config, art.weights), event, SPEC, RULES.max_rank, RULES.served_base_hash)
    except InvalidRegistration as exc:
        return exc.code
    except AdapterRejected as exc:
        return exc.code.value
    return ACCEPTED


def replica_verdicts(art: Artifact, folder: Path) -> dict[str, str]:
    """path -> the replica's verdict: the load error's code, or accepted."""
    digest = hashlib.sha256(art.weights).hexdigest()
    config_digest = hashlib.sha256(art.config).hexdigest()
    runs = {
        "download": lambda: validate_and_pack(
            torch.frombuffer(bytearray(art.weights), dtype=torch.uint8)
            if art.weights
            else torch.empty(0, dtype=torch.uint8),
            art.config,
            "a",
            SERVED,
            REPLICA_SPEC,
            torch.float32,
            False,
            digest,
            GPU.row_layout,
        ),
        "disk": lambda: read_entry(
            folder,
            None,
            digest,
            config_digest,
            "a",
            SERVED,
            REPLICA_SPEC,
            torch.float32,
            False,
            GPU.row_layout,
        ),
        "local_folder": lambda: read_adapter(folder, "a", REPLICA_SPEC, SERVED),
    }
    verdicts = {}
    for path, run in runs.items():
        try:
            run()
            verdicts[path] = ACCEPTED
        except AdapterError as exc:
            verdicts[path] = exc.code
    return verdicts


def both_doors(art: Artifact) -> tuple[str, dict[str, str]]:
    """(the registry's verdict, the replica's verdict per load path) for one artifact."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_folder(art, Path(tmp) / "adapter")
        return registry_verdict(art, registration(art, folder)), replica_verdicts(art, folder)
