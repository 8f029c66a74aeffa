from bench.dominant import ADAPTERS, DOMINANT, DominantConfig, by_tenant, stack_config


def _rec(model: str, ttft: float, status: int = 200) -> dict:
    return {"model": model, "ttft_s": ttft, "status": status}


def test_by_tenant_pools_the_other_tenants_and_counts_failures() -> None:
    dominant, other = ADAPTERS[DOMINANT], ADAPTERS["globex-sales"]
    records = [_rec(dominant, 5.0)] * 10 + [_rec(other, t / 10) for t in range(1, 21)]
    records.append(_rec(other, -1.0, status=503))
    out = by_tenant(records)
    assert out[dominant] == {"requests": 10, "failed": 0, "p50": 5.0, "p95": 5.0}
    assert out[other]["requests"] == 21 and out[other]["failed"] == 1
    assert out["others_p95"] == 2.0  # the dominant adapter's 5 s never enters the others' percentile
    assert out["initech/help:prod"] == {"requests": 0, "failed": 0, "p50": None, "p95": None}


def test_only_the_capacity_differs_between_before_and_after() -> None:
    cfg = DominantConfig()
    before, after = stack_config(cfg, False), stack_config(cfg, True)
    key = "LORAFLEET_PLACEMENT_REPLICA_CAPACITY_TOKENS_PER_S"
    assert float(before.env[key]) > 1e6 and float(after.env[key]) == cfg.capacity_tokens_per_s
    assert {k: v for k, v in before.env.items() if k != key} == {
        k: v for k, v in after.env.items() if k != key
    }
    assert before.adapters == after.adapters == ADAPTERS and before.unmanaged == cfg.replicas
