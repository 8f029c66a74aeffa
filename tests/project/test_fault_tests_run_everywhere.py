"""The fault tests start their own PostgreSQL and Kafka from what `make deps` installs, so the machine's
Docker engine must not skip them: a CI runner with Docker would otherwise never run them. What this checks
is the suite's own probe, `docker_answers`: no test but the listed ones may call it."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Where the suite chooses its shared services, and the one test about the local stack's own status command.
MAY_ASK_DOCKER = {
    "tests/integration/conftest.py",
    "tests/integration/services.py",
    "tests/integration/test_services_cli.py",
}


def test_no_fault_test_skips_because_a_docker_engine_answers() -> None:
    askers = {
        str(path.relative_to(REPO))
        for path in (REPO / "tests").rglob("*.py")
        if "docker_answers" in path.read_text() and path.name != Path(__file__).name
    }
    assert askers <= MAY_ASK_DOCKER, sorted(askers - MAY_ASK_DOCKER)
