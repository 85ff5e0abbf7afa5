--
-- obx.enqueue_many: many events of one topic in one call.
--
-- The server runs with test/regress.conf: obx.workers = 0 and
-- obx.topics = 'orders.*, payments.captured.v1'.  Generated ids are never
-- printed, only facts about them.  Every error is followed by its SQLSTATE;
-- the CONTEXT line names the element that failed.
--
\set VERBOSITY default
\set SHOW_CONTEXT errors
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS obx;
RESET client_min_messages;
TRUNCATE obx.events, obx.claims, obx.records, obx.event_states, obx.processed_events;

--
-- Happy path: one id per element, in array order, each row as obx.enqueue
-- would have stored it.
--
SELECT obx.enqueue_many('orders.placed.v1',
                        ARRAY['ord_1', 'ord_2', 'ord_1'],
                        ARRAY['{"n": 1}', '{"n": 2}', '{"n": 3}']::jsonb[]) AS ids \gset
SELECT cardinality(:'ids'::uuid[]) AS n_ids,
       (SELECT count(DISTINCT u) FROM unnest(:'ids'::uuid[]) u) AS distinct_ids,
       (SELECT bool_and(substr(u::text, 15, 1) = '7') FROM unnest(:'ids'::uuid[]) u) AS uuid_v7;
-- The i-th id is the i-th event, and seq grows in array order.
SELECT i, e.event_key, e.aggregate_id, e.payload, e.event_type, e.headers,
       e.published_at IS NULL AS unpublished
  FROM unnest(:'ids'::uuid[]) WITH ORDINALITY AS a(id, i)
  JOIN obx.outbox_events e ON e.id = a.id
 ORDER BY e.seq;
SELECT array_agg(a.i ORDER BY e.seq) = ARRAY[1, 2, 3]::bigint[] AS seq_in_array_order,
       bool_and(e.occurred_at IS NOT NULL) AS has_occurred_at
  FROM unnest(:'ids'::uuid[]) WITH ORDINALITY AS a(id, i)
  JOIN obx.outbox_events e ON e.id = a.id;

-- Every optional array, named notation; NULL elements mean what NULL
-- arguments of obx.enqueue mean (aggregate id = key, no type, no headers,
-- a generated id).
SELECT obx.enqueue_many(topic => 'orders.paid.v1',
                        event_keys => ARRAY['ord_7', 'ord_8', 'ord_9'],
                        payloads => ARRAY['{"a": 1}', '{"b": 2}', '{"c": 3}']::jsonb[],
                        aggregate_ids => ARRAY['order/7', NULL, 'order/9'],
                        event_types => ARRAY['OrderPaid', 'OrderPaid', NULL],
                        headers => ARRAY['{"trace": "t7"}', NULL, '{"trace": "t9"}']::jsonb[],
                        event_ids => ARRAY['00000000-0000-4000-8000-000000000007',
                                           NULL,
                                           '00000000-0000-4000-8000-000000000009']::uuid[])
       AS ids2 \gset
SELECT (:'ids2'::uuid[])[1] AS id1, (:'ids2'::uuid[])[3] AS id3,
       substr((:'ids2'::uuid[])[2]::text, 15, 1) = '7' AS id2_generated;
SELECT event_key, aggregate_id, event_type, headers, payload
  FROM obx.outbox_events WHERE topic = 'orders.paid.v1' ORDER BY seq;

-- Empty arrays: an empty result, nothing inserted.
SELECT obx.enqueue_many('orders.placed.v1', '{}'::text[], '{}'::jsonb[]) AS empty;
SELECT count(*) AS events FROM obx.outbox_events;

-- 1,000 events: all in, in array order.
SELECT cardinality(obx.enqueue_many('orders.bulk.v1',
           array_agg('cus_' || (i % 7) ORDER BY i),
           array_agg(jsonb_build_object('i', i) ORDER BY i))) AS n
  FROM generate_series(1, 1000) i;
SELECT array_agg((payload->>'i')::int ORDER BY seq) = array_agg(i ORDER BY i) AS bulk_in_order
  FROM obx.outbox_events, generate_series(1, 1000) i
 WHERE topic = 'orders.bulk.v1' AND (payload->>'i')::int = i;

--
-- Idempotent re-enqueue: the same ids with the same content are no-ops
-- that return the ids; nothing is inserted twice.
--
SELECT obx.enqueue_many('orders.paid.v1', ARRAY['ord_7', 'ord_9'],
                        ARRAY['{"a": 1}', '{"c": 3}']::jsonb[],
                        aggregate_ids => ARRAY['order/7', 'order/9'],
                        event_types => ARRAY['OrderPaid', NULL],
                        headers => ARRAY['{"trace": "t7"}', '{"trace": "t9"}']::jsonb[],
                        event_ids => ARRAY['00000000-0000-4000-8000-000000000007',
                                           '00000000-0000-4000-8000-000000000009']::uuid[]);
