"""ManagedProcess starts, finds and stops only the process it recorded."""

from __future__ import annotations

import sys

from ops.stack.process import ManagedProcess, wait_until


def test_start_records_the_pid_and_stop_ends_only_that_process(tmp_path) -> None:
    proc = ManagedProcess("sleeper", tmp_path / "run", tmp_path / "logs")
    other = ManagedProcess("other", tmp_path / "run", tmp_path / "logs")
    pid = proc.start([sys.executable, "-c", "import time; print('hi', flush=True); time.sleep(60)"])
    other_pid = other.start([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert proc.pid() == pid and proc.pid_file.read_text() == str(pid)
        assert wait_until(lambda: "hi" in proc.log_tail(), 10)
        assert proc.stop(timeout=5) is True
        assert proc.pid() is None and not proc.pid_file.exists()
        assert other.pid() == other_pid  # untouched
        assert proc.stop() is False  # nothing left to stop
    finally:
        other.stop(timeout=5)


def test_a_stale_pid_file_is_treated_as_not_running(tmp_path) -> None:
    proc = ManagedProcess("ghost", tmp_path, tmp_path)
    proc.pid_file.write_text("999999999")
    assert proc.pid() is None
    assert not proc.pid_file.exists()
