-- The placement worker and the stats stream believe a replica.state only from a registered replica at its
-- registered address, signed with that replica's state key (lorafleet/replica_registry.py), as the gateways
-- do: they read the same three columns, and nothing else of the table (never the identity-key hashes).
GRANT SELECT (replica_id, url, state_key) ON replica_registrations
    TO lorafleet_placement_worker, lorafleet_stats_stream;
