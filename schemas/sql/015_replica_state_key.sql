-- The key a replica signs its replica.state records with (lorafleet/state_signature.py), registered with its
-- address under its identity key. The gateways read it to verify states; the replicas' role cannot read the
-- table, so no replica learns another's key.
ALTER TABLE replica_registrations ADD COLUMN state_key text;

DROP FUNCTION register_replica(text, text, text);
CREATE FUNCTION register_replica(p_replica_id text, p_url text, p_key text, p_state_key text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    digest bytea := sha256(convert_to(p_key, 'UTF8'));
BEGIN
    IF length(p_key) < 32 THEN
        RAISE EXCEPTION 'a replica identity key has at least 32 characters'
            USING ERRCODE = 'invalid_authorization_specification';
    END IF;
    -- a row from before identity keys is claimed by the first key to register under it
    INSERT INTO replica_registrations AS r (replica_id, url, key_hash, state_key)
    VALUES (p_replica_id, p_url, digest, p_state_key)
    ON CONFLICT (replica_id) DO UPDATE
        SET url = EXCLUDED.url, registered_at = now(), key_hash = EXCLUDED.key_hash,
            state_key = EXCLUDED.state_key
        WHERE r.key_hash IS NULL OR r.key_hash = EXCLUDED.key_hash;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'replica % is registered with another identity key', p_replica_id
            USING ERRCODE = 'invalid_authorization_specification';
    END IF;
END $$;

REVOKE ALL ON FUNCTION register_replica(text, text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION register_replica(text, text, text, text) TO lorafleet_replica;
GRANT SELECT (state_key) ON replica_registrations TO lorafleet_gateway, lorafleet_public_gateway;