-- Mixed: one known id (a no-op) and a new one (inserted).
SELECT obx.enqueue_many('orders.paid.v1', ARRAY['ord_7', 'ord_10'],
                        ARRAY['{"a": 1}', '{"d": 4}']::jsonb[],
                        aggregate_ids => ARRAY['order/7', NULL],
                        event_types => ARRAY['OrderPaid', NULL],
                        headers => ARRAY['{"trace": "t7"}', NULL]::jsonb[],
                        event_ids => ARRAY['00000000-0000-4000-8000-000000000007',
                                           '00000000-0000-4000-8000-000000000010']::uuid[]);
SELECT event_key, count(*) FROM obx.outbox_events
 WHERE topic = 'orders.paid.v1' GROUP BY event_key ORDER BY event_key;
-- The same id twice in one call with the same content: one event.
SELECT obx.enqueue_many('orders.paid.v1', ARRAY['ord_11', 'ord_11'],
                        ARRAY['{"e": 5}', '{"e": 5}']::jsonb[],
                        event_ids => ARRAY['00000000-0000-4000-8000-000000000011',
                                           '00000000-0000-4000-8000-000000000011']::uuid[]);
SELECT count(*) AS ord_11_events FROM obx.outbox_events WHERE event_key = 'ord_11';
-- Also the same id as one enqueued by obx.enqueue.
SELECT obx.enqueue('orders.paid.v1', 'ord_12', '{"f": 6}',
                   event_id => '00000000-0000-4000-8000-000000000012') IS NOT NULL AS enqueued;
SELECT obx.enqueue_many('orders.paid.v1', ARRAY['ord_12'], ARRAY['{"f": 6}']::jsonb[],
                        event_ids => ARRAY['00000000-0000-4000-8000-000000000012']::uuid[]);

--
-- Errors: the whole call fails, nothing of it is stored, and the context
-- names the element.
--
SELECT count(*) AS before_errors FROM obx.outbox_events \gset
-- A known id with different content (third element).
SELECT obx.enqueue_many('orders.paid.v1', ARRAY['ord_20', 'ord_21', 'ord_7'],
                        ARRAY['{"x": 1}', '{"x": 2}', '{"a": 2}']::jsonb[],
                        event_ids => ARRAY[NULL, NULL,
                                           '00000000-0000-4000-8000-000000000007']::uuid[]);
\echo :SQLSTATE
-- The same id twice in one call with different content (second element).
SELECT obx.enqueue_many('orders.paid.v1', ARRAY['ord_22', 'ord_22'],
                        ARRAY['{"g": 1}', '{"g": 2}']::jsonb[],
                        event_ids => ARRAY['00000000-0000-4000-8000-000000000022',
                                           '00000000-0000-4000-8000-000000000022']::uuid[]);
\echo :SQLSTATE
-- The topic: checked once, as obx.enqueue checks it.
SELECT obx.enqueue_many(NULL, ARRAY['k'], ARRAY['{}']::jsonb[]);
\echo :SQLSTATE
SELECT obx.enqueue_many('inventory.reserved.v1', ARRAY['k'], ARRAY['{}']::jsonb[]);
\echo :SQLSTATE
SELECT obx.enqueue_many('bad topic', ARRAY['k'], ARRAY['{}']::jsonb[]);
\echo :SQLSTATE
SELECT obx.enqueue_many('', '{}'::text[], '{}'::jsonb[]);
\echo :SQLSTATE
-- The arrays: given, one-dimensional, of one length.
SELECT obx.enqueue_many('orders.placed.v1', NULL, ARRAY['{}']::jsonb[]);
\echo :SQLSTATE
SELECT obx.enqueue_many('orders.placed.v1', ARRAY['k'], NULL);
\echo :SQLSTATE
SELECT obx.enqueue_many('orders.placed.v1', ARRAY['k', 'l'], ARRAY['{}']::jsonb[]);
\echo :SQLSTATE
SELECT obx.enqueue_many('orders.placed.v1', ARRAY['k'], ARRAY['{}']::jsonb[],
                        event_types => ARRAY['A', 'B']);
\echo :SQLSTATE
SELECT obx.enqueue_many('orders.placed.v1', ARRAY[['k'], ['l']], ARRAY['{}', '{}']::jsonb[]);
\echo :SQLSTATE
-- Each element as obx.enqueue checks its arguments.
SELECT obx.enqueue_many('orders.placed.v1', ARRAY['k', NULL], ARRAY['{}', '{}']::jsonb[]);
\echo :SQLSTATE
SELECT obx.enqueue_many('orders.placed.v1', ARRAY['k', 'l'], ARRAY['{}', NULL]::jsonb[]);
\echo :SQLSTATE
SELECT obx.enqueue_many('orders.placed.v1', ARRAY['k', 'l', ''], ARRAY['{}', '{}', '{}']::jsonb[]);
\echo :SQLSTATE
SELECT obx.enqueue_many('orders.placed.v1', ARRAY['k', repeat('x', 1025)], ARRAY['{}', '{}']::jsonb[]);
\echo :SQLSTATE
SELECT obx.enqueue_many('orders.placed.v1', ARRAY['k', 'l'], ARRAY['{}', '[1]']::jsonb[]);
\echo :SQLSTATE
SELECT obx.enqueue_many('orders.placed.v1', ARRAY['k', 'l'], ARRAY['{}', '"s"']::jsonb[]);
\echo :SQLSTATE
SET obx.max_payload_size = 100;
SELECT obx.enqueue_many('orders.placed.v1', ARRAY['k', 'l'],
                        ARRAY['{}', jsonb_build_object('big', repeat('x', 200))]);
