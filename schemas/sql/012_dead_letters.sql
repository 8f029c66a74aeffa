-- Consumer-side dead letters: a Kafka record a consumer cannot decode (not JSON, an unknown event type or
-- schema version, a field outside its schema) is kept here with where it was read and why; the consumer
-- commits past it. The outbox's own dead letters (rows that failed validation before publishing) stay in
-- outbox.failed_at / outbox.error; `lorafleet dead-letters` lists both.

CREATE TABLE dead_letters (
    consumer        text NOT NULL,                    -- the consuming process's name, e.g. placement-worker
    topic           text NOT NULL,
    kafka_partition integer NOT NULL,
    kafka_offset    bigint NOT NULL,
    reason          text NOT NULL,
    value           bytea,                            -- the record's bytes as read (NULL for a tombstone)
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    -- a redelivery of the same record (a crash before the commit) records nothing new
    PRIMARY KEY (consumer, topic, kafka_partition, kafka_offset)
);
CREATE INDEX dead_letters_recent ON dead_letters (recorded_at);
