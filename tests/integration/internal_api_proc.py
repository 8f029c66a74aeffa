"""The internal API (registry and aliases) as its own process beside a gateway_stack, on its database."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from harness.ports import free_port
from harness.spec import HttpReady, ProcessSpec, app_args
from harness.stack import launched
from harness.stacks.gateway import GatewayStack


@dataclass
class InternalApi:
    url: str
    log: Path
    proc: subprocess.Popen | None


@contextlib.asynccontextmanager
async def internal_api(stack: GatewayStack, service_token: str, work: Path) -> AsyncIterator[InternalApi]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        "LORAFLEET_GATEWAY_INTERNAL_PORT": str(port),
        "LORAFLEET_GATEWAY_SERVICE_TOKEN": service_token,
        "LORAFLEET_GATEWAY_SERVED_BASE_MODEL_HASH": stack.env["LORAFLEET_REPLICA_BASE_MODEL_HASH"],
    }
    ready = HttpReady(f"{url}/openapi.json", 60, {"Authorization": f"Bearer {service_token}"})
    spec = ProcessSpec("gateway", app_args("gateway"), port, env, (ready,), log="internal")
    async with launched([spec], stack.env, work) as (api,):
        yield InternalApi(url, api.log, api.proc)