\echo :SQLSTATE
SELECT obx.enqueue_many('orders.placed.v1', ARRAY['k', 'l'], ARRAY['{}', '{}']::jsonb[],
                        headers => ARRAY[NULL, jsonb_build_object('big', repeat('x', 200))]);
\echo :SQLSTATE
RESET obx.max_payload_size;
SELECT obx.enqueue_many('orders.placed.v1', ARRAY['k', 'l'], ARRAY['{}', '{}']::jsonb[],
                        aggregate_ids => ARRAY[NULL, '']);
\echo :SQLSTATE
SELECT obx.enqueue_many('orders.placed.v1', ARRAY['k', 'l'], ARRAY['{}', '{}']::jsonb[],
                        event_types => ARRAY['', 'T']);
\echo :SQLSTATE
SELECT obx.enqueue_many('orders.placed.v1', ARRAY['k', 'l'], ARRAY['{}', '{}']::jsonb[],
                        headers => ARRAY['{}', '[]']::jsonb[]);
\echo :SQLSTATE
SELECT obx.enqueue_many('orders.placed.v1', ARRAY['k', 'l'], ARRAY['{}', '{}']::jsonb[],
                        headers => ARRAY['{"": "x"}', '{}']::jsonb[]);
\echo :SQLSTATE
SELECT obx.enqueue_many('orders.placed.v1', ARRAY['k', 'l'], ARRAY['{}', '{}']::jsonb[],
                        headers => ARRAY['{}', '{"event_id": "x"}']::jsonb[]);
\echo :SQLSTATE
SELECT obx.enqueue_many('orders.placed.v1', ARRAY['k', 'l'], ARRAY['{}', '{}']::jsonb[],
                        headers => ARRAY['{}', '{"n": 1}']::jsonb[]);
\echo :SQLSTATE
SELECT count(*) = :before_errors AS nothing_stored_by_errors FROM obx.outbox_events;

-- A rolled-back enqueue_many leaves nothing.
BEGIN;
SELECT cardinality(obx.enqueue_many('orders.rollback.v1', ARRAY['k'], ARRAY['{}']::jsonb[])) AS n;
ROLLBACK;
SELECT count(*) AS rolled_back FROM obx.outbox_events WHERE topic = 'orders.rollback.v1';

--
-- Privileges: like obx.enqueue, granted to nobody by default; with
-- EXECUTE an application role may call it (it runs as the extension
-- owner) and still cannot touch the outbox.
--
SET client_min_messages = warning;
DROP ROLE IF EXISTS regress_many_app;
DROP ROLE IF EXISTS regress_many_nobody;
RESET client_min_messages;
CREATE ROLE regress_many_app;
CREATE ROLE regress_many_nobody;
GRANT USAGE ON SCHEMA obx TO regress_many_app, regress_many_nobody;
GRANT EXECUTE ON FUNCTION obx.enqueue_many(text, text[], jsonb[], text[], text[], jsonb[], uuid[])
      TO regress_many_app;
SET ROLE regress_many_nobody;
SELECT obx.enqueue_many('orders.placed.v1', ARRAY['k'], ARRAY['{}']::jsonb[]);
\echo :SQLSTATE
RESET ROLE;
SET ROLE regress_many_app;
SELECT cardinality(obx.enqueue_many('orders.placed.v1', ARRAY['ord_app'],
                                    ARRAY['{"by": "app"}']::jsonb[])) AS n;
SELECT count(*) FROM obx.outbox_events;
\echo :SQLSTATE
RESET ROLE;
SELECT count(*) AS app_events FROM obx.outbox_events WHERE event_key = 'ord_app';
SELECT proname, prosecdef, proconfig FROM pg_proc
 WHERE oid = 'obx.enqueue_many(text, text[], jsonb[], text[], text[], jsonb[], uuid[])'::regprocedure;
SELECT has_function_privilege('public',
           'obx.enqueue_many(text, text[], jsonb[], text[], text[], jsonb[], uuid[])', 'EXECUTE')
       AS public_may_execute;
REVOKE ALL ON SCHEMA obx FROM regress_many_app, regress_many_nobody;
REVOKE ALL ON FUNCTION obx.enqueue_many(text, text[], jsonb[], text[], text[], jsonb[], uuid[])
       FROM regress_many_app;
DROP ROLE regress_many_app;
DROP ROLE regress_many_nobody;
TRUNCATE obx.events, obx.claims, obx.records, obx.event_states;
