--
-- The consumer's SQL surface (the inbox): obx.subscribe, obx.unsubscribe,
-- obx.replay_dead_letter, obx.subscriptions, obx.dead_letters,
-- obx.consumer_status, obx.consumers, and their privileges.  No Kafka
-- here: this instance's consumer workers work in the database named by
-- obx.database, not in this one, so nothing consumes the subscriptions
-- made here, and the dead letters are inserted by hand.
--
\set VERBOSITY default
\set SHOW_CONTEXT never
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS obx;
RESET client_min_messages;
TRUNCATE obx.processed_events, obx.consumer_owners;

-- An application's handler and its table.
CREATE SCHEMA inv;
CREATE TABLE inv.reservations (n serial PRIMARY KEY, event_id text, sku text);
CREATE FUNCTION inv.reserve(e obx.inbound_event) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
	IF e.payload IS NULL THEN
		RAISE EXCEPTION 'reservation event has no payload';
	END IF;
	IF e.payload->>'sku' IS NULL THEN
		RAISE EXCEPTION 'missing required field sku';
	END IF;
	INSERT INTO inv.reservations (event_id, sku) VALUES (e.event_id, e.payload->>'sku');
END
$$;
-- The return type of a handler is ignored.
CREATE FUNCTION inv.reserve_checked(e obx.inbound_event) RETURNS boolean
LANGUAGE sql AS $$ SELECT true $$;
-- Not handlers: another argument type, two arguments, none.
CREATE FUNCTION inv.reserve_text(e text) RETURNS void LANGUAGE sql AS $$ SELECT $$;
CREATE FUNCTION inv.reserve_two(e obx.inbound_event, n integer) RETURNS void
LANGUAGE sql AS $$ SELECT $$;
CREATE FUNCTION inv.reserve_none() RETURNS void LANGUAGE sql AS $$ SELECT $$;

-- The event a handler receives.
SELECT a.attname, format_type(a.atttypid, a.atttypmod)
  FROM pg_attribute a
 WHERE a.attrelid = 'obx.inbound_event'::regclass AND a.attnum > 0 AND NOT a.attisdropped
 ORDER BY a.attnum;

--
-- subscribe
--
SELECT obx.subscribe('inventory-reservation', ARRAY['orders.placed.v1'],
                     'inv.reserve(obx.inbound_event)');
SELECT obx.subscribe('billing', ARRAY['orders.placed.v1', 'payments.captured.v1'],
                     'inv.reserve_checked(obx.inbound_event)',
                     '{"kafka": {"auto.commit.interval.ms": "3600000", "session.timeout.ms": "6000"},
                       "start": "latest", "retry_sqlstates": ["P0001", "55006"],
                       "max_attempts": 5}');
SELECT consumer_name, topics, handler, options,
       owner = current_user::regrole AS owned_by_caller, created_at IS NOT NULL AS has_created_at
  FROM obx.subscriptions ORDER BY consumer_name COLLATE "C";

-- Upsert: a second call replaces topics, handler and options.
SELECT obx.subscribe('billing', ARRAY['payments.captured.v1'],
                     'inv.reserve(obx.inbound_event)', '{"start": "earliest"}');
SELECT consumer_name, topics, handler, options
  FROM obx.subscriptions ORDER BY consumer_name COLLATE "C";

