"""aioboto3 against the S3-compatible server: put, get, list."""

from __future__ import annotations

import hashlib
import os
import uuid

import pytest

from lorafleet.s3 import async_client

pytestmark = pytest.mark.integration


async def test_put_get_and_list_objects(services) -> None:
    bucket = f"t-{uuid.uuid4().hex[:10]}"
    body = os.urandom(3 * 1024 * 1024 + 17)
    async with async_client(services.settings()) as s3:
        await s3.create_bucket(Bucket=bucket)
        for name in ("acme/a/adapter_model.safetensors", "acme/b/adapter_model.safetensors", "globex/c/x"):
            await s3.put_object(Bucket=bucket, Key=name, Body=body)
        got = await s3.get_object(Bucket=bucket, Key="acme/a/adapter_model.safetensors")
        data = await got["Body"].read()
        assert hashlib.sha256(data).digest() == hashlib.sha256(body).digest()
        listed = await s3.list_objects_v2(Bucket=bucket, Prefix="acme/")
        assert sorted(o["Key"] for o in listed["Contents"]) == [
            "acme/a/adapter_model.safetensors",
            "acme/b/adapter_model.safetensors",
        ]
        with pytest.raises(s3.exceptions.NoSuchKey):
            await s3.get_object(Bucket=bucket, Key="acme/missing")
