"""weights_uri confinement: only s3 folders under a configured prefix; every bypass form is refused."""

from __future__ import annotations

import pytest

from gateway.errors import InvalidRegistration
from gateway.registry.weights_uri import ObjectLocation, confine, parse_prefix

PREFIXES = [parse_prefix("s3://lorafleet-adapters/"), parse_prefix("s3://team-bucket/pipelines/prod")]


@pytest.mark.parametrize(
    "uri, where",
    [
        (
            "s3://lorafleet-adapters/adapters/acme/support-v7",
            ObjectLocation("lorafleet-adapters", "adapters/acme/support-v7"),
        ),
        ("s3://lorafleet-adapters/a/b/", ObjectLocation("lorafleet-adapters", "a/b")),
        ("s3://team-bucket/pipelines/prod/run-1", ObjectLocation("team-bucket", "pipelines/prod/run-1")),
    ],
)
def test_folders_under_a_prefix_are_accepted(uri: str, where: ObjectLocation) -> None:
    assert confine(uri, PREFIXES) == where


@pytest.mark.parametrize(
    "uri",
    [
        "file:///etc/passwd",
        "file://lorafleet-adapters/x",
        "/etc/passwd",
        "../x",
        "adapters/acme",
        "https://lorafleet-adapters/x",
        "ftp://lorafleet-adapters/x",
        "gopher://lorafleet-adapters/x",
        "jar:s3://lorafleet-adapters/x",
        "s3://other-bucket/x",
        "s3://team-bucket/pipelines/production/x",  # not at a segment boundary
        "s3://team-bucket/pipelines/prod",  # the prefix itself, not a folder inside it
        "s3://lorafleet-adapters/",
        "s3://user@lorafleet-adapters/x",
        "s3://lorafleet-adapters:9000/x",
        "s3://127.0.0.1/x",
        "s3://2130706433/x",
        "s3://0x7f000001/x",
        "s3://0177.0.0.1/x",
        "s3://169.254.169.254/x",
        "s3://[::1]/x",
        "s3://[::ffff:169.254.169.254]/x",
        "s3://lorafleet-adapters/a/../../etc",
        "s3://lorafleet-adapters/a/./b",
        "s3://lorafleet-adapters/a//b",
        "s3://lorafleet-adapters/a/%2e%2e/b",
        "s3://lorafleet-adapters/a\\..\\b",
        "s3://lorafleet-adapters/a\x00b",
        "s3://lorafleet-adapters/a\r\nHost: evil",
        "s3://lorafleet-adapters/a?versionId=1",
        "s3://lorafleet-adapters/a#frag",
        "s3://LORAFLEET-ADAPTERS/x",
        "",
    ],
)
def test_everything_else_is_invalid_weights_uri(uri: str) -> None:
    with pytest.raises(InvalidRegistration) as info:
        confine(uri, PREFIXES)
    assert info.value.code == "invalid_weights_uri"
    assert info.value.param == "weights_uri"
