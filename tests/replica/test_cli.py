"""`lorafleet replica serve` is mounted and documents its flags."""

from __future__ import annotations

from typer.testing import CliRunner

from replica.cli import app


def test_serve_help_lists_flags() -> None:
    result = CliRunner().invoke(app, ["serve", "--help"])
    assert result.exit_code == 0
    for flag in ("--model-dir", "--port", "--replica-id", "--merged-adapter-id"):
        assert flag in result.output
