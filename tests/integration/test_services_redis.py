"""`lorafleet services` runs Redis like PostgreSQL: started with a pid file on its port, listed by status,
stopped by down (a private data folder and port, never the shared stack's). It requires the password of
LORAFLEET_REDIS_URL, and a server from before it did is replaced by one that does."""

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


def test_redis_refuses_a_client_without_its_password(tmp_path: Path) -> None:
    port = free_port()
    settings = PlatformSettings(data_dir=tmp_path, redis_port=port)
    assert redis.password(settings)  # the default URL carries the dev profile's password
    try:
        redis.up(settings)
        assert redis.ping(port, password=redis.password(settings))
        assert not redis.ping(port), "PING without AUTH must get NOAUTH"
        assert not redis.ping(port, password="not-the-password")
        assert redis.password(settings) not in redis.address(settings)  # status lines show no secret
    finally:
        redis.down(settings)


def test_a_server_without_a_password_is_replaced_by_one_that_requires_it(tmp_path: Path) -> None:
    port = free_port()
    settings = PlatformSettings(data_dir=tmp_path, redis_port=port)
    open_settings = PlatformSettings(
        data_dir=tmp_path, redis_port=port, redis_url=f"redis://127.0.0.1:{port}/0"
    )
    try:
        assert redis.up(open_settings) == "started" and redis.ping(port)  # as `services up` ran it before
        assert redis.up(settings) == "started"
        assert not redis.ping(port) and redis.ready(settings)
    finally:
        redis.down(settings)
