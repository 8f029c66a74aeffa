"""`lorafleet services status` reports the local stack's health and exits non-zero when something is down."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.integration.services import docker_answers

pytestmark = pytest.mark.integration


@pytest.mark.skipif(docker_answers(), reason="with Docker the suite uses containers, not the local stack")
def test_status_reports_each_local_service_as_healthy(services) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "lorafleet.cli", "services", "status", "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, **services.env()},
        timeout=60,
    )
    status = json.loads(out.stdout)
    for name in ("postgres", "kafka", "objectstore"):
        assert status[name]["healthy"] is True, status
    # The autoscaler is listed with the replicas it started (none in the test data folder).
    assert status["autoscaler"]["replicas"] == [], status
    # The relay is part of `make up`, not of the test infra; status must say so and exit 1 when it is down.
    assert (out.returncode == 0) == all(info["healthy"] for info in status.values())
