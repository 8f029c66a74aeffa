-- Transactional outbox: domain rows and their events commit together; the relay publishes them.
-- Columns follow DESIGN.md; `seq` gives commit-safe publish order without high-water-mark polling.

CREATE TABLE outbox (
    id              uuid PRIMARY KEY,                 -- the event_id; also sent as the Kafka header `id`
    seq             bigserial NOT NULL UNIQUE,
    aggregate_type  text NOT NULL,                    -- the topic
    aggregate_id    text NOT NULL,                    -- the Kafka message key
    type            text NOT NULL,                    -- the event type
    payload         jsonb NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    sent_at         timestamptz,
    failed_at       timestamptz,                      -- dead-lettered: failed validation, never published
    error           text
);
-- The relay's work queue: unsent, not dead-lettered rows in sequence order.
CREATE INDEX outbox_unsent ON outbox (seq) WHERE sent_at IS NULL AND failed_at IS NULL;

-- Consumer-side dedupe: a handler's side effect and this row commit together, so a redelivered event is a no-op.
CREATE TABLE processed_events (
    consumer      text NOT NULL,
    event_id      uuid NOT NULL,
    processed_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);
