-- Each adapter version's health per window, beside its traffic: errors and TTFT over its successful
-- requests. A canary version has its own rows, so its TTFT and error rate read apart from its alias's
-- current version (errors / requests is the window's error rate).

ALTER TABLE adapter_stats
    ADD COLUMN errors bigint NOT NULL DEFAULT 0 CHECK (errors >= 0),
    ADD COLUMN p50_ttft_s double precision CHECK (p50_ttft_s >= 0),
    ADD COLUMN p95_ttft_s double precision CHECK (p95_ttft_s >= 0);
