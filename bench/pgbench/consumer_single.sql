-- Consumer baseline, one message per transaction: what a hand-written
-- consumer writes for one message (its dedupe row in obx.processed_events,
-- then its effect, one row), with no Kafka.
\set k random(0, 9999)
WITH m AS (
	INSERT INTO obx.processed_events (consumer_name, event_id)
	VALUES ('bench.single', gen_random_uuid()::text)
	ON CONFLICT DO NOTHING RETURNING event_id)
INSERT INTO bench.consumer_effects (event_id, order_id, topic)
SELECT event_id, 'ord_' || :k, 'bench.single' FROM m;
