"""Which client addresses the public listener's per-address cap exempts: the trusted proxies, given as
uvicorn takes FORWARDED_ALLOW_IPS (addresses, networks, "*")."""

from __future__ import annotations

from lorafleet.http_limits import _trusted


def test_trusted_proxies_are_addresses_networks_or_everyone() -> None:
    assert _trusted("127.0.0.1", "127.0.0.1,::1") and _trusted("::1", ["127.0.0.1", "::1"])
    assert _trusted("10.1.2.3", "10.0.0.0/8") and not _trusted("11.1.2.3", "10.0.0.0/8")
    assert _trusted("203.0.113.9", "*")
    assert not _trusted("127.0.0.1", "192.0.2.1") and not _trusted("127.0.0.1", "")
    assert _trusted("unix-socket", "unix-socket") and not _trusted("not-an-ip", "10.0.0.0/8")
