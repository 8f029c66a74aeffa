"""`lorafleet services` runs Redis like PostgreSQL: started with a pid file on its port, listed by status,
stopped by down (a private data folder and port, never the shared stack's)."""

from __future__ import annotations

from pathlib import Path

from harness.ports import free_port
from lorafleet.config import PlatformSettings
from lorafleet.pids import pid_alive
from ops.stack import redis
from ops.stack.stack import INFRA


def test_redis_starts_once_and_stops_by_its_pid(tmp_path: Path) -> None:
    settings = PlatformSettings(data_dir=tmp_path, redis_port=free_port())
    try:
        assert redis.up(settings) == "started"
        pid = int((tmp_path / "run" / "redis.pid").read_text())
        assert pid_alive(pid) and redis.ready(settings)
        assert redis.up(settings) == "already running"
        assert "redis" in {svc.name for svc in INFRA}  # so `services up/down/status` handle it
    finally:
        stopped = redis.down(settings)
    assert stopped and not pid_alive(pid) and not redis.ready(settings)
    assert redis.down(settings) is False
