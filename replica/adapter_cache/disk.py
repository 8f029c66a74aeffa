"""Local-disk tier: verified PEFT folders named by content digest, within a byte budget, LRU.

An entry is `<root>/<weights sha256>_<config sha256>/` holding adapter_model.safetensors and
adapter_config.json; its name comes only from digests, never from an adapter id or a request. Files are
written in `<root>/.partial/` and renamed into place whole, so a half-written entry is never visible.

Verification: the sha256 is checked once, when the bytes enter the machine
(replica.adapter_cache.object_store hashes them as they stream in); they are validated and written here only
after that. Promotion does not hash again. The index keeps, for each verified entry, its files' identities
(replica.adapter_cache.identity) and its layout (what validation learned from the header and config: the
cache treats it as opaque). Promotion checks both on the open files, and a mismatch, a short read or a
header or shape failure means the entry is corrupt: it is dropped (drop_corrupt) and fetched again. Entries
found at start-up, or whose identities did not settle, are unverified: the first promotion hashes them
once and records them. scrub_next() re-hashes one entry with sha256, for the background scrubber that
catches silent media corruption off the request path.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import threading
import uuid
from collections import deque
from pathlib import Path
from typing import Any, NamedTuple

from replica.adapter_cache.identity import FileIdentity, Identities, settled_identity
from replica.adapter_cache.lru import ByteLru
from replica.lora.weights import CONFIG_NAME, WEIGHTS_NAME

log = logging.getLogger(__name__)

ENTRY_RE = re.compile(r"^(?P<weights>[0-9a-f]{64})_(?P<config>[0-9a-f]{64})$")
PARTIAL = ".partial"
PROBE = ".ctime-probe"
CHUNK = 4 << 20


class Verified(NamedTuple):
    """What the index keeps of a verified entry: its files' identities and the layout validation learned
    (opaque to this tier)."""

    identities: Identities
    layout: Any


class Written(NamedTuple):
    name: str  # the entry now holding the bytes
    evicted: list[str]  # entries dropped to make room


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in chunks (hashlib releases the GIL on large updates)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


class EntryDigests(NamedTuple):
    """What a disk entry's name says: the sha256 its weights file and its config file must hash to."""

    weights: str
    config: str


# An entry's name is built, matched and parsed here and nowhere else.


def entry_name(weights_digest: str, config_digest: str) -> str:
    name = f"{weights_digest}_{config_digest}"
    if not ENTRY_RE.fullmatch(name):
        raise ValueError("digests must be 64 lowercase hex characters")
    return name


def holds_weights(name: str, weights_digest: str) -> bool:
    """The entry's weights file hashes to weights_digest (a prefix test: it runs for every entry a find
    passes over)."""
    return name.startswith(weights_digest + "_")


def is_entry_name(name: str) -> bool:
    return ENTRY_RE.fullmatch(name) is not None


def entry_digests(name: str) -> EntryDigests:
    """ValueError when name is not an entry's name."""
    m = ENTRY_RE.fullmatch(name)
    if m is None:
        raise ValueError("not a disk-tier entry name")
    return EntryDigests(m["weights"], m["config"])


