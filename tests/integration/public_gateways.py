"""Public gateway processes (`lorafleet public-gateway`) on free ports, for tests of what several share."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from harness.ports import free_port
from harness.spec import HttpReady, ProcessSpec, app_args
from harness.stack import launched


def _gateway(index: int) -> ProcessSpec:
    port = free_port()
    env = {"LORAFLEET_GATEWAY_PUBLIC_PORT": str(port)}
    ready = HttpReady(f"http://127.0.0.1:{port}/health", 90)
    return ProcessSpec(f"gateway-{index}", app_args("public-gateway"), port, env, (ready,))


@contextlib.asynccontextmanager
async def public_gateways(env: dict[str, str], work: Path, count: int) -> AsyncIterator[list[str]]:
    """Start count gateways with env (logs in work/gateway-<i>.log); yield their URLs once each is healthy."""
    async with launched([_gateway(i) for i in range(count)], env, work) as gateways:
        yield [g.url for g in gateways]
