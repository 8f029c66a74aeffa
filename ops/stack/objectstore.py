"""The S3-compatible object store on loopback: S3Proxy (Maven Central) with a filesystem backend."""

from __future__ import annotations

import shutil
import urllib.error
import urllib.request
from typing import TYPE_CHECKING
from urllib.parse import urlparse

import boto3

from lorafleet.config import PlatformSettings
from lorafleet.s3 import client_kwargs
from ops.stack.paths import INFRA, java_classpath, log_dir, run_dir, service_dir
from ops.stack.process import ManagedProcess, wait_until

if TYPE_CHECKING:  # a stub-only package (dev extras)
    from mypy_boto3_s3 import S3Client

NAME = "objectstore"


def process(settings: PlatformSettings) -> ManagedProcess:
    return ManagedProcess(NAME, run_dir(settings), log_dir(settings))


def ready(settings: PlatformSettings) -> bool:
    """Ready when the server answers HTTP at all (an unsigned request gets a 403 from a live S3)."""
    try:
        urllib.request.urlopen(settings.s3_endpoint, timeout=2)
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError):
        return False
    return True


def _write_config(settings: PlatformSettings) -> str:
    base = service_dir(settings, NAME)
    (base / "buckets").mkdir(parents=True, exist_ok=True)
    url = urlparse(settings.s3_endpoint)
    if url.hostname not in ("127.0.0.1", "localhost"):
        raise ValueError(f"the local object store only listens on loopback, not {url.hostname}")
    config = base / "s3proxy.conf"
    config.write_text(
        "\n".join(
            [
                f"s3proxy.endpoint=http://127.0.0.1:{url.port}",
                "s3proxy.authorization=aws-v2-or-v4",
                f"s3proxy.identity={settings.s3_access_key}",
                f"s3proxy.credential={settings.s3_secret_key}",
                "jclouds.provider=filesystem-nio2",
                "jclouds.identity=local",
                "jclouds.credential=local",
                f"jclouds.filesystem.basedir={base / 'buckets'}",
                "",
            ]
        )
    )
    return str(config)


def client(settings: PlatformSettings) -> S3Client:
    return boto3.client("s3", **client_kwargs(settings))


def ensure_bucket(settings: PlatformSettings) -> None:
    s3 = client(settings)
    names = {b["Name"] for b in s3.list_buckets().get("Buckets", [])}
    if settings.s3_bucket not in names:
        s3.create_bucket(Bucket=settings.s3_bucket)


def up(settings: PlatformSettings, timeout: float = 60.0) -> str:
    proc = process(settings)
    if proc.pid() is not None and ready(settings):
        ensure_bucket(settings)
        return "already running"
    java = shutil.which("java")
    if java is None:
        raise RuntimeError("java not found: the object store needs Java 17+ on PATH")
    config = _write_config(settings)
    proc.start(
        [
            java,
            "-Xms64m",
            "-Xmx384m",
            f"-Dlogback.configurationFile={INFRA / 'objectstore' / 'logback.xml'}",
            "-cp",
            java_classpath("objectstore"),
            "org.gaul.s3proxy.Main",
            "--properties",
            config,
        ]
    )
    if not wait_until(lambda: ready(settings), timeout, interval=0.5):
        raise RuntimeError(f"object store did not become ready:\n{proc.log_tail()}")
    ensure_bucket(settings)
    return "started"


def down(settings: PlatformSettings) -> bool:
    return process(settings).stop()
