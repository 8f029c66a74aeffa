"""The internal API (registry and aliases) as its own process beside a gateway_stack, on its database."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from harness.ports import free_port
from harness.processes import stop, wait_http
from tests.integration.gateway_stack import REPO, GatewayStack


@dataclass
class InternalApi:
    url: str
    log: Path
    proc: subprocess.Popen


@contextlib.asynccontextmanager
async def internal_api(stack: GatewayStack, service_token: str, work: Path) -> AsyncIterator[InternalApi]:
    port, log = free_port(), work / "internal.log"
    env = stack.env | {
        "LORAFLEET_GATEWAY_INTERNAL_PORT": str(port),
        "LORAFLEET_GATEWAY_SERVICE_TOKEN": service_token,
        "LORAFLEET_GATEWAY_SERVED_BASE_MODEL_HASH": stack.env["LORAFLEET_REPLICA_BASE_MODEL_HASH"],
    }
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "lorafleet.cli", "gateway"], env=env, cwd=REPO, stdout=out, stderr=out
        )
    api = InternalApi(f"http://127.0.0.1:{port}", log, proc)
    try:
        await wait_http(f"{api.url}/openapi.json", 60, proc, {"Authorization": f"Bearer {service_token}"})
        yield api
    finally:
        stop(proc)
