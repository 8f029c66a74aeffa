"""How every process talks to the object store: one client configuration for aioboto3 (and boto3)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import aioboto3
from botocore.config import Config

from lorafleet.config import PlatformSettings

if TYPE_CHECKING:  # stub-only packages (dev extras): their names exist for the type checker alone
    from aiobotocore.session import ClientCreatorContext
    from types_aiobotocore_s3 import S3Client


def client_config(settings: PlatformSettings | None = None) -> Config:
    # Path-style addressing works for S3Proxy, MinIO and AWS alike; checksums only when an operation
    # requires them, because S3-compatible servers reject the newer default flexible-checksum headers.
    # The read timeout bounds each socket read, so a stream that stalls fails (and is retried) instead
    # of hanging; the total deadline of a download is lorafleet.fetch_retry's.
    settings = settings or PlatformSettings()
    return Config(
        s3={"addressing_style": "path"},
        connect_timeout=settings.s3_connect_timeout_s,
        read_timeout=settings.s3_read_timeout_s,
        retries={"max_attempts": 3, "mode": "standard"},
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )


def client_kwargs(settings: PlatformSettings) -> dict[str, Any]:
    return {
        "endpoint_url": settings.s3_endpoint,
        "aws_access_key_id": settings.s3_access_key,
        "aws_secret_access_key": settings.s3_secret_key,
        "region_name": settings.s3_region,
        "config": client_config(settings),
    }


def async_client(settings: PlatformSettings) -> ClientCreatorContext[S3Client]:
    """`async with async_client(settings) as s3:` an aioboto3 S3 client for the configured store."""
    return aioboto3.Session().client("s3", **client_kwargs(settings))
