"""The background trainer refuses a set it has no trainer for, its priority follows hurry and ease across its
process group, and stopping it ends its children too."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.pretraining import BACKGROUND_NICE, ease, hurry, start, stop
from lorafleet.pids import pid_alive

# Starts a child that outlives its parent unless its whole process group is ended, and prints its pid.
PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(child.pid, flush=True)
time.sleep(600)
"""


def test_a_set_without_a_trainer_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no-such-set"):
        start(["demo", "no-such-set"], tmp_path / "log")
    assert not (tmp_path / "log").exists()


@pytest.mark.timeout(60)
def test_stop_ends_the_trainer_and_the_processes_it_started() -> None:
    proc = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    stop(proc)
    assert proc.returncode is not None
    deadline = time.monotonic() + 10
    while pid_alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(child)


@pytest.mark.timeout(60)
def test_hurry_and_ease_set_the_priority_of_the_trainer_and_its_children() -> None:
    proc = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        ease(proc)
        assert (
            os.getpriority(os.PRIO_PROCESS, proc.pid)
            == os.getpriority(os.PRIO_PROCESS, child)
            == BACKGROUND_NICE
        )
        hurry(proc)
        if os.geteuid() == 0:  # lowering a nice value needs the privilege; without it hurry leaves it be
            assert os.getpriority(os.PRIO_PROCESS, proc.pid) == os.getpriority(os.PRIO_PROCESS, child) == 0
    finally:
        stop(proc)
