"""Real processes refuse to start on the default dev token outside the dev profile, and start on real
secrets."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from harness.ports import free_port
from harness.processes import stop, wait_http
from lorafleet.profile import DEV_TOKEN

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _env(services, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_TOKEN")}
    return {**env, **services.env(), "LORAFLEET_PROFILE": "production", **extra}


@pytest.mark.parametrize(
    ("argv", "setting"),
    [
        (["gateway"], "LORAFLEET_GATEWAY_SERVICE_TOKEN"),
        (["public-gateway"], "LORAFLEET_GATEWAY_REPLICA_SERVICE_TOKEN"),
        (["replica", "serve", "--replica-id", "profile-test"], "LORAFLEET_REPLICA_SERVICE_TOKEN"),
        (["autoscale", "--local"], "LORAFLEET_AUTOSCALE_REPLICA_SERVICE_TOKEN"),
        (["relay"], "LORAFLEET_KAFKA_PASSWORD"),
        (["registry-validator"], "LORAFLEET_KAFKA_PASSWORD"),
        (["placement-worker"], "LORAFLEET_KAFKA_PASSWORD"),
        (["stats-stream"], "LORAFLEET_KAFKA_PASSWORD"),
    ],
)
def test_a_process_on_the_dev_token_refuses_to_start_outside_the_dev_profile(
    services, argv: list[str], setting: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "lorafleet.cli", *argv],
        env=_env(services),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert setting in done.stderr and "well-known dev secret" in done.stderr, done.stderr[-2000:]


async def test_the_gateway_starts_on_a_real_secret_outside_the_dev_profile_and_guards_its_document(
    services, tmp_path
) -> None:
    port = free_port()
    env = _env(
        services,
        LORAFLEET_GATEWAY_SERVICE_TOKEN="a-real-secret-of-its-own",
        LORAFLEET_GATEWAY_REGISTRY_READ_TOKEN="a-real-read-secret-of-its-own",
        LORAFLEET_GATEWAY_INTERNAL_PORT=str(port),
        LORAFLEET_KAFKA_PASSWORD="a-real-kafka-secret",
    )
    with open(tmp_path / "gateway.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "lorafleet.cli", "gateway"], env=env, cwd=REPO, stdout=log, stderr=log
        )
    real = {"Authorization": "Bearer a-real-secret-of-its-own"}
    try:
        await wait_http(f"http://127.0.0.1:{port}/openapi.json", 90, proc, real)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:
            ok = await c.get("/internal/adapters", headers=real)
            dev = await c.get("/internal/adapters", headers={"Authorization": f"Bearer {DEV_TOKEN}"})
            doc = await c.get("/openapi.json", headers=real)
            bare_doc = await c.get("/openapi.json")
            pages = [(await c.get(p)).status_code for p in ("/docs", "/redoc")]
        assert ok.status_code == 200 and dev.status_code == 401
        # the document lists every internal route: only the service token opens it, and no HTML page exists
        assert "/internal/adapters" in doc.json()["paths"]
        assert bare_doc.status_code == 401 and bare_doc.json()["error"]["type"], bare_doc.text
        assert pages == [404, 404]
    finally:
        stop(proc)
