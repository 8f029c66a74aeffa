"""Local-disk tier: verified PEFT folders named by content digest, within a byte budget, LRU.

An entry is `<root>/<weights sha256>_<config sha256>/` holding adapter_model.safetensors and
adapter_config.json; its name comes only from digests, never from an adapter id or a request. Files
arrive in `<root>/.partial/` and are renamed into place whole, so a half-written entry is never visible.
Promotion re-hashes both files against the name (replica.adapter_cache.promote): a file corrupted after it
was verified is caught there, dropped (drop_corrupt), and fetched again by the caller.
"""

from __future__ import annotations

import hashlib
import logging
import re
import shutil
import threading
import uuid
from pathlib import Path

from replica.adapter_cache.lru import ByteLru

log = logging.getLogger(__name__)

ENTRY_RE = re.compile(r"^(?P<weights>[0-9a-f]{64})_(?P<config>[0-9a-f]{64})$")
PARTIAL = ".partial"
CHUNK = 4 << 20


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in chunks (hashlib releases the GIL on large updates)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def entry_name(weights_digest: str, config_digest: str) -> str:
    name = f"{weights_digest}_{config_digest}"
    if not ENTRY_RE.fullmatch(name):
        raise ValueError("digests must be 64 lowercase hex characters")
    return name


class DiskTier:
    """Content-addressed adapter folders on local disk."""

    def __init__(self, root: Path, budget_bytes: int) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.root / PARTIAL, ignore_errors=True)  # leftovers of a crash mid-download
        (self.root / PARTIAL).mkdir()
        self.lru: ByteLru[str] = ByteLru(budget_bytes, "local disk")
        self.lock = threading.Lock()
        for path in sorted(self.root.iterdir(), key=lambda p: p.stat().st_mtime):
            if ENTRY_RE.fullmatch(path.name) and path.is_dir() and not path.is_symlink():
                try:
                    self.lru.add(path.name, _dir_bytes(path))
                except Exception:  # noqa: BLE001 - over budget after a config change: drop it
                    shutil.rmtree(path, ignore_errors=True)

    def find(self, weights_digest: str) -> str | None:
        """An entry holding these weights, if any (touched as recently used)."""
        with self.lock:
            for name in self.lru.keys():
                if name.startswith(weights_digest + "_"):
                    self.lru.touch(name)
                    return name
        return None

    def path(self, name: str) -> Path:
        if not ENTRY_RE.fullmatch(name):
            raise ValueError("not a disk-tier entry name")
        return self.root / name

    def staging_dir(self) -> Path:
        """A fresh folder for one download; pass it to commit() or discard()."""
        path = self.root / PARTIAL / uuid.uuid4().hex
        path.mkdir()
        return path

    def discard(self, staging: Path) -> None:
        shutil.rmtree(staging, ignore_errors=True)

    def commit(
        self, staging: Path, weights_digest: str, config_digest: str, pinned: bool = False
    ) -> tuple[str, list[str]]:
        """Move a verified download into place; return (entry name, entry names evicted for room)."""
        name = entry_name(weights_digest, config_digest)
        size = _dir_bytes(staging)
        with self.lock:
            if name in self.lru:
                self.discard(staging)
                self.lru.touch(name)
                evicted: list[str] = []
            else:
                evicted = self.lru.add(name, size)
                for victim in evicted:
                    shutil.rmtree(self.root / victim, ignore_errors=True)
                shutil.rmtree(self.root / name, ignore_errors=True)
                staging.rename(self.root / name)
            if pinned:
                self.lru.pin(name)
        return name, evicted

    def pin(self, name: str) -> bool:
        """Pin an entry while it is read; False when it is gone."""
        with self.lock:
            if name not in self.lru:
                return False
            self.lru.pin(name)
            return True

    def unpin(self, name: str) -> None:
        with self.lock:
            if name in self.lru and self.lru.pins(name) > 0:
                self.lru.unpin(name)

    def digests(self, name: str) -> tuple[str, str]:
        """(weights sha256, config sha256) that an entry's files must hash to: its name."""
        m = ENTRY_RE.fullmatch(name)
        if m is None:
            raise ValueError("not a disk-tier entry name")
        return m["weights"], m["config"]

    def drop_corrupt(self, name: str) -> None:
        log.warning("disk-tier entry %s does not match its digest; dropping it", name[:16])
        self.remove(name)

    def remove(self, name: str) -> None:
        with self.lock:
            self.lru.remove(name)
            shutil.rmtree(self.path(name), ignore_errors=True)

    def names(self) -> list[str]:
        with self.lock:
            return self.lru.keys()

    @property
    def used_bytes(self) -> int:
        return self.lru.used


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())
