--
-- Privileges.  obx grants nothing to PUBLIC; each kind of user gets what
-- its job needs, as obx--1.0.sql describes:
--   application  USAGE on schema obx, EXECUTE on obx.enqueue
--   consumer     USAGE on schema obx, EXECUTE on obx.mark_processed
--   monitoring   USAGE on schema obx, SELECT on the views
--   operator     USAGE on schema obx, EXECUTE on retry / replay
-- enqueue and mark_processed run as the extension owner, so their callers
-- need no privilege on the tables.
--
\set VERBOSITY default
\set SHOW_CONTEXT never
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS obx;
RESET client_min_messages;
TRUNCATE obx.events, obx.claims, obx.records, obx.published_counts, obx.event_states,
	obx.processed_events;

CREATE ROLE regress_app;
CREATE ROLE regress_consumer;
CREATE ROLE regress_nobody;
CREATE ROLE regress_monitor;
CREATE ROLE regress_operator;

-- Out of the box a role can use nothing of obx.  (Not listed: the helpers
-- obx.worker_status, behind the obx.workers view, and obx._wake_at_commit,
-- called by retry and replay.)
SELECT has_schema_privilege('regress_nobody', 'obx', 'USAGE') AS schema_usage;
SELECT p.oid::regprocedure AS function,
       has_function_privilege('regress_nobody', p.oid, 'EXECUTE') AS can_execute
  FROM pg_proc p WHERE p.pronamespace = 'obx'::regnamespace
   AND p.proname NOT IN ('worker_status', '_wake_at_commit')
 ORDER BY p.oid::regprocedure::text COLLATE "C";
