--
-- obx.enqueue: the application side of the outbox.
--
-- The server runs with test/regress.conf: obx.workers = 0 (no relay, so rows
-- stay as enqueue left them) and obx.topics = 'orders.*, payments.captured.v1'.
-- Generated ids and timestamps are never printed, only facts about them.
-- Every error is followed by its SQLSTATE.
--
\set VERBOSITY default
\set SHOW_CONTEXT never
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS obx;
RESET client_min_messages;
TRUNCATE obx.events, obx.claims, obx.records, obx.event_states, obx.processed_events;

SHOW obx.workers;
SHOW obx.topics;

--
-- Happy path: returns a fresh id; the row carries the seed's columns.
--
SELECT obx.enqueue('orders.placed.v1', 'ord_782',
                   '{"eventType": "OrderPlaced", "orderId": "ord_782", "totalMinor": 12900}')
       AS id1 \gset
SELECT :'id1'::uuid IS NOT NULL AS has_id;

SELECT id = :'id1' AS same_id, aggregate_id, topic, event_key, event_type,
       headers, payload, occurred_at IS NOT NULL AS has_occurred_at,
       occurred_at <= clock_timestamp() AS occurred_in_past,
       published_at IS NULL AS unpublished, attempts, quarantined_at IS NULL AS not_quarantined,
       last_error, kafka_partition, kafka_offset
  FROM obx.outbox_events;

-- The generated id is a version 7 (time-ordered) UUID whose millisecond
-- timestamp is the enqueue time.
SELECT substr(:'id1', 15, 1) = '7' AS uuid_version_7,
       substr(:'id1', 20, 1) IN ('8', '9', 'a', 'b') AS rfc_variant,
       abs(('x' || lpad(replace(substr(:'id1', 1, 13), '-', ''), 16, '0'))::bit(64)::bigint
           - (extract(epoch FROM e.occurred_at) * 1000)::bigint) < 5000 AS uuid_time_is_enqueue_time
  FROM obx.outbox_events e WHERE e.id = :'id1';

-- aggregate_id, event_type and headers given explicitly; named notation.
SELECT obx.enqueue(topic => 'orders.placed.v1', event_key => 'ord_782',
                   payload => '{"eventType": "OrderPaid", "orderId": "ord_782"}',
                   aggregate_id => 'order/782', event_type => 'OrderPaid',
                   headers => '{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "source": "shop"}')
       AS id2 \gset
SELECT aggregate_id, event_key, event_type, headers
  FROM obx.outbox_events WHERE id = :'id2';

-- Enqueue order: seq grows with each call; ids differ.
SELECT obx.enqueue('payments.captured.v1', 'pay_1', '{"amount": 1}') AS id3 \gset
SELECT (SELECT seq FROM obx.outbox_events WHERE id = :'id1') <
       (SELECT seq FROM obx.outbox_events WHERE id = :'id2') AS seq_1_lt_2,
       (SELECT seq FROM obx.outbox_events WHERE id = :'id2') <
       (SELECT seq FROM obx.outbox_events WHERE id = :'id3') AS seq_2_lt_3,
       count(DISTINCT id) AS distinct_ids
  FROM obx.outbox_events;

-- Several events in one statement keep the order in which they were enqueued.
SELECT count(obx.enqueue('orders.shipped.v1', 'ord_' || i, jsonb_build_object('n', i)))
  FROM generate_series(1, 5) i;
SELECT array_agg(payload->>'n' ORDER BY seq) AS n_in_seq_order
  FROM obx.outbox_events WHERE topic = 'orders.shipped.v1';

