"""file_lock admits one holder at a time across processes, and a killed holder's lock is free again."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lorafleet.file_lock import file_lock
from ops.stack.paths import REPO_ROOT

# Holds the lock, says so, then after argv[2] seconds writes argv[3] while still holding it.
HOLDER = """
import sys, time
from pathlib import Path
from lorafleet.file_lock import file_lock
with file_lock(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
    Path(sys.argv[3]).write_text("done")
"""


def _holder(lock: Path, seconds: float, done: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lock), str(seconds), str(done)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


@pytest.mark.timeout(60)
def test_a_second_holder_waits_for_the_first_to_finish(tmp_path: Path) -> None:
    done = tmp_path / "done"
    proc = _holder(tmp_path / "lock", 1.0, done)
    with file_lock(tmp_path / "lock"):
        assert done.read_text() == "done"  # the first holder finished its block before this one began
    proc.wait(10)


@pytest.mark.timeout(60)
def test_a_killed_holder_leaves_the_lock_free(tmp_path: Path) -> None:
    done = tmp_path / "done"
    proc = _holder(tmp_path / "lock", 600.0, done)
    proc.kill()
    proc.wait(10)
    with file_lock(tmp_path / "lock"):
        assert not done.exists()
