-- Each process's own PostgreSQL role, with the grants its job needs and no others (least privilege; the
-- role names are schemas/principals.py DATABASE_ROLES). Roles are NOLOGIN groups: a process logs in as a
-- login role that is a member of its group (`lorafleet db logins`, and `services init` from the logins it
-- is given). Roles belong to the cluster, so they are created once (here, if missing) and granted again in
-- every database this migration runs in. The migrating role needs CREATEROLE.
DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY[
        'lorafleet_gateway', 'lorafleet_public_gateway', 'lorafleet_registry_validator',
        'lorafleet_placement_worker', 'lorafleet_relay', 'lorafleet_stats_stream', 'lorafleet_replica',
        'lorafleet_autoscaler'
    ] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL;  -- another database's migration created it a moment ago
            END;
        END IF;
        EXECUTE format('GRANT USAGE ON SCHEMA public TO %I', r);
        -- every consumer records what it cannot decode (lorafleet/dead_letters.py)
        EXECUTE format('GRANT INSERT ON dead_letters TO %I', r);
    END LOOP;
END $$;

-- The retired-versions trigger keeps its table itself, whoever moves an alias: the gateways get no
-- rights on retired_versions for it.
ALTER FUNCTION aliases_retire_versions() SECURITY DEFINER SET search_path = public, pg_temp;

-- The internal gateway: the registry's HTTP door (pending versions and their outbox events), aliases,
-- and the operator console (tenants, their stats, the registered replicas).
GRANT SELECT ON tenants, tenant_stats TO lorafleet_gateway;
GRANT SELECT, INSERT ON adapters TO lorafleet_gateway;
-- an alias move locks its target version (SELECT ... FOR SHARE), which takes UPDATE on a column
GRANT UPDATE (updated_at) ON adapters TO lorafleet_gateway;
GRANT SELECT, INSERT, UPDATE ON aliases TO lorafleet_gateway;
GRANT INSERT ON outbox TO lorafleet_gateway;
GRANT USAGE ON SEQUENCE outbox_seq_seq TO lorafleet_gateway;
GRANT SELECT (replica_id, url) ON replica_registrations TO lorafleet_gateway;

-- The public gateway: reads keys, tenants' limits, aliases and the registered replica addresses.
GRANT SELECT ON api_keys, tenants, aliases TO lorafleet_public_gateway;
GRANT SELECT (replica_id, url) ON replica_registrations TO lorafleet_public_gateway;

-- The registry validator: settles pending versions (or records an event's version first) and emits
-- adapters.validated, once per event.
GRANT SELECT ON tenants TO lorafleet_registry_validator;
GRANT SELECT, INSERT ON adapters TO lorafleet_registry_validator;
GRANT UPDATE (status, reason_code, reason, size_bytes, updated_at) ON adapters TO lorafleet_registry_validator;
GRANT SELECT, INSERT ON processed_events TO lorafleet_registry_validator;
GRANT INSERT ON outbox TO lorafleet_registry_validator;
GRANT USAGE ON SEQUENCE outbox_seq_seq TO lorafleet_registry_validator;

-- The placement worker: membership, placements, traffic marks and merged targets; commands through the
-- outbox, once per event.
GRANT SELECT ON adapters, retired_versions TO lorafleet_placement_worker;
GRANT SELECT, INSERT, UPDATE ON replicas, merged_targets TO lorafleet_placement_worker;
GRANT SELECT, INSERT, UPDATE, DELETE ON placements TO lorafleet_placement_worker;
GRANT SELECT, INSERT ON adapter_stats TO lorafleet_placement_worker;
GRANT UPDATE (planned_tokens_per_s) ON adapter_stats TO lorafleet_placement_worker;
GRANT SELECT, INSERT ON processed_events TO lorafleet_placement_worker;
GRANT INSERT ON outbox TO lorafleet_placement_worker;
GRANT USAGE ON SEQUENCE outbox_seq_seq TO lorafleet_placement_worker;

-- The relay: publishes the outbox and marks, prunes or fails its rows.
GRANT SELECT, UPDATE, DELETE ON outbox TO lorafleet_relay;

-- The stats stream: per-window adapter and tenant stats.
GRANT SELECT, INSERT, UPDATE ON adapter_stats, tenant_stats TO lorafleet_stats_stream;

-- A replica reads what is placed on it; it registers its address only through register_replica()
-- (migration 014), never by writing replica_registrations itself.
GRANT SELECT ON placements, replicas TO lorafleet_replica;

-- The local autoscaler records only what it cannot decode (dead_letters, above).
