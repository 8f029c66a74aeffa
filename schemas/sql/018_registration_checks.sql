-- A pending version the object store could not be read for: how many checks failed, the last error, and
-- when the next check is due. The registry validator records a failed check here and moves on, so one
-- failing object never holds its partition; its reconciler publishes adapters.registered again for every
-- pending version whose check is due (next_check_at), or that no check has reached within the bound after
-- it was registered (a lost event). A version stays pending, visibly, until a check settles it.
ALTER TABLE adapters
    ADD COLUMN check_attempts   integer NOT NULL DEFAULT 0 CHECK (check_attempts >= 0),
    ADD COLUMN last_check_error text,
    ADD COLUMN next_check_at    timestamptz;
CREATE INDEX adapters_pending ON adapters (created_at) WHERE status = 'pending';
GRANT UPDATE (check_attempts, last_check_error, next_check_at) ON adapters TO lorafleet_registry_validator;
