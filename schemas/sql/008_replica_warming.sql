-- A replica's warming step. A replica reports `warming` between its base loading and being routed to; it
-- may own adapters then (the placement worker plans for it) but is never routed to.
-- warming_since: the first heartbeat of the current warming run (NULL when not warming).
-- planned_through: the newest heartbeat a full replan of the placement worker counted this replica in; a
-- warming replica whose planned_through is at least its own warming start has heard of every adapter
-- placed on it (the replan also re-sent the load commands of those it already owned).

ALTER TABLE replicas DROP CONSTRAINT replicas_status_check;
ALTER TABLE replicas ADD CONSTRAINT replicas_status_check
    CHECK (status IN ('starting', 'warming', 'ready', 'draining', 'gone'));
ALTER TABLE replicas ADD COLUMN warming_since timestamptz;
ALTER TABLE replicas ADD COLUMN planned_through timestamptz;
