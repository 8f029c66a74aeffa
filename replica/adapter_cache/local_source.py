"""Records for the PEFT folders configured on this replica, and the record source that asks several in turn.

The configured folders are the single-machine default: each becomes a file:// record whose digest is the
weights file's sha256 taken now, so the folder's bytes go through the same tiers and checks as a download
from the object store (ObjectStore reads file:// only under the configured folders). A folder is refused
as read_adapter refuses it before any byte is fetched: pickle files beside the weights, no safetensors
file, or a config we cannot serve.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Protocol

from lorafleet.adapter_rules.errors import AdapterRejected
from lorafleet.adapter_rules.peft_config import parse_adapter_config
from replica.adapter_cache.disk import sha256_file
from replica.adapter_cache.errors import AdapterCacheError, AdapterNotRegisteredError
from replica.adapter_cache.record import AdapterRecord
from replica.errors import adapter_error
from replica.lora.weights import read_config, weights_path


class RecordSource(Protocol):
    async def get(self, adapter_id: str) -> AdapterRecord: ...


class LocalRecords:
    """adapter_id -> a file:// record for a PEFT folder named by configuration (never by a request)."""

    def __init__(self, dirs: dict[str, Path]) -> None:
        self.dirs = {k: Path(v).resolve() for k, v in dirs.items()}

    @property
    def roots(self) -> list[Path]:
        """The folders ObjectStore may read file:// weights from."""
        return sorted(set(self.dirs.values()))

    async def get(self, adapter_id: str) -> AdapterRecord:
        path = self.dirs.get(adapter_id)
        if path is None:
            raise AdapterNotRegisteredError(f"adapter {adapter_id!r} is not registered", "adapter_id")
        return await asyncio.to_thread(_record, adapter_id, path)


def _record(adapter_id: str, path: Path) -> AdapterRecord:
    try:
        weights = weights_path(path)  # AdapterNotSafetensorsError for pickles beside it, or none at all
        cfg = parse_adapter_config(read_config(path))
        digest = sha256_file(weights)
    except AdapterRejected as exc:  # a config the adapter rules refuse
        raise adapter_error(exc) from exc
    except OSError as exc:
        raise AdapterCacheError(f"local adapter {adapter_id!r} is unreadable: {type(exc).__name__}") from exc
    targets = cfg.target_modules
    return AdapterRecord(
        adapter_id=adapter_id,
        weights_uri=f"file://{path}",  # not as_uri(): ObjectStore reads the path unquoted
        digest=digest,
        # an empty hash makes the checks fall back to adapter_config.json's base_model_hash
        base_model_hash=cfg.base_model_hash or "",
        target_modules=(targets,) if isinstance(targets, str) else targets,
        size_bytes=weights.stat().st_size,
    )


class FirstFound:
    """Ask each source in order; the first that knows the adapter answers."""

    def __init__(self, sources: list[RecordSource]) -> None:
        self.sources = sources

    async def get(self, adapter_id: str) -> AdapterRecord:
        for source in self.sources[:-1]:
            try:
                return await source.get(adapter_id)
            except AdapterNotRegisteredError:
                continue
        if not self.sources:
            raise AdapterNotRegisteredError(f"adapter {adapter_id!r} is not registered", "adapter_id")
        return await self.sources[-1].get(adapter_id)
