"""The autoscaler's records: its own replicas by pid file and marker, never another process's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from lorafleet.config import PlatformSettings
from lorafleet.pids import pid_alive
from ops.autoscale.config import AutoscaleSettings
from ops.autoscale.local import replica_argv
from ops.autoscale.records import Records, serving_pid
from ops.autoscale.view import stop_replicas
from ops.stack.process import ManagedProcess, wait_until
from ops.stack.stack import APP_PROCESSES

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_a_new_replica_gets_the_stack_command_line_with_its_own_id_and_port() -> None:
    argv = replica_argv("replica-2", 18102)
    stack = APP_PROCESSES["replica-1"]
    assert argv[-len(stack) :] == ["replica", "serve", "--replica-id", "replica-2", "--port", "18102"]
    assert argv[:3] == [sys.executable, "-m", "lorafleet.cli"]


def test_the_stack_starts_the_autoscaler_after_the_replicas_it_counts() -> None:
    names = list(APP_PROCESSES)
    assert APP_PROCESSES["autoscaler"] == ["autoscale", "--local"]
    assert names.index("autoscaler") > max(names.index("replica-0"), names.index("replica-1"))


def test_records_find_live_replicas_with_their_markers_and_forget_exited_ones(tmp_path: Path) -> None:
    recs = Records(PlatformSettings(data_dir=tmp_path), "replica-", 18100)
    a, b = recs.process(2), recs.process(3)
    pid_a = a.start(SLEEP)
    pid_b = b.start([sys.executable, "-c", "pass"])
    try:
        recs.mark_ready(2)
        recs.mark_draining(2, 1234.5)
        recs.mark_ready(3)
        assert wait_until(lambda: not pid_alive(pid_b), 10)
        assert recs.reap() == [3] and recs.indices() == [2]
        [live] = recs.live()
        assert (live.index, live.replica_id, live.port, live.pid) == (2, "replica-2", 18102, pid_a)
        assert live.was_ready and live.drain_deadline == 1234.5 and live.started_at > 0
        recs.touch_last_action(99.0)
        assert recs.last_action_at() == 99.0
    finally:
        a.stop(timeout=2)


def test_services_down_stops_the_autoscalers_replicas_and_no_other_process(tmp_path: Path) -> None:
    platform = PlatformSettings(data_dir=tmp_path)
    recs = Records(platform, AutoscaleSettings().replica_id_prefix, 18100)
    ours = recs.process(2)
    ours.start(SLEEP)
    stranger = ManagedProcess("replica-1", ours.run_dir, ours.log_dir)  # the stack's: not the autoscaler's
    stranger_pid = stranger.start(SLEEP)
    lines: list[str] = []
    try:
        stop_replicas(platform, lines.append)
        assert ours.pid() is None and recs.live() == [] and len(lines) == 1
        assert stranger.pid() == stranger_pid
    finally:
        ours.stop(timeout=2)
        stranger.stop(timeout=2)


def test_a_start_cut_off_before_its_pid_file_is_adopted_by_its_command_line(tmp_path: Path) -> None:
    recs = Records(PlatformSettings(data_dir=tmp_path), "t-adopt-", 18100)
    recs.intend(2)
    serving = ["--replica-id", "t-adopt-2", "--port", "18102"]
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *serving])
    recs.intend(3)  # a start that never spawned
    try:
        assert wait_until(lambda: serving_pid("t-adopt-2", 18102) == orphan.pid, 10)
        assert recs.adopt() == [2]
        assert [(r.index, r.pid) for r in recs.live()] == [(2, orphan.pid)]
        assert list(tmp_path.glob("run/*.starting")) == []
        assert recs.adopt() == []  # nothing left to adopt
    finally:
        orphan.kill()
        orphan.wait(5)
