"""The supervisor restarts a dead child with a growing backoff and records pids and restart counts."""

from __future__ import annotations

import os
import signal
import sys
import time

from lorafleet.config import PlatformSettings
from lorafleet.pids import pid_alive
from ops.stack import supervisor
from ops.stack.process import wait_until
from ops.stack.supervisor import Supervisor, restart_delay

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]
CRASHER = [sys.executable, "-c", "raise SystemExit(3)"]


def _settings(tmp_path) -> PlatformSettings:
    return PlatformSettings(
        data_dir=tmp_path, restart_initial_s=0.2, restart_max_s=0.8, restart_reset_after_s=30.0
    )


def _step_until(sup: Supervisor, check, timeout: float = 20.0) -> bool:
    def stepped() -> bool:
        sup.step()
        return check()

    return wait_until(stepped, timeout, interval=0.05)


def test_restart_delay_doubles_up_to_its_cap() -> None:
    assert [restart_delay(n, 1.0, 5.0) for n in (1, 2, 3, 4, 5)] == [1.0, 2.0, 4.0, 5.0, 5.0]


def test_a_killed_child_is_restarted_and_counted(tmp_path) -> None:
    settings = _settings(tmp_path)
    sup = Supervisor(settings, {"sleeper": SLEEPER})
    try:
        sup.step()
        first = supervisor.read_state(settings)["sleeper"]["pid"]
        assert isinstance(first, int) and pid_alive(first)
        os.kill(first, signal.SIGKILL)
        assert _step_until(sup, lambda: supervisor.read_state(settings)["sleeper"]["restarts"] == 1)
        state = supervisor.read_state(settings)["sleeper"]
        assert state["pid"] != first and pid_alive(state["pid"])
        assert state["last_exit"] == -signal.SIGKILL
        # the pid file names the new process, so `services status` and `down` find it
        assert (tmp_path / "run" / "sleeper.pid").read_text() == str(state["pid"])
    finally:
        sup.stop_all(timeout_s=5)
    assert supervisor.read_state(settings)["sleeper"]["pid"] is None


def test_a_child_that_keeps_dying_waits_longer_each_time(tmp_path) -> None:
    settings = _settings(tmp_path)
    sup = Supervisor(settings, {"crasher": CRASHER, "sleeper": SLEEPER})
    starts: list[float] = []
    seen = 0
    try:
        deadline = time.monotonic() + 30
        while len(starts) < 5 and time.monotonic() < deadline:
            sup.step()
            child = sup.children[0]
            if child.starts != seen:
                seen = child.starts
                starts.append(time.monotonic())
            time.sleep(0.02)
        gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
        assert len(gaps) == 4, starts
        # 0.2, 0.4, 0.8, 0.8 s of backoff (plus the child's own run time)
        assert gaps[0] >= 0.2 and gaps[1] >= 0.4 and gaps[2] >= 0.8 and gaps[3] >= 0.8, gaps
        assert gaps[3] < gaps[0] + 3.0, gaps  # capped, not doubling forever
        state = supervisor.read_state(settings)
        assert state["crasher"]["restarts"] >= 4 and state["crasher"]["last_exit"] == 3
        assert state["sleeper"]["restarts"] == 0  # a neighbour's deaths do not touch it
    finally:
        sup.stop_all(timeout_s=5)
