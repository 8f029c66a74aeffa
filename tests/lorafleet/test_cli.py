"""Every `lorafleet` command mounts and answers --help when it is the one named (the processes start that way)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from lorafleet.cli import COMMANDS, SUBCOMMANDS


@pytest.mark.parametrize("name", sorted(COMMANDS) + sorted(SUBCOMMANDS))
def test_each_command_starts_when_named_alone(name: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "lorafleet.cli", name, "--help"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Usage: python -m lorafleet.cli " + name in " ".join(out.stdout.split())


def _cli_without(package: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`lorafleet args...` in an installation where `package` cannot be imported (as in the Docker image)."""
    code = (
        f"import sys; sys.modules[{package!r}] = None; sys.argv = ['lorafleet', *{list(args)!r}]; "
        "from lorafleet.cli import main; main()"
    )
    env = {**os.environ, "COLUMNS": "200"}  # one line per command in the help table
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)


def test_a_tool_missing_from_the_installation_is_listed_as_unavailable() -> None:
    listed = _cli_without("bench", "--help")
    assert listed.returncode == 0, listed.stderr
    assert re.search(r"│ bench +\(not available here: No module named", listed.stdout), listed.stdout
    assert re.search(r"│ public-gateway +Serve", listed.stdout)
    ran = _cli_without("bench", "bench", "engine", "--batch", "8")
    assert ran.returncode == 2
    assert "lorafleet bench is not available in this installation" in ran.stderr


def test_a_service_that_fails_to_import_fails_the_cli() -> None:
    out = _cli_without("gateway", "--help")
    assert out.returncode != 0
    assert "ModuleNotFoundError" in out.stderr
