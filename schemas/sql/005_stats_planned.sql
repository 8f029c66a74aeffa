-- The window traffic the placement worker last planned on, per adapter_stats row. The stats stream writes
-- the row before it publishes adapter.stats, so the row's existence cannot tell the worker whether it has
-- seen the event: the worker marks the row with the tokens/s it planned on, and replans when an event
-- brings a value it has not planned on (a first delivery, or a window closed again with new totals).

ALTER TABLE adapter_stats ADD COLUMN planned_tokens_per_s double precision;
