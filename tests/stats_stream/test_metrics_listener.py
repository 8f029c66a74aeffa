"""The stats stream's /metrics carries per-tenant series: it listens on loopback unless given a token, and
then answers only a scraper that presents it."""

from __future__ import annotations

import httpx
import pytest
from pydantic import ValidationError

from harness.ports import free_port
from stats_stream import metrics
from stats_stream.config import StatsStreamSettings


def test_it_listens_on_loopback_by_default_and_nowhere_else_without_a_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("LORAFLEET_STATS_METRICS_HOST", raising=False)
    monkeypatch.delenv("LORAFLEET_STATS_METRICS_TOKEN", raising=False)
    assert StatsStreamSettings().metrics_host == "127.0.0.1"
    with pytest.raises(ValidationError, match="LORAFLEET_STATS_METRICS_TOKEN"):
        StatsStreamSettings(metrics_host="0.0.0.0")
    assert StatsStreamSettings(metrics_host="0.0.0.0", metrics_token="t").metrics_host == "0.0.0.0"
    assert StatsStreamSettings(metrics_host="0.0.0.0", metrics_port=0).metrics_port == 0  # off: no listener


def test_behind_a_token_it_answers_only_a_scraper_that_presents_it() -> None:
    port = free_port()
    metrics.TENANT_TTFT.labels("acme", "0.95").set(0.5)
    metrics.serve(port, "127.0.0.1", "a-metrics-token")
    url = f"http://127.0.0.1:{port}/metrics"
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "a-metrics-token"}):
        refused = httpx.get(url, headers=headers, timeout=5)
        assert refused.status_code == 401 and "acme" not in refused.text
    ok = httpx.get(url, headers={"Authorization": "Bearer a-metrics-token"}, timeout=5)
    assert ok.status_code == 200 and 'lorafleet_tenant_ttft_seconds{quantile="0.95",tenant="acme"}' in ok.text


def test_without_a_token_on_loopback_it_answers_any_local_scraper() -> None:
    port = free_port()
    metrics.serve(port)
    assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).status_code == 200
