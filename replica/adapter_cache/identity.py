"""A file's identity on disk: proof, without reading it, that it is the file whose bytes were verified.

At verification the disk tier records (st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns) of each file; at
promotion the open file must still show the same. Any write through the filesystem moves ctime, and ctime
cannot be set by users (setting mtime back moves ctime), so a changed, replaced or truncated file shows a
different identity. Silent media corruption does not: the disk tier's scrubber re-hashes files for that.

Racy timestamps: a filesystem stamps ctime with a clock of finite granularity (a jiffy, or a second on some),
so a write in the same tick as the last change before the identity was recorded could leave ctime as it was.
The identity is therefore recorded only once a probe file's ctime, stamped after the file was last changed,
is later than the file's (git's "racily clean" rule): from then on any write gets a later ctime.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

SETTLE_WAIT_S = 3.0  # longer than the coarsest ctime granularity in use (1 s on some filesystems)


@dataclass(frozen=True)
class FileIdentity:
    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileIdentity:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class Identities(NamedTuple):
    """An entry's two files: adapter_model.safetensors and adapter_config.json."""

    weights: FileIdentity
    config: FileIdentity


def stamp(probe: Path) -> int:
    """The filesystem's ctime clock now: change the probe file's metadata and read its ctime back."""
    probe.touch(exist_ok=True)
    os.utime(probe)
    return probe.stat().st_ctime_ns


def settled_identity(
    path: Path, probe: Path, expected: FileIdentity | None = None, wait_s: float | None = None
) -> FileIdentity | None:
    """path's identity (`expected`, else as it is now) once the ctime clock has moved past its last change.

    None if the clock does not move in wait_s, or if the file is not (or no longer) `expected`: the caller
    then leaves it unverified, to be hashed on first use.
    """
    first = expected or FileIdentity.of(path.stat())
    deadline = time.monotonic() + (SETTLE_WAIT_S if wait_s is None else wait_s)
    while True:
        if stamp(probe) > first.ctime_ns:
            return first if FileIdentity.of(path.stat()) == first else None
        if time.monotonic() > deadline:
            return None
        time.sleep(0.002)
