-- A replica's registered address is bound to its identity key: a random secret the replica keeps in its data
-- folder (a volume of its own in Kubernetes, so it survives a reschedule). The first registration of an id
-- stores the key's hash; a later one must present the same key, so no replica (they share one database
-- role) can register its own address under another replica's id and receive that replica's prompts.
-- The replica role writes the table only through register_replica(), which runs as the table's owner.
ALTER TABLE replica_registrations ADD COLUMN key_hash bytea;

CREATE FUNCTION register_replica(p_replica_id text, p_url text, p_key text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    digest bytea := sha256(convert_to(p_key, 'UTF8'));
BEGIN
    IF length(p_key) < 32 THEN
        RAISE EXCEPTION 'a replica identity key has at least 32 characters'
            USING ERRCODE = 'invalid_authorization_specification';
    END IF;
    -- a row from before identity keys is claimed by the first key to register under it
    INSERT INTO replica_registrations AS r (replica_id, url, key_hash) VALUES (p_replica_id, p_url, digest)
    ON CONFLICT (replica_id) DO UPDATE SET url = EXCLUDED.url, registered_at = now(), key_hash = EXCLUDED.key_hash
        WHERE r.key_hash IS NULL OR r.key_hash = EXCLUDED.key_hash;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'replica % is registered with another identity key', p_replica_id
            USING ERRCODE = 'invalid_authorization_specification';
    END IF;
END $$;

REVOKE ALL ON FUNCTION register_replica(text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION register_replica(text, text, text) TO lorafleet_replica;
