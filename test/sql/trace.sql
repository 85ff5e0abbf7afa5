--
-- W3C trace context at enqueue: obx.traceparent / obx.tracestate or a
-- traceparent in the headers argument, validated and stored in the
-- event's headers (which the relay sends as Kafka headers).
--
\set VERBOSITY default
\set SHOW_CONTEXT never
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS obx;
RESET client_min_messages;
TRUNCATE obx.events, obx.claims, obx.records, obx.event_states;

-- No trace context: headers stay as given (NULL).
SELECT obx.enqueue('orders.trace.v1', 'k0', '{"n": 0}') AS id0 \gset
SELECT headers FROM obx.outbox_events WHERE id = :'id0';

-- From the settings, in the caller's transaction; merged with the headers.
BEGIN;
SET LOCAL obx.traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
SET LOCAL obx.tracestate = 'congo=t61rcWkgMzE,rojo=00f067aa0ba902b7';
SELECT obx.enqueue('orders.trace.v1', 'k1', '{"n": 1}', headers => '{"tenant": "acme"}') AS id1 \gset
SELECT obx.enqueue('orders.trace.v1', 'k1', '{"n": 2}') AS id2 \gset
COMMIT;
SELECT headers FROM obx.outbox_events WHERE id = :'id1';
SELECT headers FROM obx.outbox_events WHERE id = :'id2';
SHOW obx.traceparent;

-- The headers argument wins over the settings, tracestate included.
BEGIN;
SET LOCAL obx.traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
SET LOCAL obx.tracestate = 'congo=t61rcWkgMzE';
SELECT obx.enqueue('orders.trace.v1', 'k2', '{"n": 3}',
       headers => '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"}') AS id3 \gset
COMMIT;
SELECT headers FROM obx.outbox_events WHERE id = :'id3';

-- A later version with more fields is accepted (the specification's rule).
SELECT obx.enqueue('orders.trace.v1', 'k2', '{"n": 4}',
       headers => '{"traceparent": "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00-extra"}') IS NOT NULL AS later_version;

-- Malformed values: an error at enqueue, and nothing is stored.
SELECT count(*) AS before FROM obx.outbox_events \gset
SELECT obx.enqueue('orders.trace.v1', 'k3', '{}', headers => '{"traceparent": "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"}');
\echo :SQLSTATE
SELECT obx.enqueue('orders.trace.v1', 'k3', '{}', headers => '{"traceparent": "00-00000000000000000000000000000000-00f067aa0ba902b7-01"}');
SELECT obx.enqueue('orders.trace.v1', 'k3', '{}', headers => '{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"}');
SELECT obx.enqueue('orders.trace.v1', 'k3', '{}', headers => '{"traceparent": "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}');
SELECT obx.enqueue('orders.trace.v1', 'k3', '{}', headers => '{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"}');
SELECT obx.enqueue('orders.trace.v1', 'k3', '{}', headers => '{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x"}');
SELECT obx.enqueue('orders.trace.v1', 'k3', '{}', headers => '{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01"}');
SELECT obx.enqueue('orders.trace.v1', 'k3', '{}', headers => '{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g"}');
SELECT obx.enqueue('orders.trace.v1', 'k3', '{}', headers => '{"tracestate": "congo=t61rcWkgMzE"}');
BEGIN;
SET LOCAL obx.traceparent = 'not-a-traceparent';
SELECT obx.enqueue('orders.trace.v1', 'k3', '{}');
ROLLBACK;
BEGIN;
SET LOCAL obx.tracestate = 'congo=t61rcWkgMzE';
SELECT obx.enqueue('orders.trace.v1', 'k3', '{}');
\echo :SQLSTATE
ROLLBACK;
BEGIN;
SET LOCAL obx.traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
SET LOCAL obx.tracestate = E'congo=\x01';
SELECT obx.enqueue('orders.trace.v1', 'k3', '{}');
ROLLBACK;
SELECT count(*) = :before AS nothing_stored FROM obx.outbox_events;

-- A retried enqueue with the same id and the same trace is a no-op.
BEGIN;
SET LOCAL obx.traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
SELECT obx.enqueue('orders.trace.v1', 'k4', '{"n": 5}', event_id => 'b1f0c7e2-0000-4000-8000-000000000001') IS NOT NULL AS first;
SELECT obx.enqueue('orders.trace.v1', 'k4', '{"n": 5}', event_id => 'b1f0c7e2-0000-4000-8000-000000000001') IS NOT NULL AS retried;
COMMIT;

-- obx.enqueue_many: the trace context goes into every element's headers;
-- an element's own traceparent wins, and a malformed one names its element.
BEGIN;
SET LOCAL obx.traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
SELECT cardinality(obx.enqueue_many('orders.trace.v1', ARRAY['m1', 'm2'], ARRAY['{"n": 1}', '{"n": 2}']::jsonb[],
       headers => ARRAY[NULL, '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "x": "y"}']::jsonb[])) AS enqueued;
SELECT event_key, headers FROM obx.outbox_events WHERE event_key IN ('m1', 'm2') ORDER BY seq;
COMMIT;
SELECT obx.enqueue_many('orders.trace.v1', ARRAY['m3', 'm4'], ARRAY['{}', '{}']::jsonb[],
       headers => ARRAY[NULL, '{"traceparent": "00-abc-def-01"}']::jsonb[]);

TRUNCATE obx.events, obx.claims, obx.records, obx.event_states;