-- Bad consumer names.
SELECT obx.subscribe(NULL, ARRAY['orders.placed.v1'], 'inv.reserve(obx.inbound_event)');
\echo :SQLSTATE
SELECT obx.subscribe('', ARRAY['orders.placed.v1'], 'inv.reserve(obx.inbound_event)');
\echo :SQLSTATE
-- Bad topic lists.
SELECT obx.subscribe('stock', NULL, 'inv.reserve(obx.inbound_event)');
\echo :SQLSTATE
SELECT obx.subscribe('stock', ARRAY[]::text[], 'inv.reserve(obx.inbound_event)');
\echo :SQLSTATE
SELECT obx.subscribe('stock', ARRAY['orders.placed.v1', NULL], 'inv.reserve(obx.inbound_event)');
\echo :SQLSTATE
SELECT obx.subscribe('stock', ARRAY[''], 'inv.reserve(obx.inbound_event)');
\echo :SQLSTATE
-- Bad handlers.
SELECT obx.subscribe('stock', ARRAY['orders.placed.v1'], NULL);
\echo :SQLSTATE
SELECT obx.subscribe('stock', ARRAY['orders.placed.v1'], 'inv.reserve_text(text)');
\echo :SQLSTATE
SELECT obx.subscribe('stock', ARRAY['orders.placed.v1'], 'inv.reserve_two(obx.inbound_event, integer)');
\echo :SQLSTATE
SELECT obx.subscribe('stock', ARRAY['orders.placed.v1'], 'inv.reserve_none()');
\echo :SQLSTATE
-- Bad options: only "kafka", "start", "retry_sqlstates", "handler_timeout_ms"
-- and "max_attempts" exist (22023).
SELECT obx.subscribe('stock', ARRAY['orders.placed.v1'], 'inv.reserve(obx.inbound_event)',
                     '{"kafka": {}, "retries": 3}');
\echo :SQLSTATE
SELECT obx.subscribe('stock', ARRAY['orders.placed.v1'], 'inv.reserve(obx.inbound_event)',
                     '["kafka"]');
\echo :SQLSTATE
SELECT obx.subscribe('stock', ARRAY['orders.placed.v1'], 'inv.reserve(obx.inbound_event)',
                     '{"kafka": "session.timeout.ms=6000"}');
\echo :SQLSTATE
-- group.id is the consumer name, and obx stores offsets itself.
SELECT obx.subscribe('stock', ARRAY['orders.placed.v1'], 'inv.reserve(obx.inbound_event)',
                     '{"kafka": {"group.id": "someone-else"}}');
\echo :SQLSTATE
SELECT obx.subscribe('stock', ARRAY['orders.placed.v1'], 'inv.reserve(obx.inbound_event)',
                     '{"kafka": {"enable.auto.offset.store": "true"}}');
\echo :SQLSTATE
SELECT obx.subscribe('stock', ARRAY['orders.placed.v1'], 'inv.reserve(obx.inbound_event)',
                     '{"start": "middle"}');
\echo :SQLSTATE
SELECT obx.subscribe('stock', ARRAY['orders.placed.v1'], 'inv.reserve(obx.inbound_event)',
                     '{"retry_sqlstates": "P0001"}');
\echo :SQLSTATE
-- max_attempts: a whole number from 1 to 1000000.
SELECT obx.subscribe('stock', ARRAY['orders.placed.v1'], 'inv.reserve(obx.inbound_event)',
                     '{"max_attempts": 0}');
\echo :SQLSTATE
SELECT obx.subscribe('stock', ARRAY['orders.placed.v1'], 'inv.reserve(obx.inbound_event)',
                     '{"max_attempts": 2.5}');
\echo :SQLSTATE
SELECT obx.subscribe('stock', ARRAY['orders.placed.v1'], 'inv.reserve(obx.inbound_event)',
                     '{"max_attempts": "3"}');
\echo :SQLSTATE
SELECT obx.subscribe('stock', ARRAY['orders.placed.v1'], 'inv.reserve(obx.inbound_event)',
                     '{"max_attempts": 1000001}');
\echo :SQLSTATE
-- None of the failed calls left a subscription, nor changed one.
SELECT consumer_name, topics, handler, options
  FROM obx.subscriptions ORDER BY consumer_name COLLATE "C";

-- Nothing consumed yet: no status rows; one row per subscription in
-- obx.consumers.
SELECT count(*) AS status_rows FROM obx.consumer_status;
SELECT consumer_name, topics, handler, dead_letters_pending
  FROM obx.consumers ORDER BY consumer_name COLLATE "C";

--
-- unsubscribe: true if it existed.
--
SELECT obx.unsubscribe('billing') AS existed;
SELECT obx.unsubscribe('billing') AS existed_again;
SELECT obx.unsubscribe('no-such-consumer') AS unknown;
SELECT consumer_name FROM obx.subscriptions ORDER BY consumer_name COLLATE "C";
SELECT consumer_name FROM obx.consumers ORDER BY consumer_name COLLATE "C";

