"""The console's registry snapshot: tenants, adapters, aliases, and each tenant's figures over the last
WINDOW_S of the stats stream's tenant_stats rows.

Over several windows: requests and tokens add up, p50 TTFT is the request-weighted mean of the windows'
p50s, p95 TTFT is the highest window p95 (an upper bound on the span's p95), tokens/s is tokens over the
windows' seconds, and $/M tokens is the summed cost over the summed tokens.
"""

from __future__ import annotations

import asyncpg

from gateway.registry import adapters, aliases
from schemas.console import RegistrySnapshot, TenantStats, TenantView

WINDOW_S = 900.0

TENANT_STATS = """
SELECT tenant_id, sum(requests)::bigint AS requests, sum(tokens)::bigint AS tokens,
       sum(p50_ttft_s * requests)
           / NULLIF(sum(requests) FILTER (WHERE p50_ttft_s IS NOT NULL), 0) AS p50_ttft_s,
       max(p95_ttft_s) AS p95_ttft_s,
       sum(tokens) / sum(window_seconds) AS tokens_per_s,
       sum(cost_usd) / NULLIF(sum(tokens), 0) * 1e6 AS usd_per_million_tokens
FROM tenant_stats
WHERE window_start >= now() - make_interval(secs => $1)
GROUP BY tenant_id ORDER BY tenant_id
"""


async def tenant_stats(pool: asyncpg.Pool, window_s: float = WINDOW_S) -> list[TenantStats]:
    return [TenantStats(**dict(r)) for r in await pool.fetch(TENANT_STATS, window_s)]


async def snapshot(pool: asyncpg.Pool, window_s: float = WINDOW_S) -> RegistrySnapshot:
    tenants = await pool.fetch(
        "SELECT tenant_id, display_name, requests_per_s, tokens_per_min FROM tenants ORDER BY tenant_id"
    )
    return RegistrySnapshot(
        window_s=window_s,
        tenants=[TenantView(**dict(t)) for t in tenants],
        adapters=await adapters.list_adapters(pool, None, None),
        aliases=await aliases.list_aliases(pool),
        tenant_stats=await tenant_stats(pool, window_s),
    )
