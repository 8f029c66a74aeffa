"""Adapter directories this replica may read, by adapter_id; a request never supplies a path."""

from __future__ import annotations

import logging
from pathlib import Path

from replica.errors import AdapterNotFoundError
from replica.lora.spec import AdapterSpec
from replica.lora.weights import CONFIG_NAME, AdapterWeights, read_adapter

log = logging.getLogger(__name__)


class AdapterRegistry:
    """adapter_id -> local PEFT directory, fixed by configuration at start-up."""

    def __init__(self, spec: AdapterSpec, dirs: dict[str, Path], root: Path | None = None) -> None:
        self.spec = spec
        self.dirs = {k: Path(v) for k, v in dirs.items()}
        if root is not None and Path(root).is_dir():
            for sub in sorted(Path(root).iterdir()):
                if (sub / CONFIG_NAME).is_file() and not sub.is_symlink():
                    self.dirs.setdefault(sub.name, sub)
        log.info("%d adapter directories registered", len(self.dirs))

    def __contains__(self, adapter_id: str) -> bool:
        return adapter_id in self.dirs

    def read(self, adapter_id: str, base_model_hash: str | None = None) -> AdapterWeights:
        """Read and validate a registered adapter (AdapterNotFoundError for an unknown id)."""
        path = self.dirs.get(adapter_id)
        if path is None:
            raise AdapterNotFoundError(
                f"adapter {adapter_id!r} is not registered on this replica", "adapter_id"
            )
        return read_adapter(path, adapter_id, self.spec, base_model_hash)
