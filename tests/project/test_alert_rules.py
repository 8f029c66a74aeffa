"""The alert rules fire and resolve as their unit tests (infra/prometheus/alerts_test.yml) say."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

PROMETHEUS = Path(__file__).resolve().parents[2] / "infra" / "prometheus"


def test_the_alert_rules_pass_their_promtool_unit_tests() -> None:
    assert shutil.which("promtool"), "Debian's prometheus package (make deps installs it)"
    result = subprocess.run(
        ["promtool", "test", "rules", str(PROMETHEUS / "alerts_test.yml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
