"""An exclusive lock on a file, held by one process at a time and released when it exits, however it ends;
and a folder built once under it."""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold path's lock for the block, waiting while another process holds it (flock: a killed holder's
    lock is released by the kernel, so a crash never leaves it held)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the last descriptor releases the lock


def built_once(out: Path, marker: str, build: Callable[[Path], None]) -> Path:
    """out, complete once it holds `marker`; when it does not, build(folder) fills a fresh folder beside it,
    renamed to out when done. The build holds out's lock, so a second process waits for the first one's
    folder instead of building its own, and a crash never leaves a folder that looks complete (the next
    build removes a killed one's partial folder)."""
    if (out / marker).is_file():
        return out
    with file_lock(out.parent / f".{out.name}.lock"):
        if (out / marker).is_file():  # another process built it while this one waited
            return out
        for stale in out.parent.glob(f".{out.name}-*"):  # only the lock's holder writes there
            shutil.rmtree(stale, ignore_errors=True)
        partial = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
        try:
            build(partial)
            partial.rename(out)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    return out