class DiskTier:
    """Content-addressed adapter folders on local disk, with the identities of the verified ones."""

    def __init__(self, root: Path, budget_bytes: int) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.root / PARTIAL, ignore_errors=True)  # leftovers of a crash mid-write
        (self.root / PARTIAL).mkdir()
        self.lru: ByteLru[str] = ByteLru(budget_bytes, "local disk")
        self.lock = threading.Lock()
        self._verified: dict[str, Verified] = {}
        self._scrub_order: deque[str] = deque()
        for path in sorted(self.root.iterdir(), key=lambda p: p.stat().st_mtime):
            if _is_entry(path):
                try:
                    self.lru.add(path.name, _dir_bytes(path))  # unverified: hashed on first use
                except Exception:  # noqa: BLE001 - over budget after a config change: drop it
                    shutil.rmtree(path, ignore_errors=True)

    def find(self, weights_digest: str) -> str | None:
        """An entry holding these weights, if any (touched as recently used)."""
        with self.lock:
            for name in self.lru.keys():
                if holds_weights(name, weights_digest):
                    self.lru.touch(name)
                    return name
        return None

    def path(self, name: str) -> Path:
        entry_digests(name)  # a name is never a path piece unless it is an entry's
        return self.root / name

    def verified(self, name: str) -> Verified | None:
        """What was recorded at verification; None while the entry is unverified."""
        with self.lock:
            return self._verified.get(name)

    # writing verified bytes

    def write(
        self, weights: memoryview, config: bytes, weights_digest: str, config_digest: str, layout: Any
    ) -> Written:
        """Store bytes verified and validated in memory. Blocking."""
        staging = self.root / PARTIAL / uuid.uuid4().hex
        staging.mkdir()
        try:
            identities = Identities(
                _write(staging / WEIGHTS_NAME, weights), _write(staging / CONFIG_NAME, config)
            )
            written, placed = self._commit(staging, weights_digest, config_digest)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        if placed:
            self.settle(written.name, identities, layout)
        return written

    def settle(self, name: str, expected: Identities, layout: Any) -> bool:
        """Mark an entry verified once its files' ctimes have settled and they are still `expected`."""
        path, probe = self.path(name), self.root / PARTIAL / PROBE
        try:
            weights = settled_identity(path / WEIGHTS_NAME, probe, expected.weights)
            config = settled_identity(path / CONFIG_NAME, probe, expected.config)
        except OSError:
            return False
        if weights is None or config is None:
            log.warning(
                "disk-tier entry %s stays unverified (its files changed or did not settle)", name[:16]
            )
            return False
        with self.lock:
            if name not in self.lru:
                return False
            self._verified[name] = Verified(Identities(weights, config), layout)
        return True

    def current(self, name: str) -> Identities:
        """The files' identities as they are now (OSError when a file is missing)."""
        path = self.path(name)
        return Identities(
            FileIdentity.of((path / WEIGHTS_NAME).stat()), FileIdentity.of((path / CONFIG_NAME).stat())
        )

    def _commit(self, staging: Path, weights_digest: str, config_digest: str) -> tuple[Written, bool]:
        """Rename staging into place; False when the entry was already there."""
        name = entry_name(weights_digest, config_digest)
        size = _dir_bytes(staging)
        with self.lock:
            if name in self.lru:
                shutil.rmtree(staging, ignore_errors=True)
                self.lru.touch(name)
                return Written(name, []), False
            evicted = self.lru.add(name, size)
            for victim in evicted:
                self._verified.pop(victim, None)
                shutil.rmtree(self.root / victim, ignore_errors=True)
            shutil.rmtree(self.root / name, ignore_errors=True)
            staging.rename(self.root / name)
        return Written(name, evicted), True

    # readers hold a pin so the entry is not evicted under them

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

    def drop_corrupt(self, name: str) -> None:
        log.warning("disk-tier entry %s is not the file that was verified; dropping it", name[:16])
        self.remove(name)

    def remove(self, name: str) -> None:
        with self.lock:
            self.lru.remove(name)
            self._verified.pop(name, None)
            shutil.rmtree(self.path(name), ignore_errors=True)

    # the scrubber

    def scrub_next(self) -> str | None:
        """Re-hash the next entry (round robin) with sha256; drop it on a mismatch and return its name."""
        with self.lock:
            if not self._scrub_order:
                self._scrub_order.extend(self.lru.keys())
            name = None
            while self._scrub_order and name is None:
                candidate = self._scrub_order.popleft()
                if candidate in self.lru:
                    name = candidate
                    self.lru.pin(name)
        if name is None:
            return None
        try:
            digests, path = entry_digests(name), self.path(name)
            ok = (
                sha256_file(path / WEIGHTS_NAME) == digests.weights
                and sha256_file(path / CONFIG_NAME) == digests.config
            )
        except OSError:
            ok = False
        finally:
            self.unpin(name)
        if ok:
            return None
        self.drop_corrupt(name)
        return name

    def names(self) -> list[str]:
        with self.lock:
            return self.lru.keys()

    @property
    def used_bytes(self) -> int:
        return self.lru.used


def _write(path: Path, data: memoryview | bytes) -> FileIdentity:
    """Write a whole file; return its identity as this write left it."""
    with open(path, "wb", buffering=0) as f:
        view, done = memoryview(data).cast("B"), 0
        while done < len(view):
            done += f.write(view[done:])
        return FileIdentity.of(os.fstat(f.fileno()))


def _is_entry(path: Path) -> bool:
    return is_entry_name(path.name) and path.is_dir() and not path.is_symlink()


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())