--
-- replay_dead_letter, on dead letters inserted as the consumer would.
--
INSERT INTO obx.dead_letters (consumer_name, event_id, topic, kafka_partition, kafka_offset,
       event_key, headers, payload, raw_payload, error_class, error_sqlstate, error_message,
       failed_at, replay_attempts)
VALUES ('inventory-reservation', 'evt-no-sku', 'orders.placed.v1', 0, 10, 'ord_1',
        '{"event_id": "evt-no-sku"}', '{"orderId": "ord_1", "qty": 1}', NULL,
        'handler', 'P0001', 'missing required field sku', now(), 0),
       ('inventory-reservation', 'evt-sku', 'orders.placed.v1', 1, 20, 'ord_2',
        '{"event_id": "evt-sku"}', '{"orderId": "ord_2", "sku": "sku-2"}', NULL,
        'handler', '23505', 'duplicate key value violates unique constraint', now(), 0),
       ('inventory-reservation', NULL, 'orders.placed.v1', 1, 21, 'ord_3',
        '{}', NULL, '\x6e6f74206a736f6e'::bytea,
        'malformed', NULL, 'payload is not JSON', now(), 0);
SELECT id AS no_sku FROM obx.dead_letters WHERE event_id = 'evt-no-sku' \gset
SELECT id AS sku FROM obx.dead_letters WHERE event_id = 'evt-sku' \gset
SELECT id AS not_json FROM obx.dead_letters WHERE event_id IS NULL \gset
SELECT consumer_name, dead_letters_pending FROM obx.consumers ORDER BY consumer_name COLLATE "C";

-- By id: the one the handler accepts is applied, the other stays.
SELECT obx.replay_dead_letter(ARRAY[:sku, :no_sku]::bigint[]) AS applied;
SELECT event_id, sku FROM inv.reservations ORDER BY n;
SELECT coalesce(event_id, '-') AS event_id, replayed_at IS NOT NULL AS replayed,
       CASE WHEN replayed_at IS NULL THEN replay_attempts END AS failed_replays,
       CASE WHEN replayed_at IS NULL
            THEN regexp_replace(last_replay_error, 'letter [0-9]+', 'letter N') END AS last_replay_error
  FROM obx.dead_letters ORDER BY kafka_offset;
-- A replayed dead letter is skipped.
SELECT obx.replay_dead_letter(ARRAY[:sku]::bigint[]) AS applied_again;
-- No ids, or ids that do not exist: nothing applied.
SELECT obx.replay_dead_letter(ARRAY[]::bigint[]) AS applied_none;
SELECT obx.replay_dead_letter(ARRAY[-1]::bigint[]) AS applied_unknown;

-- The operator repairs the payload; a replay in a transaction that rolls
-- back leaves everything as it was.
UPDATE obx.dead_letters SET payload = payload || '{"sku": "sku-1"}' WHERE id = :no_sku;
BEGIN;
SELECT obx.replay_dead_letter(ARRAY[:no_sku]::bigint[]) AS applied_in_tx;
SELECT count(*) AS reservations_in_tx FROM inv.reservations;
ROLLBACK;
SELECT count(*) AS reservations FROM inv.reservations;
SELECT replayed_at IS NULL AS still_dead, replay_attempts AS failed_replays
  FROM obx.dead_letters WHERE id = :no_sku;

-- By consumer: every unreplayed one.  The repaired one is applied; the one
-- that was not JSON is not, its failure does not undo the other.
SELECT obx.replay_dead_letter('inventory-reservation') AS applied;
SELECT event_id, sku FROM inv.reservations ORDER BY n;
SELECT coalesce(event_id, '-') AS event_id, replayed_at IS NOT NULL AS replayed,
       CASE WHEN replayed_at IS NULL THEN replay_attempts END AS failed_replays,
       CASE WHEN replayed_at IS NULL
            THEN regexp_replace(last_replay_error, 'letter [0-9]+', 'letter N') END AS last_replay_error
  FROM obx.dead_letters ORDER BY kafka_offset;
SELECT obx.replay_dead_letter('inventory-reservation') AS applied_again;
SELECT count(*) AS reservations FROM inv.reservations;
SELECT consumer_name, dead_letters_pending FROM obx.consumers ORDER BY consumer_name COLLATE "C";

