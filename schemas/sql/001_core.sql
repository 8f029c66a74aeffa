-- Core control-plane tables. An adapter_id names one immutable adapter version; `version` is its number in
-- the tenant's lineage. Aliases are the only mutable pointer (deploy and rollback).

CREATE TABLE tenants (
    tenant_id        text PRIMARY KEY CHECK (tenant_id ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    display_name     text NOT NULL DEFAULT '',
    requests_per_s   double precision NOT NULL DEFAULT 10 CHECK (requests_per_s > 0),
    tokens_per_min   bigint NOT NULL DEFAULT 200000 CHECK (tokens_per_min > 0),
    created_at       timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE api_keys (
    key_id       text PRIMARY KEY,
    tenant_id    text NOT NULL REFERENCES tenants (tenant_id) ON DELETE CASCADE,
    key_hash     text NOT NULL UNIQUE,          -- sha256 of the secret; the secret itself is never stored
    prefix       text NOT NULL,                 -- first characters, to recognise a key in listings
    created_at   timestamptz NOT NULL DEFAULT now(),
    revoked_at   timestamptz
);
CREATE INDEX api_keys_tenant ON api_keys (tenant_id);

CREATE TABLE adapters (
    adapter_id       text PRIMARY KEY CHECK (adapter_id ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$'),
    tenant_id        text NOT NULL REFERENCES tenants (tenant_id),
    version          integer NOT NULL CHECK (version >= 1),
    base_model_hash  text NOT NULL CHECK (base_model_hash ~ '^sha256:[0-9a-f]{64}$'),
    rank             integer NOT NULL CHECK (rank >= 1),
    alpha            double precision NOT NULL CHECK (alpha > 0),
    target_modules   text[] NOT NULL CHECK (cardinality(target_modules) >= 1),
    size_bytes       bigint CHECK (size_bytes >= 0),
    weights_uri      text NOT NULL,
    checksum         text NOT NULL CHECK (checksum ~ '^sha256:[0-9a-f]{64}$'),
    status           text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'ready', 'rejected')),
    reason_code      text,
    reason           text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    UNIQUE (adapter_id, tenant_id),
    UNIQUE (tenant_id, adapter_id, version),
    -- a rejected version carries its reason; a ready one never has one
    CHECK ((status = 'rejected') = (reason_code IS NOT NULL))
);
CREATE INDEX adapters_tenant ON adapters (tenant_id);

-- A version never leaves a terminal state: ready and rejected are final.
CREATE FUNCTION adapters_status_is_final() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status IN ('ready', 'rejected') AND NEW.status <> OLD.status THEN
        RAISE EXCEPTION 'adapter % is % and cannot become %', OLD.adapter_id, OLD.status, NEW.status
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER adapters_status_final BEFORE UPDATE OF status ON adapters
    FOR EACH ROW EXECUTE FUNCTION adapters_status_is_final();

CREATE TABLE aliases (
    alias                text PRIMARY KEY,
    tenant_id            text NOT NULL REFERENCES tenants (tenant_id),
    adapter_id           text NOT NULL,
    previous_adapter_id  text,
    revision             bigint NOT NULL DEFAULT 1 CHECK (revision >= 1),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    -- the alias's namespace is its tenant: acme/support:prod belongs to acme
    CHECK (split_part(alias, '/', 1) = tenant_id),
    -- an alias can only point at (and roll back to) an adapter of its own tenant
    FOREIGN KEY (adapter_id, tenant_id) REFERENCES adapters (adapter_id, tenant_id),
    FOREIGN KEY (previous_adapter_id, tenant_id) REFERENCES adapters (adapter_id, tenant_id)
);

-- Only ready versions can be aliased.
CREATE FUNCTION aliases_target_ready() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE st text;
BEGIN
    SELECT status INTO st FROM adapters WHERE adapter_id = NEW.adapter_id;
    IF st IS DISTINCT FROM 'ready' THEN
        RAISE EXCEPTION 'alias % cannot point at adapter % with status %', NEW.alias, NEW.adapter_id, st
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER aliases_ready BEFORE INSERT OR UPDATE OF adapter_id ON aliases
    FOR EACH ROW EXECUTE FUNCTION aliases_target_ready();

CREATE TABLE replicas (
    replica_id  text PRIMARY KEY,
    url         text NOT NULL,
    last_seen   timestamptz NOT NULL DEFAULT now(),
    status      text NOT NULL DEFAULT 'starting' CHECK (status IN ('starting', 'ready', 'draining', 'gone'))
);

CREATE TABLE placements (
    adapter_id    text NOT NULL REFERENCES adapters (adapter_id),
    replica_id    text NOT NULL,
    role          text NOT NULL CHECK (role IN ('owner', 'spill')),
    tier          text NOT NULL CHECK (tier IN ('gpu', 'ram', 'disk')),
    last_used_at  timestamptz,
    PRIMARY KEY (adapter_id, replica_id)
);
CREATE INDEX placements_replica ON placements (replica_id);

CREATE TABLE adapter_stats (
    adapter_id    text NOT NULL,
    window_start  timestamptz NOT NULL,
    requests      bigint NOT NULL CHECK (requests >= 0),
    tokens_per_s  double precision NOT NULL CHECK (tokens_per_s >= 0),
    gpu_hit_rate  double precision NOT NULL CHECK (gpu_hit_rate BETWEEN 0 AND 1),
    PRIMARY KEY (adapter_id, window_start)
);
