"""Every `lorafleet` command mounts and answers --help when it is the one named (the processes start that way)."""

from __future__ import annotations

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
