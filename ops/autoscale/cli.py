"""`lorafleet autoscale --local`: follow autoscale.signals by starting and stopping local replicas."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import typer

from lorafleet.config import PlatformSettings, get_settings
from lorafleet.profile import refuse_dev_tokens
from ops.autoscale.config import AutoscaleSettings
from schemas import principals

log = logging.getLogger(__name__)


def autoscale(
    local: bool = typer.Option(False, "--local", help="Start and stop replica processes on this machine."),
) -> None:
    """Act on the stats stream's desired replica count (in Kubernetes, KEDA does this: infra/k8s)."""
    if not local:
        raise typer.BadParameter(
            "only --local is implemented; in Kubernetes use infra/k8s/keda-scaledobject.yaml"
        )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a state request per replica per tick
    settings = AutoscaleSettings()
    platform = get_settings().as_service(principals.AUTOSCALER)
    refuse_dev_tokens(
        platform,
        "autoscale",
        {"LORAFLEET_AUTOSCALE_REPLICA_SERVICE_TOKEN": settings.replica_service_token},
    )
    log.info(
        "autoscale --local: fleet %s, %d..%d replicas (%d not ours), cooldown %.0fs",
        settings.fleet,
        settings.min_replicas,
        settings.max_replicas,
        settings.unmanaged_replicas,
        settings.cooldown_s,
    )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run_actuators(platform, settings))


async def run_actuators(platform: PlatformSettings, settings: AutoscaleSettings) -> None:
    """The fleet actuator, and the merged-replica one beside it when enabled, for the fleet one's life."""
    from ops.autoscale import local, merged_local

    fleet = asyncio.create_task(local.run(platform, settings), name="autoscale-fleet")
    merged = (
        [asyncio.create_task(merged_local.run(platform, settings), name="autoscale-merged")]
        if settings.merged_enabled
        else []
    )
    try:
        await fleet
    finally:
        for task in merged:
            task.cancel()
        await asyncio.gather(*merged, return_exceptions=True)
