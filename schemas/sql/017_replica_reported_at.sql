-- A replica's heartbeat is timed on the placement worker's clock when it arrives (last_seen), never the
-- replica's: a replica whose clock runs behind stays a member, and one dated in the future cannot keep a
-- dead replica a member. reported_at is the replica's own time of its newest report; it only orders that
-- replica's reports, so that a replayed or late older report changes nothing (placement_worker/store.py).
ALTER TABLE replicas ADD COLUMN reported_at timestamptz;
