from gateway.public.routing.hit_window import HitWindow


def test_the_rate_is_gpu_hits_over_requests_in_the_last_window() -> None:
    hits = HitWindow(window_s=60)
    assert hits.rate("r1", 0.0) is None
    hits.record("r1", True, 10.0)
    hits.record("r1", True, 10.5)
    hits.record("r1", False, 30.0)
    hits.record("r2", False, 30.0)
    assert hits.rate("r1", 31.0) == 2 / 3
    assert hits.rate("r2", 31.0) == 0.0
    assert hits.rate("r1", 71.0) == 0.0  # the two hits at second 10 have left the window
    assert hits.rate("r1", 91.0) is None


def test_memory_is_one_bucket_a_second_whatever_the_rate() -> None:
    hits = HitWindow(window_s=60)
    for i in range(10_000):
        hits.record("r1", i % 2 == 0, 100 + i / 1000)  # 10,000 requests over 10 seconds
    assert len(hits._buckets["r1"]) == 10
    assert hits.rate("r1", 110.0) == 0.5
