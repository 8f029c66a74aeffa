-- A replica's GPU adapter slots, from its replica.state. The placement worker asks a replica to hold at most
-- a share of them (LORAFLEET_PLACEMENT_GPU_SLOT_FRACTION) for its hottest owned adapters; the rest belong
-- to the replica's LRU. 0 until the replica reports (and for a replica without a GPU tier).

ALTER TABLE replicas ADD COLUMN gpu_slots integer NOT NULL DEFAULT 0 CHECK (gpu_slots >= 0);
