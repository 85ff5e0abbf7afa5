--
-- Landing, for a consumer outside the database (php artisan obx:work):
-- obx.land refuses to run but as a subscription's handler; the landed rows
-- of a consumer are taken per key in landing order (obx.claim_landed),
-- completed (obx.complete_landed) or failed (obx.fail_landed: backoff,
-- then a dead letter) by its owner only.
--
\set VERBOSITY default
\set SHOW_CONTEXT never
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS obx;
RESET client_min_messages;
TRUNCATE obx.landed, obx.landed_starts, obx.dead_letters, obx.processed_events;

-- Called directly, obx.land lands nothing: there is no consumer it serves.
SELECT obx.land(ROW('evt-x', NULL, 'orders.placed.v1', 0, 1, 'ord_1', '{}', '{}', NULL)::obx.inbound_event);

CREATE ROLE regress_land_app;
CREATE ROLE regress_land_deputy IN ROLE regress_land_app;
CREATE ROLE regress_land_mallory;
GRANT USAGE ON SCHEMA obx TO regress_land_app, regress_land_deputy, regress_land_mallory;
GRANT EXECUTE ON FUNCTION obx.claim_landed(text), obx.complete_landed(text, bigint),
	obx.fail_landed(text, bigint, text, integer, interval), obx.start_landed(text, bigint)
	TO regress_land_app, regress_land_deputy, regress_land_mallory;
INSERT INTO obx.consumer_owners (consumer_name, owner)
VALUES ('shop-php', 'regress_land_app'), ('other-php', 'regress_land_mallory');

-- Rows as obx.land writes them: three of key ord_a, one of ord_b, one
-- without a key, one of another consumer.
INSERT INTO obx.landed (consumer_name, event_id, event_type, topic, kafka_partition,
						kafka_offset, event_key, payload)
VALUES ('other-php', 'evt-o1', 'OrderPlaced', 'orders.placed.v1', 0, 1, 'ord_a', '{"n": 0}'),
	   ('shop-php', 'evt-a1', 'OrderPlaced', 'orders.placed.v1', 0, 1, 'ord_a', '{"n": 1}'),
	   ('shop-php', 'evt-a2', 'OrderPaid', 'orders.placed.v1', 0, 2, 'ord_a', '{"n": 2}'),
	   ('shop-php', 'evt-b1', 'OrderPlaced', 'orders.placed.v1', 1, 1, 'ord_b', '{"n": 3}'),
	   ('shop-php', 'evt-a3', 'OrderShipped', 'orders.placed.v1', 0, 3, 'ord_a', '{"n": 4}'),
	   ('shop-php', 'evt-n1', 'Ping', 'orders.placed.v1', 2, 1, NULL, '{"n": 5}');

-- Nobody reads the table itself, not even the consumer's owner.
SET ROLE regress_land_app;
SELECT count(*) FROM obx.landed;
-- The owner takes the first row; failed, it stays first of its key, so
-- its key waits and the next key's row comes.
BEGIN;
SELECT event_id, event_key, attempts FROM obx.claim_landed('shop-php');
SELECT id AS a1 FROM obx.claim_landed('shop-php') \gset
-- Each start is counted (on another connection in obx:work), also one
-- whose worker died; starts of another consumer's row count nothing.
SELECT obx.start_landed('shop-php', :a1) AS first_start, obx.start_landed('shop-php', :a1) AS second_start;
SELECT obx.start_landed('shop-php', -1) AS unknown_row,
       obx.start_landed('shop-php', :a1 - 1) AS other_consumers_row;
SELECT obx.fail_landed('shop-php', :a1, 'RuntimeException: stock service down', 3, '1 hour');
COMMIT;
BEGIN;
SELECT event_id, event_key FROM obx.claim_landed('shop-php');
SELECT obx.complete_landed('shop-php', id) FROM obx.claim_landed('shop-php');
COMMIT;
-- A member of the owner acts for it; a row without a key waits for none.
SET ROLE regress_land_deputy;
SELECT event_id, coalesce(event_key, '-') AS event_key FROM obx.claim_landed('shop-php');
SELECT obx.complete_landed('shop-php', id) FROM obx.claim_landed('shop-php');
-- Now only ord_a is left, its first row backing off: nothing is ready.
SELECT claim_landed IS NULL AS nothing_ready FROM obx.claim_landed('shop-php');
-- Another role cannot take, complete or fail the consumer's rows, nor an
-- unknown consumer's.
SET ROLE regress_land_mallory;
SELECT obx.claim_landed('shop-php');
SELECT obx.complete_landed('shop-php', :a1);
SELECT obx.fail_landed('shop-php', :a1, 'x', 1, '0');
SELECT obx.start_landed('shop-php', :a1);
SELECT obx.claim_landed('no-such-consumer');
-- Its own consumer's rows, yes; ids of another consumer name nothing.
SELECT event_id FROM obx.claim_landed('other-php');
SELECT obx.complete_landed('other-php', :a1) AS completed_another_consumers_row;
RESET ROLE;

