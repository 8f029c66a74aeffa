-- Retired versions: a version some alias was moved away from (or whose alias was deleted) and that no alias
-- points at now. The placement worker gives a retired version no placements, so a replan never places or
-- re-loads it, and unloads it where it is placed (DESIGN.md: old versions unload after their requests drain).
-- Pointing an alias at it again (a rollback) un-retires it. aliases.previous_adapter_id remembers only the
-- last move of each alias; this table remembers every move (v1 -> v2 -> v3 leaves v1 and v2 retired).
--
-- A trigger on aliases keeps it, in the alias change's own transaction, whoever writes aliases (the gateway's
-- PUT, an operator's SQL). Alias changes of one tenant take a transaction-level advisory lock before they
-- decide, so two concurrent moves away from (or onto) one version cannot both miss each other; it locks no
-- adapters row, so it cannot deadlock with the gateway's FOR SHARE on the target.

CREATE TABLE retired_versions (
    adapter_id  text PRIMARY KEY REFERENCES adapters (adapter_id),
    retired_at  timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX aliases_adapter ON aliases (adapter_id);

CREATE FUNCTION aliases_retire_versions() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    tenant text;
BEGIN
    IF TG_OP = 'DELETE' THEN
        tenant := OLD.tenant_id;
    ELSE
        tenant := NEW.tenant_id;
    END IF;
    -- 1634494817 = 'alia': this lock's class, apart from the project's other advisory locks.
    PERFORM pg_advisory_xact_lock(1634494817, hashtext(tenant));
    IF TG_OP <> 'DELETE' THEN
        DELETE FROM retired_versions WHERE adapter_id = NEW.adapter_id;
    END IF;
    IF TG_OP = 'DELETE' OR (TG_OP = 'UPDATE' AND OLD.adapter_id <> NEW.adapter_id) THEN
        INSERT INTO retired_versions (adapter_id)
        SELECT OLD.adapter_id
        WHERE NOT EXISTS (SELECT 1 FROM aliases WHERE adapter_id = OLD.adapter_id)
        ON CONFLICT (adapter_id) DO NOTHING;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER aliases_retire AFTER INSERT OR UPDATE OF adapter_id OR DELETE ON aliases
    FOR EACH ROW EXECUTE FUNCTION aliases_retire_versions();

-- Versions already moved away from: every previous target still named by an alias or by an aliases.changed
-- event in the outbox (the relay prunes sent rows after its retention, so older moves are not recoverable
-- here; those versions stay placed until an alias moves away from them again).
INSERT INTO retired_versions (adapter_id)
SELECT DISTINCT moved.adapter_id
FROM (
    SELECT previous_adapter_id AS adapter_id FROM aliases WHERE previous_adapter_id IS NOT NULL
    UNION
    SELECT payload->>'previous_adapter_id' FROM outbox
    WHERE aggregate_type = 'aliases.changed' AND payload->>'previous_adapter_id' IS NOT NULL
) AS moved
WHERE EXISTS (SELECT 1 FROM adapters a WHERE a.adapter_id = moved.adapter_id)
  AND NOT EXISTS (SELECT 1 FROM aliases al WHERE al.adapter_id = moved.adapter_id)
ON CONFLICT (adapter_id) DO NOTHING;
