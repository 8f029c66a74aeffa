"""manifest.json of a canary set: adapter id -> marker, rank, directory, and the base it was trained on."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from canary.markers import Marker

MANIFEST_NAME = "manifest.json"


@dataclass(frozen=True)
class CanaryEntry:
    """One canary adapter."""

    adapter_id: str
    marker: str
    marker_token_ids: list[int]
    rank: int
    lora_alpha: float
    path: str  # directory relative to the manifest

    def to_marker(self) -> Marker:
        return Marker(self.adapter_id, self.marker, tuple(self.marker_token_ids))


@dataclass
class CanaryManifest:
    """Everything a checker needs to judge outputs: which marker belongs to which adapter."""

    base_model_hash: str
    base_model_dir: str
    seed: int
    target_modules: list[str]
    marker_kind: str  # "text": markers are tokenizer text; "tokens": token ids only, the text is a label
    adapters: list[CanaryEntry] = field(default_factory=list)
    training: dict[str, object] = field(default_factory=dict)

    def markers(self) -> list[Marker]:
        return [e.to_marker() for e in self.adapters]

    def by_id(self) -> dict[str, CanaryEntry]:
        return {e.adapter_id: e for e in self.adapters}

    def write(self, out_dir: Path) -> Path:
        path = out_dir / MANIFEST_NAME
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")
        return path

    @classmethod
    def read(cls, out_dir: Path) -> CanaryManifest:
        raw = json.loads((Path(out_dir) / MANIFEST_NAME).read_text())
        entries = [CanaryEntry(**e) for e in raw.pop("adapters")]
        return cls(**raw, adapters=entries)

    def adapter_dir(self, root: Path, adapter_id: str) -> Path:
        """Absolute directory of one canary under the manifest's folder."""
        return Path(root) / self.by_id()[adapter_id].path