-- At max_attempts the row becomes a dead letter and its key goes on.
UPDATE obx.landed SET next_attempt_at = '-infinity' WHERE id = :a1;
SET ROLE regress_land_app;
SELECT obx.fail_landed('shop-php', :a1, 'RuntimeException: stock service down', 2, '0') AS second_failure;
SELECT event_id FROM obx.claim_landed('shop-php');
SELECT obx.fail_landed('shop-php', :a1, 'x', 0, '0');
RESET ROLE;
SELECT consumer_name, event_id, event_key, error_class, error_message, replayed_at
  FROM obx.dead_letters;
SELECT event_id, attempts FROM obx.landed ORDER BY id;
-- A dead letter's starts go with its row.
SELECT count(*) AS starts_left FROM obx.landed_starts WHERE landed_id = :a1;
SELECT consumer_name, landed, failing, backing_off, oldest_landed_age >= '0' AS has_age
  FROM obx.landed_status ORDER BY consumer_name COLLATE "C";

-- (extension only: a handler runs in the SQL-only install on no path)
-- obx.replay_dead_letter runs the subscription's handler, obx.land, which
-- lands the message again for that consumer.
SET client_min_messages = warning;
SELECT obx.subscribe('shop-php', ARRAY['orders.placed.v1'], 'obx.land(obx.inbound_event)');
RESET client_min_messages;
SELECT consumer_name, handler, owner FROM obx.subscriptions WHERE consumer_name = 'shop-php';
SELECT obx.replay_dead_letter('shop-php') AS replayed;
SELECT replayed_at IS NOT NULL AS replayed, last_replay_error FROM obx.dead_letters;
SELECT consumer_name, event_id, event_type, event_key, payload, attempts
  FROM obx.landed ORDER BY id;
-- Failed again to the end, it is the same dead letter, pending again.
SELECT id AS a1 FROM obx.landed WHERE event_id = 'evt-a1' \gset
SELECT obx.fail_landed('shop-php', :a1, 'still down', 1, '0');
SELECT event_id, error_message, replayed_at IS NULL AS pending FROM obx.dead_letters;
SELECT obx.unsubscribe('shop-php');
-- (end extension only)

-- Behind the first row of a key, backing off, 120 more of that key, then
-- a row of another key and one without a key: those are found (past the
-- first 100 rows, by the first row of each key), never the blocked key's.
TRUNCATE obx.landed;
INSERT INTO obx.landed (consumer_name, event_id, topic, kafka_partition, kafka_offset,
						event_key, payload, next_attempt_at)
SELECT 'shop-php', 'evt-z' || g, 'orders.placed.v1', 0, g, 'ord_z', '{}',
	   CASE WHEN g = 0 THEN 'infinity' ELSE '-infinity' END::timestamptz
  FROM generate_series(0, 120) g;
INSERT INTO obx.landed (consumer_name, event_id, topic, kafka_partition, kafka_offset,
						event_key, payload)
VALUES ('shop-php', 'evt-y', 'orders.placed.v1', 1, 1, 'ord_y', '{}'),
	   ('shop-php', 'evt-none', 'orders.placed.v1', 2, 1, NULL, '{}');
SELECT obx.complete_landed('shop-php', id), event_id FROM obx.claim_landed('shop-php');
SELECT obx.complete_landed('shop-php', id), event_id FROM obx.claim_landed('shop-php');
SELECT claim_landed IS NULL AS nothing_ready FROM obx.claim_landed('shop-php');

TRUNCATE obx.landed, obx.landed_starts, obx.dead_letters;
DELETE FROM obx.consumer_owners WHERE consumer_name IN ('shop-php', 'other-php');
REVOKE ALL ON FUNCTION obx.claim_landed(text), obx.complete_landed(text, bigint),
	obx.fail_landed(text, bigint, text, integer, interval), obx.start_landed(text, bigint)
	FROM regress_land_app, regress_land_deputy, regress_land_mallory;
REVOKE USAGE ON SCHEMA obx FROM regress_land_app, regress_land_deputy, regress_land_mallory;
DROP ROLE regress_land_deputy, regress_land_mallory, regress_land_app;