--
-- The allow-list: 'orders.*' admits every topic starting with "orders.",
-- 'payments.captured.v1' admits exactly that topic.
--
SELECT obx.enqueue('orders.', 'k', '{}') IS NOT NULL AS prefix_itself;
SELECT obx.enqueue('orders.cancelled.v2', 'k', '{}') IS NOT NULL AS prefix_match;
SELECT obx.enqueue('orders', 'k', '{}');
\echo :SQLSTATE
SELECT obx.enqueue('ordersX.placed', 'k', '{}');
\echo :SQLSTATE
SELECT obx.enqueue('Orders.placed.v1', 'k', '{}');
\echo :SQLSTATE
SELECT obx.enqueue('payments.captured.v10', 'k', '{}');
\echo :SQLSTATE
SELECT obx.enqueue('payments.captured', 'k', '{}');
\echo :SQLSTATE
SELECT obx.enqueue('inventory.reserved.v1', 'k', '{}');
\echo :SQLSTATE
-- (extension only: the rights on obx's settings)
-- The allow-list is server configuration: a session cannot widen it.
SET obx.topics = '*';
\echo :SQLSTATE
SHOW obx.topics;
-- (end extension only)

--
-- An explicit event id.
--
SELECT obx.enqueue('orders.placed.v1', 'ord_9', '{"orderId": "ord_9", "b": 2, "a": 1}',
                   event_type => 'OrderPlaced', headers => '{"h": "1"}',
                   event_id => '00000000-0000-4000-8000-000000000001');
-- The same id with the same content is a no-op that returns the id (a
-- retried business action), also when the JSON is written differently.
SELECT obx.enqueue('orders.placed.v1', 'ord_9', '{"a": 1, "b": 2, "orderId": "ord_9"}',
                   event_type => 'OrderPlaced', headers => '{"h": "1"}',
                   event_id => '00000000-0000-4000-8000-000000000001');
SELECT count(*) AS rows_with_id FROM obx.outbox_events
 WHERE id = '00000000-0000-4000-8000-000000000001';
-- The same id with different content is an error, whatever differs.
SELECT obx.enqueue('orders.placed.v1', 'ord_9', '{"orderId": "ord_9", "b": 2, "a": 2}',
                   event_type => 'OrderPlaced', headers => '{"h": "1"}',
                   event_id => '00000000-0000-4000-8000-000000000001');
\echo :SQLSTATE
SELECT obx.enqueue('orders.paid.v1', 'ord_9', '{"orderId": "ord_9", "b": 2, "a": 1}',
                   event_type => 'OrderPlaced', headers => '{"h": "1"}',
                   event_id => '00000000-0000-4000-8000-000000000001');
\echo :SQLSTATE
SELECT obx.enqueue('orders.placed.v1', 'ord_10', '{"orderId": "ord_9", "b": 2, "a": 1}',
                   event_type => 'OrderPlaced', headers => '{"h": "1"}',
                   event_id => '00000000-0000-4000-8000-000000000001');
\echo :SQLSTATE
SELECT obx.enqueue('orders.placed.v1', 'ord_9', '{"orderId": "ord_9", "b": 2, "a": 1}',
                   event_type => 'OrderPaid', headers => '{"h": "1"}',
                   event_id => '00000000-0000-4000-8000-000000000001');
\echo :SQLSTATE
SELECT obx.enqueue('orders.placed.v1', 'ord_9', '{"orderId": "ord_9", "b": 2, "a": 1}',
                   event_type => 'OrderPlaced',
                   event_id => '00000000-0000-4000-8000-000000000001');
\echo :SQLSTATE
-- A different aggregate id is different content too.
SELECT obx.enqueue('orders.placed.v1', 'ord_9', '{"orderId": "ord_9", "b": 2, "a": 1}',
                   aggregate_id => 'order/9',
                   event_type => 'OrderPlaced', headers => '{"h": "1"}',
                   event_id => '00000000-0000-4000-8000-000000000001');
\echo :SQLSTATE
SELECT count(*) AS rows_with_id, min(payload::text) AS payload_kept
  FROM obx.outbox_events WHERE id = '00000000-0000-4000-8000-000000000001';

-- Twice in one transaction: the second call is the same no-op.
BEGIN;
SELECT obx.enqueue('orders.placed.v1', 'ord_11', '{"n": 11}',
                   event_id => '00000000-0000-4000-8000-000000000002');
SELECT obx.enqueue('orders.placed.v1', 'ord_11', '{"n": 11}',
                   event_id => '00000000-0000-4000-8000-000000000002');
COMMIT;
SELECT count(*) AS rows_with_id FROM obx.outbox_events
 WHERE id = '00000000-0000-4000-8000-000000000002';

--
-- Bad input: every check fails the call with a clear message, inside the
-- caller's transaction.
--
SELECT count(*) AS events_before_bad_input FROM obx.outbox_events \gset

-- topic
SELECT obx.enqueue(NULL, 'k', '{}');
\echo :SQLSTATE
SELECT obx.enqueue('', 'k', '{}');
\echo :SQLSTATE
SELECT obx.enqueue('orders.placed v1', 'k', '{}');
\echo :SQLSTATE
SELECT obx.enqueue('orders/placed', 'k', '{}');
\echo :SQLSTATE
SELECT obx.enqueue('orders.plацed', 'k', '{}');
\echo :SQLSTATE
SELECT obx.enqueue('.', 'k', '{}');
\echo :SQLSTATE
SELECT obx.enqueue('..', 'k', '{}');
\echo :SQLSTATE
-- Kafka allows 249 characters: 249 pass, 250 fail.
SELECT obx.enqueue('orders.' || repeat('x', 242), 'k', '{}', aggregate_id => 'boundary')
       IS NOT NULL AS topic_249_ok;
SELECT obx.enqueue('orders.' || repeat('x', 243), 'k', '{}');
\echo :SQLSTATE

-- key
SELECT obx.enqueue('orders.placed.v1', NULL, '{}');
\echo :SQLSTATE
SELECT obx.enqueue('orders.placed.v1', '', '{}');
\echo :SQLSTATE
-- At most 1024 bytes (not characters).
SELECT obx.enqueue('orders.placed.v1', repeat('k', 1024), '{}', aggregate_id => 'boundary')
       IS NOT NULL AS key_1024_ok;
SELECT obx.enqueue('orders.placed.v1', repeat('k', 1025), '{}');
\echo :SQLSTATE
SELECT obx.enqueue('orders.placed.v1', repeat('é', 513), '{}');
\echo :SQLSTATE

-- payload
SELECT obx.enqueue('orders.placed.v1', 'k', NULL);
\echo :SQLSTATE
SELECT obx.enqueue('orders.placed.v1', 'k', 'null');
\echo :SQLSTATE
SELECT obx.enqueue('orders.placed.v1', 'k', '[{"orderId": "ord_1"}]');
\echo :SQLSTATE
SELECT obx.enqueue('orders.placed.v1', 'k', '"OrderPlaced"');
\echo :SQLSTATE
SELECT obx.enqueue('orders.placed.v1', 'k', '42');
\echo :SQLSTATE
SELECT obx.enqueue('orders.placed.v1', 'k', 'true');
\echo :SQLSTATE
-- obx.max_payload_size counts bytes of the JSON text (as jsonb prints it);
-- {"s": "<91 x>"} is exactly 100 bytes.
SET obx.max_payload_size = '100B';
SHOW obx.max_payload_size;
SELECT length(jsonb_build_object('s', repeat('x', 91))::text) AS payload_bytes;
SELECT obx.enqueue('orders.placed.v1', 'k', jsonb_build_object('s', repeat('x', 91)),
                   aggregate_id => 'boundary') IS NOT NULL AS payload_100_ok;
SELECT obx.enqueue('orders.placed.v1', 'k', jsonb_build_object('s', repeat('x', 92)));
\echo :SQLSTATE
-- Headers count toward the limit too: 100 bytes of payload leave no room.
SELECT obx.enqueue('orders.placed.v1', 'k', jsonb_build_object('s', repeat('x', 91)),
                   headers => '{"h": "1"}');
\echo :SQLSTATE
SELECT obx.enqueue('orders.placed.v1', 'k', jsonb_build_object('s', repeat('x', 70)),
                   headers => '{"h": "1"}') IS NOT NULL AS payload_and_headers_ok;
RESET obx.max_payload_size;
SHOW obx.max_payload_size;
SELECT obx.enqueue('orders.placed.v1', 'k', jsonb_build_object('s', repeat('x', 1000000)));
\echo :SQLSTATE

-- headers
SELECT obx.enqueue('orders.placed.v1', 'k', '{}', headers => '["a", "b"]');
\echo :SQLSTATE
SELECT obx.enqueue('orders.placed.v1', 'k', '{}', headers => '"a"');
\echo :SQLSTATE
SELECT obx.enqueue('orders.placed.v1', 'k', '{}', headers => 'null');
\echo :SQLSTATE
SELECT obx.enqueue('orders.placed.v1', 'k', '{}', headers => '{"retries": 3}');
\echo :SQLSTATE
SELECT obx.enqueue('orders.placed.v1', 'k', '{}', headers => '{"ok": "x", "flag": true}');
\echo :SQLSTATE
SELECT obx.enqueue('orders.placed.v1', 'k', '{}', headers => '{"nested": {"a": "b"}}');
\echo :SQLSTATE
SELECT obx.enqueue('orders.placed.v1', 'k', '{}', headers => '{"gone": null}');
\echo :SQLSTATE
SELECT obx.enqueue('orders.placed.v1', 'k', '{}', headers => '{"": "x"}');
\echo :SQLSTATE
SELECT obx.enqueue('orders.placed.v1', 'k', '{}', headers => '{"event_id": "evt_1"}');
\echo :SQLSTATE
SELECT obx.enqueue('orders.placed.v1', 'k', '{}', headers => '{"event_type": "OrderPlaced"}');
\echo :SQLSTATE

-- aggregate_id and event_type: NULL means "not given", empty is an error.
SELECT obx.enqueue('orders.placed.v1', 'k', '{}', aggregate_id => '');
\echo :SQLSTATE
SELECT obx.enqueue('orders.placed.v1', 'k', '{}', event_type => '');
\echo :SQLSTATE

-- None of the failed calls left a row: only the three boundary cases that
-- passed were added.
SELECT count(*) - :events_before_bad_input AS rows_added,
       count(*) FILTER (WHERE aggregate_id = 'boundary') AS boundary_rows
  FROM obx.outbox_events;

--
-- A failed enqueue fails the caller's transaction like any other error:
-- the transaction is aborted and the events it enqueued before are gone.
--
SELECT count(*) AS events_before FROM obx.outbox_events \gset
BEGIN;
SELECT obx.enqueue('orders.placed.v1', 'ord_tx', '{"step": 1}') IS NOT NULL AS enqueued;
SELECT obx.enqueue('orders.placed.v1', 'ord_tx', '[1, 2]');
\echo :SQLSTATE
SELECT obx.enqueue('orders.placed.v1', 'ord_tx', '{"step": 2}');
\echo :SQLSTATE
COMMIT;
SELECT count(*) - :events_before AS rows_added FROM obx.outbox_events;

-- A savepoint contains the failure: the earlier event commits.
BEGIN;
SELECT obx.enqueue('orders.placed.v1', 'ord_sp', '{"step": 1}') IS NOT NULL AS enqueued;
SAVEPOINT s;
SELECT obx.enqueue('orders.nope v1', 'ord_sp', '{"step": 2}');
\echo :SQLSTATE
ROLLBACK TO SAVEPOINT s;
COMMIT;
SELECT count(*) - :events_before AS rows_added FROM obx.outbox_events;
SELECT event_key, payload FROM obx.outbox_events
 WHERE event_key IN ('ord_tx', 'ord_sp') ORDER BY seq;

-- A read-only transaction (or a hot standby) cannot enqueue.
BEGIN READ ONLY;
SELECT obx.enqueue('orders.placed.v1', 'ord_ro', '{}');
\echo :SQLSTATE
ROLLBACK;

-- A rolled-back transaction leaves no event.
BEGIN;
SELECT obx.enqueue('orders.placed.v1', 'ord_rb', '{}') IS NOT NULL AS enqueued;
SELECT count(*) AS visible_inside FROM obx.outbox_events WHERE event_key = 'ord_rb';
ROLLBACK;
SELECT count(*) AS after_rollback FROM obx.outbox_events WHERE event_key = 'ord_rb';
