"""What the registry says about one ready adapter version: the only source of where its bytes live."""

from __future__ import annotations

from dataclasses import dataclass

from schemas.ids import SHA256_RE


@dataclass(frozen=True)
class AdapterRecord:
    """A ready adapter version; `digest` is the hex sha256 of adapter_model.safetensors."""

    adapter_id: str
    weights_uri: str
    digest: str
    base_model_hash: str
    target_modules: tuple[str, ...]
    size_bytes: int | None = None


def digest_of(checksum: str) -> str:
    """'sha256:<hex>' -> '<hex>' (ValueError for anything else, so it can never become a path piece)."""
    if not SHA256_RE.fullmatch(checksum):
        raise ValueError(f"checksum is not sha256:<64 lowercase hex>: {checksum[:80]!r}")
    return checksum.split(":", 1)[1]
