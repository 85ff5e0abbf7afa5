-- Consumer baseline, 1,000 messages per transaction: the same dedupe rows
-- and effects as consumer_single.sql, 1,000 of each in one statement and
-- transaction, with no Kafka: the database's own ceiling for this work.
\set k random(0, 9999)
WITH m AS (
	INSERT INTO obx.processed_events (consumer_name, event_id)
	SELECT 'bench.batched', gen_random_uuid()::text FROM generate_series(1, 1000)
	ON CONFLICT DO NOTHING RETURNING event_id)
INSERT INTO bench.consumer_effects (event_id, order_id, topic)
SELECT event_id, 'ord_' || :k, 'bench.batched' FROM m;
