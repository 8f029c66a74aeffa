"""What `lorafleet services status` and `down` see of the autoscaler's replicas: its records, their state."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from lorafleet.config import PlatformSettings
from ops.autoscale.config import AutoscaleSettings
from ops.autoscale.records import Records, merged_records
from schemas.replica_api import StateResponse


def records(platform: PlatformSettings, settings: AutoscaleSettings | None = None) -> Records:
    s = settings or AutoscaleSettings()
    return Records(platform, s.replica_id_prefix, s.first_port)


def all_records(platform: PlatformSettings, settings: AutoscaleSettings | None = None) -> list[Records]:
    """The fleet replicas' records and the merged replicas' (their own ids and ports)."""
    s = settings or AutoscaleSettings()
    return [records(platform, s), merged_records(platform, s)]


def replica_rows(
    platform: PlatformSettings, settings: AutoscaleSettings | None = None
) -> list[dict[str, object]]:
    """id, port, pid and replica status (None when its state route does not answer) of each live replica."""
    s = settings or AutoscaleSettings()
    token = s.replica_service_token.get_secret_value()
    rows: list[dict[str, object]] = []
    with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=1.0) as client:
        for r in (r for recs in all_records(platform, s) for r in recs.live()):
            status = None
            try:
                resp = client.get(f"http://{s.host}:{r.port}/internal/replicas/{r.replica_id}/state")
                if resp.status_code == 200:
                    status = StateResponse.model_validate_json(resp.content).status
            except (httpx.HTTPError, ValueError):
                pass
            rows.append({"replica_id": r.replica_id, "port": r.port, "pid": r.pid, "status": status})
    return rows


def stop_replicas(platform: PlatformSettings, report: Callable[[str], None]) -> None:
    """SIGTERM (then SIGKILL) every live replica the autoscaler started, by its pid file, and forget it."""
    for recs in all_records(platform):
        for r in recs.live():
            stopped = recs.process(r.index).stop()
            recs.forget(r.index)
            report(f"  {r.replica_id}: {'stopped' if stopped else 'not running'} (started by the autoscaler)")
