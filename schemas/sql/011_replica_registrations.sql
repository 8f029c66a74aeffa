-- The addresses the gateway may route to. A replica writes its own row at start-up over its authenticated
-- database connection (replica/control/registration.py); the public gateway accepts a replica.state only
-- if its (replica_id, url) matches a row here (gateway/public/routing/replica_allowlist.py). replica.state itself, and the
-- `replicas` table the placement worker fills from it, are never trusted for an address.
CREATE TABLE replica_registrations (
    replica_id     text PRIMARY KEY,
    url            text NOT NULL CHECK (url ~ '^https?://'),
    registered_at  timestamptz NOT NULL DEFAULT now()
);