SELECT c.relname, c.relkind,
       has_table_privilege('regress_nobody', c.oid, 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE')
       OR (c.relkind = 'S' AND has_sequence_privilege('regress_nobody', c.oid, 'USAGE, UPDATE'))
       AS any_privilege
  FROM pg_class c WHERE c.relnamespace = 'obx'::regnamespace AND c.relkind IN ('r', 'v', 'S')
 ORDER BY c.relname COLLATE "C";

--
-- nobody: no grants at all.
--
SET ROLE regress_nobody;
SELECT obx.enqueue('orders.placed.v1', 'ord_1', '{}');
\echo :SQLSTATE
SELECT obx.mark_processed('billing', 'evt_1');
\echo :SQLSTATE
SELECT * FROM obx.status;
\echo :SQLSTATE
RESET ROLE;
-- USAGE on the schema alone still allows nothing.
GRANT USAGE ON SCHEMA obx TO regress_nobody;
SET ROLE regress_nobody;
SELECT obx.enqueue('orders.placed.v1', 'ord_1', '{}');
\echo :SQLSTATE
SELECT obx.mark_processed('billing', 'evt_1');
\echo :SQLSTATE
SELECT count(*) FROM obx.outbox_events;
\echo :SQLSTATE
RESET ROLE;
REVOKE USAGE ON SCHEMA obx FROM regress_nobody;
SELECT count(*) AS events, (SELECT count(*) FROM obx.processed_events) AS marks
  FROM obx.outbox_events;

--
-- The application: may enqueue, and nothing else.
--
GRANT USAGE ON SCHEMA obx TO regress_app;
GRANT EXECUTE ON FUNCTION obx.enqueue(text, text, jsonb, text, text, jsonb, uuid) TO regress_app;
SET ROLE regress_app;
CREATE TEMP TABLE orders (id text PRIMARY KEY, total_minor bigint);
BEGIN;
INSERT INTO orders VALUES ('ord_782', 12900);
SELECT obx.enqueue('orders.placed.v1', 'ord_782',
                   '{"eventType": "OrderPlaced", "orderId": "ord_782", "totalMinor": 12900}',
                   event_type => 'OrderPlaced') IS NOT NULL AS enqueued;
COMMIT;
SELECT obx.enqueue('orders.placed.v1', 'ord_783', '{"orderId": "ord_783"}',
                   event_id => '00000000-0000-4000-8000-000000000501');
-- An explicit id again with the same content: the same no-op as for a superuser.
SELECT obx.enqueue('orders.placed.v1', 'ord_783', '{"orderId": "ord_783"}',
                   event_id => '00000000-0000-4000-8000-000000000501');
-- Validation applies as for anyone.
SELECT obx.enqueue('inventory.reserved.v1', 'ord_783', '{}');
\echo :SQLSTATE
SELECT obx.enqueue('orders.placed.v1', '', '{}');
\echo :SQLSTATE
-- The outbox itself is out of reach: no reading, changing or bypassing
-- enqueue's checks.
SELECT count(*) FROM obx.outbox_events;
\echo :SQLSTATE
SELECT count(*) FROM obx.events;
\echo :SQLSTATE
UPDATE obx.events SET occurred_at = now();
\echo :SQLSTATE
DELETE FROM obx.events;
\echo :SQLSTATE
INSERT INTO obx.events (id, aggregate_id, topic, event_key, payload)
VALUES (gen_random_uuid(), 'x', 'not allowed!', '', '[]');
\echo :SQLSTATE
INSERT INTO obx.records (lease_id, max_seq, ids, partitions, offsets, published_at)
VALUES (1, 1, '{}', '{}', '{}', '{}');
\echo :SQLSTATE
TRUNCATE obx.events, obx.claims, obx.records, obx.event_states;
\echo :SQLSTATE
SELECT nextval('obx.event_seq');
\echo :SQLSTATE
SELECT count(*) FROM obx.processed_events;
\echo :SQLSTATE
-- Nor the operator functions, the views or the inbox.
SELECT obx.retry('00000000-0000-4000-8000-000000000501');
\echo :SQLSTATE
SELECT obx.retry_quarantined();
\echo :SQLSTATE
SELECT obx.replay(ARRAY['00000000-0000-4000-8000-000000000501']::uuid[]);
\echo :SQLSTATE
SELECT obx.replay('orders.placed.v1', '-infinity');
\echo :SQLSTATE
SELECT obx.mark_processed('billing', 'evt_1');
\echo :SQLSTATE
SELECT * FROM obx.status;
\echo :SQLSTATE
SELECT * FROM obx.quarantine;
\echo :SQLSTATE
SELECT * FROM obx.workers;
\echo :SQLSTATE
-- (extension only: the rights on obx's settings)
-- Server-side limits are not the application's to change.
SET obx.max_payload_size = '2MB';
\echo :SQLSTATE
SHOW obx.max_payload_size;
-- The server words this denial differently across majors: its SQLSTATE counts.
\set VERBOSITY sqlstate
SHOW obx.kafka_properties;
\echo :SQLSTATE
\set VERBOSITY default
-- (end extension only)
RESET ROLE;

--
-- enqueue runs as the extension owner: the caller's search_path must not
-- reach into it.  Here the application shadows the type name "text" with a
-- type of its own in pg_temp (searched first by default) and a cast whose
-- function would then run with the owner's rights.  enqueue must ignore
-- them: no NOTICE, and the repeated id is the usual no-op.  A new session,
-- so that enqueue plans its statements with these objects in place.
--
\c
SET ROLE regress_app;
CREATE TYPE pg_temp.text AS ENUM ('', '{"orderId": "ord_783"}');
CREATE FUNCTION pg_temp.hijack(j jsonb) RETURNS pg_temp.text
LANGUAGE plpgsql AS $$
BEGIN
	RAISE NOTICE 'caller-supplied cast runs as %', current_user;
	RETURN '';
END
$$;
CREATE CAST (jsonb AS pg_temp.text) WITH FUNCTION pg_temp.hijack(jsonb);
SELECT obx.enqueue('orders.placed.v1', 'ord_783', '{"orderId": "ord_783"}',
                   event_id => '00000000-0000-4000-8000-000000000501');
\echo :SQLSTATE
DROP CAST (jsonb AS pg_temp.text);
DROP FUNCTION pg_temp.hijack(jsonb);
DROP TYPE pg_temp.text;
\c

SELECT event_key, event_type, payload FROM obx.outbox_events ORDER BY seq;

--
-- The consumer: may mark events processed, and read nothing.
--
GRANT USAGE ON SCHEMA obx TO regress_consumer;
GRANT EXECUTE ON FUNCTION obx.mark_processed(text, text) TO regress_consumer;
SET ROLE regress_consumer;
SELECT obx.mark_processed('inventory-reservation', '00000000-0000-4000-8000-000000000501') AS first;
SELECT obx.mark_processed('inventory-reservation', '00000000-0000-4000-8000-000000000501') AS duplicate;
BEGIN;
SELECT obx.mark_processed('inventory-reservation', 'evt_rolled_back') AS first_in_tx;
ROLLBACK;
SELECT obx.mark_processed('inventory-reservation', 'evt_rolled_back') AS after_rollback;
SELECT obx.mark_processed('inventory-reservation', '') AS empty;
\echo :SQLSTATE
SELECT count(*) FROM obx.processed_events;
\echo :SQLSTATE
DELETE FROM obx.processed_events;
\echo :SQLSTATE
SELECT count(*) FROM obx.outbox_events;
\echo :SQLSTATE
SELECT obx.enqueue('orders.placed.v1', 'ord_1', '{}');
\echo :SQLSTATE
RESET ROLE;
SELECT consumer_name, event_id FROM obx.processed_events ORDER BY event_id COLLATE "C";

--
-- Monitoring: SELECT on the views, nothing else.
--
GRANT USAGE ON SCHEMA obx TO regress_monitor;
GRANT SELECT ON obx.status, obx.quarantine, obx.workers TO regress_monitor;
-- Quarantined, the way the relay records it (docs/internals.md).
SELECT obx._hold(ARRAY['00000000-0000-4000-8000-000000000501']::uuid[]);
UPDATE obx.event_states SET quarantined_at = now(), attempts = 1,
       last_error = 'Broker: Message size too large', last_error_class = 'permanent',
       last_error_at = now()
 WHERE id = '00000000-0000-4000-8000-000000000501';
SET ROLE regress_monitor;
SELECT topic, pending, leased, published, quarantined, failing, last_error FROM obx.status;
SELECT id, topic, event_key, last_error_class FROM obx.quarantine;
SELECT count(*) AS workers FROM obx.workers;
\echo :SQLSTATE
SELECT count(*) FROM obx.outbox_events;
\echo :SQLSTATE
SELECT obx.retry('00000000-0000-4000-8000-000000000501');
\echo :SQLSTATE
RESET ROLE;

--
-- An operator: retry and replay.  The operator here also holds SELECT on
-- the outbox and UPDATE on the events' states, so retry and replay must
-- work for it whether they run as their caller or as their owner.
--
GRANT USAGE ON SCHEMA obx TO regress_operator;
GRANT EXECUTE ON FUNCTION obx.retry(uuid), obx.retry_quarantined(text),
      obx.replay(uuid[]), obx.replay(text, timestamptz, timestamptz) TO regress_operator;
GRANT SELECT ON obx.outbox_events TO regress_operator;
GRANT SELECT, UPDATE ON obx.event_states TO regress_operator;
GRANT SELECT ON obx.status, obx.quarantine TO regress_operator;
SET ROLE regress_operator;
SELECT id FROM obx.quarantine;
SELECT obx.retry('00000000-0000-4000-8000-000000000501') AS retried;
\echo :SQLSTATE
SELECT count(*) AS quarantined FROM obx.quarantine;
RESET ROLE;
-- Published, as the relay records it: a record, and the held event's state.
INSERT INTO obx.records (lease_id, max_seq, ids, partitions, offsets, published_at)
SELECT nextval('obx.lease_seq'), max(seq), array_agg(id), array_agg(0), array_agg(1::bigint),
       array_agg(now())
  FROM obx.events WHERE event_key IN ('ord_782', 'ord_783');
UPDATE obx.event_states SET published_at = now(), quarantined_at = NULL
 WHERE id = '00000000-0000-4000-8000-000000000501';
SET ROLE regress_operator;
SELECT obx.replay(ARRAY['00000000-0000-4000-8000-000000000501']::uuid[]) AS replayed;
\echo :SQLSTATE
SELECT obx.replay('orders.placed.v1', '-infinity') AS replayed_topic;
\echo :SQLSTATE
SELECT count(*) FILTER (WHERE published_at IS NULL) AS unpublished, count(*) AS total
  FROM obx.outbox_events;
-- An operator is not an application.
SELECT obx.enqueue('orders.placed.v1', 'ord_1', '{}');
\echo :SQLSTATE
RESET ROLE;

-- Who may do what, in one table.
SELECT r.rolname,
       has_function_privilege(r.oid, 'obx.enqueue(text, text, jsonb, text, text, jsonb, uuid)', 'EXECUTE') AS enqueue,
       has_function_privilege(r.oid, 'obx.mark_processed(text, text)', 'EXECUTE') AS mark_processed,
       has_function_privilege(r.oid, 'obx.retry(uuid)', 'EXECUTE') AS retry,
       has_function_privilege(r.oid, 'obx.replay(uuid[])', 'EXECUTE') AS replay,
       has_table_privilege(r.oid, 'obx.status', 'SELECT') AS status,
       has_table_privilege(r.oid, 'obx.outbox_events', 'SELECT') AS read_outbox,
       has_table_privilege(r.oid, 'obx.events', 'INSERT') AS insert_outbox,
       has_table_privilege(r.oid, 'obx.processed_events', 'SELECT') AS read_inbox
  FROM pg_roles r WHERE r.rolname LIKE 'regress\_%'
 ORDER BY r.rolname COLLATE "C";

-- Roles are cluster-wide: remove them and their grants.
DROP OWNED BY regress_app, regress_consumer, regress_nobody, regress_monitor, regress_operator;
DROP ROLE regress_app, regress_consumer, regress_nobody, regress_monitor, regress_operator;

-- The workers' role (docs/security.md, "The workers"): not a superuser,
-- cannot log in, and holds exactly these grants, nothing outside obx.
SELECT rolsuper, rolcanlogin, rolcreaterole, rolcreatedb, rolreplication, rolbypassrls
  FROM pg_roles WHERE rolname = 'obx_worker';
SELECT c.oid::regclass AS relation,
       string_agg(a.privilege_type, ', ' ORDER BY a.privilege_type) AS privileges
  FROM pg_class c, aclexplode(c.relacl) a
 WHERE a.grantee = 'obx_worker'::regrole
 GROUP BY c.oid
 ORDER BY c.oid::regclass::text COLLATE "C";
SELECT p.oid::regprocedure AS function, p.prosecdef AS security_definer
  FROM pg_proc p, aclexplode(p.proacl) a
 WHERE a.grantee = 'obx_worker'::regrole
 ORDER BY p.oid::regprocedure::text COLLATE "C";
SELECT n.nspname, a.privilege_type
  FROM pg_namespace n, aclexplode(n.nspacl) a
 WHERE a.grantee = 'obx_worker'::regrole;
