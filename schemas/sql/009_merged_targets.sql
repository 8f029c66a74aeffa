-- Merged replicas per adapter version: the placement worker's decision and the streaks it was made on.
-- desired_replicas is what the latest merged.target event (written with this row, through the outbox) says;
-- above / below count the consecutive traffic windows over the promote / under the demote threshold, up to
-- last_window_start, so a restarted worker continues the same streaks and never re-counts a window.

CREATE TABLE merged_targets (
    adapter_id text PRIMARY KEY REFERENCES adapters (adapter_id),
    desired_replicas integer NOT NULL DEFAULT 0 CHECK (desired_replicas >= 0),
    above integer NOT NULL DEFAULT 0 CHECK (above >= 0),
    below integer NOT NULL DEFAULT 0 CHECK (below >= 0),
    last_window_start timestamptz,
    window_seconds double precision CHECK (window_seconds > 0),
    tokens_per_s double precision NOT NULL DEFAULT 0 CHECK (tokens_per_s >= 0),
    reason text,
    updated_at timestamptz NOT NULL DEFAULT now()
);
