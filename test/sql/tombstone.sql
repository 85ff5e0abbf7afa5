--
-- obx.enqueue_tombstone: the key with a null value, stored as an event
-- whose payload is NULL, in seq order with the key's other events.
--
\set VERBOSITY default
\set SHOW_CONTEXT never
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS obx;
RESET client_min_messages;
TRUNCATE obx.events, obx.claims, obx.records, obx.event_states;

SELECT obx.enqueue('orders.compacted.v1', 'ord_1', '{"n": 1}') AS e1 \gset
SELECT obx.enqueue_tombstone('orders.compacted.v1', 'ord_1') AS t1 \gset
SELECT obx.enqueue('orders.compacted.v1', 'ord_1', '{"n": 2}') AS e2 \gset
SELECT id = :'t1' AS is_tombstone, payload, aggregate_id, event_type
  FROM obx.outbox_events ORDER BY seq;

-- The other arguments are obx.enqueue's, checked the same way.
SELECT obx.enqueue_tombstone('orders.compacted.v1', 'ord_2', aggregate_id => 'order/2',
       event_type => 'OrderDeleted', headers => '{"reason": "gdpr"}') AS t2 \gset
SELECT aggregate_id, event_type, headers, payload IS NULL AS no_payload
  FROM obx.outbox_events WHERE id = :'t2';
SELECT obx.enqueue_tombstone('not.allowed', 'k');
\echo :SQLSTATE
SELECT obx.enqueue_tombstone('orders.compacted.v1', '');
SELECT obx.enqueue_tombstone('orders.compacted.v1', NULL);
SELECT obx.enqueue_tombstone('orders.compacted.v1', 'k', headers => '{"event_id": "x"}');
BEGIN;
SET LOCAL obx.traceparent = 'bad';
SELECT obx.enqueue_tombstone('orders.compacted.v1', 'k');
ROLLBACK;

-- obx.enqueue still refuses a null payload, and points to the tombstone.
SELECT obx.enqueue('orders.compacted.v1', 'ord_1', NULL);
\echo :SQLSTATE

-- A repeated id: a no-op for the same tombstone, an error otherwise.
SELECT obx.enqueue_tombstone('orders.compacted.v1', 'ord_3',
       event_id => 'c0ffee00-0000-4000-8000-000000000001') AS r1;
SELECT obx.enqueue_tombstone('orders.compacted.v1', 'ord_3',
       event_id => 'c0ffee00-0000-4000-8000-000000000001') AS r2;
SELECT obx.enqueue_tombstone('orders.compacted.v1', 'ord_4',
       event_id => 'c0ffee00-0000-4000-8000-000000000001');
SELECT obx.enqueue('orders.compacted.v1', 'ord_3', '{}',
       event_id => 'c0ffee00-0000-4000-8000-000000000001');
SELECT count(*) AS copies FROM obx.outbox_events
 WHERE id = 'c0ffee00-0000-4000-8000-000000000001';

TRUNCATE obx.events, obx.claims, obx.records, obx.event_states;
