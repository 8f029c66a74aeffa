-- Weighted rollouts: an alias may split its requests between its version (adapter_id) and a canary version
-- of the same tenant that takes canary_weight of them. Both or neither are set; the canary is another ready
-- version. A PUT without a canary ends it, and so does a rollback.
--
-- Retirement counts the canary as pointed at: a version is retired when no alias names it as its version or
-- as its canary, so an ended canary is unloaded like a version an alias moved away from.

ALTER TABLE aliases
    ADD COLUMN canary_adapter_id text,
    ADD COLUMN canary_weight double precision,
    ADD CONSTRAINT aliases_canary_pair CHECK ((canary_adapter_id IS NULL) = (canary_weight IS NULL)),
    ADD CONSTRAINT aliases_canary_weight CHECK (canary_weight > 0 AND canary_weight < 1),
    ADD CONSTRAINT aliases_canary_distinct CHECK (canary_adapter_id <> adapter_id),
    ADD CONSTRAINT aliases_canary_tenant
        FOREIGN KEY (canary_adapter_id, tenant_id) REFERENCES adapters (adapter_id, tenant_id);

CREATE INDEX aliases_canary ON aliases (canary_adapter_id) WHERE canary_adapter_id IS NOT NULL;

CREATE OR REPLACE FUNCTION aliases_target_ready() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE st text;
BEGIN
    SELECT status INTO st FROM adapters WHERE adapter_id = NEW.adapter_id;
    IF st IS DISTINCT FROM 'ready' THEN
        RAISE EXCEPTION 'alias % cannot point at adapter % with status %', NEW.alias, NEW.adapter_id, st
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.canary_adapter_id IS NOT NULL THEN
        SELECT status INTO st FROM adapters WHERE adapter_id = NEW.canary_adapter_id;
        IF st IS DISTINCT FROM 'ready' THEN
            RAISE EXCEPTION 'alias % cannot canary adapter % with status %', NEW.alias, NEW.canary_adapter_id, st
                USING ERRCODE = 'check_violation';
        END IF;
    END IF;
    RETURN NEW;
END $$;
DROP TRIGGER aliases_ready ON aliases;
CREATE TRIGGER aliases_ready BEFORE INSERT OR UPDATE OF adapter_id, canary_adapter_id ON aliases
    FOR EACH ROW EXECUTE FUNCTION aliases_target_ready();

CREATE OR REPLACE FUNCTION aliases_retire_versions() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    tenant text;
    kept text[] := '{}';
BEGIN
    IF TG_OP = 'DELETE' THEN
        tenant := OLD.tenant_id;
    ELSE
        tenant := NEW.tenant_id;
        kept := ARRAY[NEW.adapter_id, NEW.canary_adapter_id];
    END IF;
    -- 1634494817 = 'alia': this lock's class, apart from the project's other advisory locks.
    PERFORM pg_advisory_xact_lock(1634494817, hashtext(tenant));
    IF TG_OP <> 'DELETE' THEN
        DELETE FROM retired_versions WHERE adapter_id = NEW.adapter_id OR adapter_id = NEW.canary_adapter_id;
    END IF;
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        INSERT INTO retired_versions (adapter_id)
        SELECT old_version FROM unnest(ARRAY[OLD.adapter_id, OLD.canary_adapter_id]) AS o(old_version)
        WHERE old_version IS NOT NULL
          AND old_version <> ALL (array_remove(kept, NULL))
          AND NOT EXISTS (
              SELECT 1 FROM aliases WHERE adapter_id = old_version OR canary_adapter_id = old_version
          )
        ON CONFLICT (adapter_id) DO NOTHING;
    END IF;
    RETURN NULL;
END $$;
DROP TRIGGER aliases_retire ON aliases;
CREATE TRIGGER aliases_retire AFTER INSERT OR UPDATE OF adapter_id, canary_adapter_id OR DELETE ON aliases
    FOR EACH ROW EXECUTE FUNCTION aliases_retire_versions();
