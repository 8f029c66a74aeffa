-- Each tenant's serving figures per closed stats window, written by the stats stream beside adapter_stats:
-- requests and tokens (prompt + completion), p50/p95 TTFT over its successful requests, and its share of the
-- window's GPU bill (charged by request-seconds, stats_stream.aggregates.tenant_costs).

CREATE TABLE tenant_stats (
    tenant_id               text NOT NULL,
    window_start            timestamptz NOT NULL,
    window_seconds          double precision NOT NULL CHECK (window_seconds > 0),
    requests                bigint NOT NULL CHECK (requests >= 0),
    tokens                  bigint NOT NULL CHECK (tokens >= 0),
    p50_ttft_s              double precision CHECK (p50_ttft_s >= 0),
    p95_ttft_s              double precision CHECK (p95_ttft_s >= 0),
    cost_usd                double precision NOT NULL CHECK (cost_usd >= 0),
    usd_per_million_tokens  double precision CHECK (usd_per_million_tokens >= 0),
    PRIMARY KEY (tenant_id, window_start)
);
