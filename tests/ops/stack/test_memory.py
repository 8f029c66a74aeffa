"""`services status` shows each process's resident memory, read from /proc, and the stack's total."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from lorafleet.config import PlatformSettings
from ops.stack import stack
from ops.stack.memory import children, format_bytes, rss_bytes, tree_rss_bytes
from ops.stack.process import ManagedProcess, wait_until

MIB = 1 << 20
# Touches every page of 96 MiB, says so, then waits; with "child" it starts one more such process first.
HOLDER = """
import subprocess, sys, time
kids = [subprocess.Popen([sys.executable, __file__]) for _ in range(len(sys.argv) > 1)]
block = bytearray(96 << 20)
for i in range(0, len(block), 4096):
    block[i] = 1
print("holding", flush=True)
time.sleep(120)
"""


def _start_holder(proc: ManagedProcess, with_child: bool = False) -> int:
    script = proc.run_dir.parent / "holder.py"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(HOLDER)
    argv = [sys.executable, str(script), *(["child"] if with_child else [])]
    pid = proc.start(argv)
    assert wait_until(lambda: "holding" in proc.log_tail(), 60), proc.log_tail()
    return pid


def test_rss_of_a_live_process_counts_the_pages_it_touched_and_a_gone_one_is_none(tmp_path: Path) -> None:
    proc = ManagedProcess("holder", tmp_path / "run", tmp_path / "logs")
    pid = _start_holder(proc)
    try:
        rss = rss_bytes(pid)
        assert rss is not None and 96 * MIB <= rss < 400 * MIB
    finally:
        proc.stop(timeout=5)
    assert rss_bytes(pid) is None and tree_rss_bytes(pid) is None


def test_tree_rss_adds_the_children(tmp_path: Path) -> None:
    proc = ManagedProcess("parent", tmp_path / "run", tmp_path / "logs")
    pid = _start_holder(proc, with_child=True)
    try:
        assert wait_until(lambda: proc.log_tail().count("holding") == 2, 60), proc.log_tail()
        own, tree = rss_bytes(pid), tree_rss_bytes(pid)
        assert own is not None and tree is not None
        assert tree >= own + 96 * MIB
    finally:
        kids = children(pid)
        proc.stop(timeout=5)
        for kid in kids:
            os.kill(kid, signal.SIGKILL)


def test_status_reports_an_app_process_memory_and_the_text_shows_it_with_a_total(tmp_path: Path) -> None:
    settings = PlatformSettings(data_dir=tmp_path)
    proc = stack.app_process(settings, "relay")
    _start_holder(proc)
    try:
        result = stack.status(settings)
        rss = result["relay"]["rss_bytes"]
        assert isinstance(rss, int) and rss >= 96 * MIB
        assert result["gateway"]["rss_bytes"] is None  # not running
        lines = stack.status_lines(result)
    finally:
        proc.stop(timeout=5)
    relay = next(line for line in lines if line.startswith("relay "))
    assert format_bytes(rss) in relay and "healthy" in relay
    assert lines[-1].startswith("total RSS") and lines[-1].split()[-2:] != ["-"]


def test_the_autoscaler_counts_only_itself_its_replicas_are_listed_under_it(tmp_path: Path) -> None:
    settings = PlatformSettings(data_dir=tmp_path)
    proc = stack.app_process(settings, stack.AUTOSCALER)
    pid = _start_holder(proc, with_child=True)
    try:
        assert wait_until(lambda: proc.log_tail().count("holding") == 2, 60), proc.log_tail()
        rss = stack.status(settings)[stack.AUTOSCALER]["rss_bytes"]
        tree = tree_rss_bytes(pid)
        assert isinstance(rss, int) and tree is not None and rss + 96 * MIB <= tree
    finally:
        kids = children(pid)
        proc.stop(timeout=5)
        for kid in kids:
            os.kill(kid, signal.SIGKILL)


def test_format_bytes_picks_a_readable_unit() -> None:
    assert format_bytes(None) == "-"
    assert format_bytes(340 * MIB) == "340 MiB"
    assert format_bytes(int(1.25 * (1 << 30))) == "1.2 GiB"
