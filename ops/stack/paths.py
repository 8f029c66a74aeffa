"""Where the repository's infra folder and the service data folders are."""

from __future__ import annotations

from pathlib import Path

from lorafleet.config import PlatformSettings

REPO_ROOT = Path(__file__).resolve().parents[2]
INFRA = REPO_ROOT / "infra"


def service_dir(settings: PlatformSettings, name: str) -> Path:
    return settings.data_path / name


def run_dir(settings: PlatformSettings) -> Path:
    return settings.data_path / "run"


def log_dir(settings: PlatformSettings) -> Path:
    return settings.data_path / "logs"


def java_classpath(component: str) -> str:
    """The lib/* classpath that `make` resolved from Maven Central for an infra component."""
    lib = INFRA / component / "lib"
    if not lib.is_dir() or not any(lib.glob("*.jar")):
        raise FileNotFoundError(
            f"{lib} has no jars; run `make deps` (it resolves infra/{component}/pom.xml with Maven)"
        )
    return f"{lib}/*"
