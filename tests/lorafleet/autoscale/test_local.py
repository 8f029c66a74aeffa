"""The local actuator stops only processes it started (by pid file) and starts replicas like the stack does."""

from __future__ import annotations

import sys
from pathlib import Path

from lorafleet.autoscale.decide import Limits, Start
from lorafleet.autoscale.local import LocalFleet, replica_argv
from lorafleet.config import PlatformSettings
from lorafleet.services.process import ManagedProcess
from lorafleet.services.stack import APP_PROCESSES
from schemas.events import AutoscaleSignal

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_a_new_replica_gets_the_stack_command_line_with_its_own_id_and_port() -> None:
    argv = replica_argv(Start(2, "replica-2", 18102))
    stack = APP_PROCESSES["replica-1"]
    assert argv[-len(stack) :] == ["replica", "serve", "--replica-id", "replica-2", "--port", "18102"]
    assert argv[:3] == [sys.executable, "-m", "lorafleet.cli"]


def test_scale_down_stops_our_highest_replica_and_leaves_others_running(tmp_path: Path) -> None:
    fleet = LocalFleet(PlatformSettings(data_dir=tmp_path), Limits(min_replicas=2, max_replicas=4))
    ours = {i: fleet.process(i) for i in (2, 3)}
    pids = {i: p.start(SLEEP) for i, p in ours.items()}
    stranger = ManagedProcess("replica-1", ours[2].run_dir, ours[2].log_dir)
    stranger_pid = stranger.start(SLEEP)  # the stack's replica-1: not ours
    try:
        assert fleet.managed() == pids
        actions = fleet.act_on(AutoscaleSignal(current_replicas=4, desired_replicas=3, reason="test"))
        assert [a.index for a in actions] == [3]
        assert ours[3].pid() is None and ours[2].pid() == pids[2]
        fleet.act_on(AutoscaleSignal(current_replicas=3, desired_replicas=0, reason="test"))
        assert fleet.managed() == {} and stranger.pid() == stranger_pid  # min 2 = replica-0 and -1
    finally:
        for p in (*ours.values(), stranger):
            p.stop(timeout=2)