--
-- Privileges: nothing of the consumer is granted to PUBLIC.
--
CREATE ROLE regress_consumer_nobody;
-- (The application's schema is open to it, so that naming the handler is
-- not what fails.)
GRANT USAGE ON SCHEMA inv TO regress_consumer_nobody;
SELECT p.oid::regprocedure AS function
  FROM pg_proc p WHERE p.pronamespace = 'obx'::regnamespace
   AND has_function_privilege('regress_consumer_nobody', p.oid, 'EXECUTE')
 ORDER BY p.oid::regprocedure::text COLLATE "C";
SELECT c.relname AS relation
  FROM pg_class c WHERE c.relnamespace = 'obx'::regnamespace AND c.relkind IN ('r', 'v', 'S')
   AND (has_table_privilege('regress_consumer_nobody', c.oid, 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE')
        OR (c.relkind = 'S' AND has_sequence_privilege('regress_consumer_nobody', c.oid, 'USAGE, UPDATE')))
 ORDER BY c.relname COLLATE "C";
SET ROLE regress_consumer_nobody;
SELECT obx.subscribe('intruder', ARRAY['orders.placed.v1'], 'inv.reserve(obx.inbound_event)');
\echo :SQLSTATE
SELECT count(*) FROM obx.consumer_status;
\echo :SQLSTATE
RESET ROLE;
-- USAGE on the schema alone still allows nothing.
GRANT USAGE ON SCHEMA obx TO regress_consumer_nobody;
SET ROLE regress_consumer_nobody;
SELECT obx.subscribe('intruder', ARRAY['orders.placed.v1'], 'inv.reserve(obx.inbound_event)');
\echo :SQLSTATE
SELECT obx.unsubscribe('inventory-reservation');
\echo :SQLSTATE
SELECT obx.replay_dead_letter('inventory-reservation');
\echo :SQLSTATE
SELECT obx.replay_dead_letter(ARRAY[:no_sku]::bigint[]);
\echo :SQLSTATE
SELECT count(*) FROM obx.subscriptions;
\echo :SQLSTATE
SELECT count(*) FROM obx.dead_letters;
\echo :SQLSTATE
UPDATE obx.dead_letters SET replayed_at = NULL;
\echo :SQLSTATE
SELECT count(*) FROM obx.consumer_status;
\echo :SQLSTATE
SELECT count(*) FROM obx.consumers;
\echo :SQLSTATE
RESET ROLE;
SELECT consumer_name FROM obx.subscriptions ORDER BY consumer_name COLLATE "C";

-- The owner is always the role that wrote the subscription: a role allowed
-- to write obx.subscriptions cannot make a handler run as another role.
CREATE ROLE regress_subscriber;
CREATE ROLE regress_powerful;
GRANT USAGE ON SCHEMA obx, inv TO regress_subscriber;
GRANT INSERT, UPDATE, SELECT ON obx.subscriptions TO regress_subscriber;
SET ROLE regress_subscriber;
INSERT INTO obx.subscriptions (consumer_name, topics, handler, owner)
VALUES ('sneaky', ARRAY['orders.placed.v1'], 'inv.reserve(obx.inbound_event)', 'regress_powerful');
SELECT consumer_name, owner FROM obx.subscriptions WHERE consumer_name = 'sneaky';
UPDATE obx.subscriptions SET owner = 'regress_powerful' WHERE consumer_name = 'sneaky';
RESET ROLE;
SELECT consumer_name, owner FROM obx.subscriptions WHERE consumer_name = 'sneaky';
DELETE FROM obx.subscriptions WHERE consumer_name = 'sneaky';
DROP OWNED BY regress_subscriber;
DROP ROLE regress_subscriber, regress_powerful;

-- Clean up.
SELECT obx.unsubscribe('inventory-reservation') AS existed;
DELETE FROM obx.dead_letters;
TRUNCATE obx.processed_events, obx.consumer_owners;
SET client_min_messages = warning;
DROP SCHEMA inv CASCADE;
RESET client_min_messages;
DROP OWNED BY regress_consumer_nobody;
DROP ROLE regress_consumer_nobody;
