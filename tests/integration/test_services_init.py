"""`lorafleet services init` readies services it did not start: migrations, topics, the bucket; twice is a no-op."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import asyncpg
import pytest

from ops.stack.objectstore import client

pytestmark = pytest.mark.integration


def _init(env: dict[str, str]) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "lorafleet.cli", "services", "init"],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


async def test_init_migrates_and_makes_the_bucket_once(services, fresh_db: str) -> None:
    bucket = f"t-init-{uuid.uuid4().hex[:10]}"
    env = {**services.env(), "LORAFLEET_DATABASE_URL": fresh_db, "LORAFLEET_S3_BUCKET": bucket}
    s3 = client(services.settings())
    try:
        first = _init(env)
        assert "migrations: 0 applied" not in first
        assert f"bucket: {bucket}" in first
        assert bucket in {b["Name"] for b in s3.list_buckets()["Buckets"]}
        conn = await asyncpg.connect(fresh_db)
        try:
            assert await conn.fetchval("SELECT to_regclass('outbox') IS NOT NULL")
        finally:
            await conn.close()
        assert "migrations: 0 applied" in _init(env)
    finally:
        s3.delete_bucket(Bucket=bucket)
