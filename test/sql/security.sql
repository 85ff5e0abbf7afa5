--
-- Security of the consumer's SQL surface (docs/security.md): what a
-- subscription's Kafka options may set, who owns a subscription and a
-- consumer name, no direct writes, bad rows reported, who sees error
-- texts and secrets.  No consumer worker runs in this database, so
-- nothing here is consumed; t/08*_sec_*.pl check the workers.
--
\set VERBOSITY default
\set SHOW_CONTEXT never
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS obx;
RESET client_min_messages;
TRUNCATE obx.processed_events, obx.consumer_owners, obx.consumer_partitions;
DELETE FROM obx.subscriptions;

CREATE SCHEMA app;
CREATE FUNCTION app.handle(e obx.inbound_event) RETURNS void LANGUAGE sql AS 'SELECT NULL';
CREATE FUNCTION app.steal(e obx.inbound_event) RETURNS void LANGUAGE sql AS 'SELECT NULL';

-- Two subscribers, a member of bob's role, a monitoring role.  Each
-- subscriber has the documented grants: USAGE on the schema, EXECUTE on
-- subscribe, unsubscribe and mark_processed.  Nothing on the tables.
CREATE ROLE regress_bob;
CREATE ROLE regress_mallory;
CREATE ROLE regress_bob_deputy IN ROLE regress_bob;
CREATE ROLE regress_watch IN ROLE pg_monitor;
GRANT USAGE ON SCHEMA obx, app TO regress_bob, regress_mallory, regress_bob_deputy, regress_watch;
GRANT EXECUTE ON FUNCTION obx.subscribe(text, text[], regprocedure, jsonb),
      obx.unsubscribe(text), obx.mark_processed(text, text)
   TO regress_bob, regress_mallory, regress_bob_deputy;

-- subscribe, unsubscribe and mark_processed run as their caller (C), and
-- pass it to SECURITY DEFINER functions granted to nobody; mark_processed
-- is not SECURITY DEFINER itself.
SELECT p.oid::regprocedure AS function, l.lanname, p.prosecdef, p.proconfig,
       has_function_privilege('regress_mallory', p.oid, 'EXECUTE') AS mallory_may_call
  FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
 WHERE p.pronamespace = 'obx'::regnamespace
   AND p.proname IN ('subscribe', 'unsubscribe', 'mark_processed',
                     '_subscribe', '_unsubscribe', '_mark_processed')
 ORDER BY p.proname COLLATE "C";

--
-- Kafka options: consumer tuning only.  Anyone may read the list.
--
SET ROLE regress_mallory;
SELECT p AS allowed FROM obx.subscription_kafka_properties() p ORDER BY p COLLATE "C";
-- The Kerberos login's kinit command is a shell command.
SELECT obx.subscribe('billing', ARRAY['orders.placed.v1'], 'app.steal(obx.inbound_event)',
       '{"kafka": {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "GSSAPI",
                   "sasl.kerberos.kinit.cmd": "id > /tmp/obx-owned"}}');
\echo :SQLSTATE
-- An alias of bootstrap.servers would send obx.kafka_properties'
-- credentials to a host of the subscriber's choosing.
SELECT obx.subscribe('billing', ARRAY['orders.placed.v1'], 'app.steal(obx.inbound_event)',
       '{"kafka": {"metadata.broker.list": "127.0.0.1:1"}}');
\echo :SQLSTATE
SELECT obx.subscribe('billing', ARRAY['orders.placed.v1'], 'app.steal(obx.inbound_event)',
       '{"kafka": {"bootstrap.servers": "127.0.0.1:1"}}');
\echo :SQLSTATE
-- Code loaded into the server, files read, security turned off, noise.
SELECT obx.subscribe('billing', ARRAY['orders.placed.v1'], 'app.steal(obx.inbound_event)',
       '{"kafka": {"plugin.library.paths": "/tmp/evil.so"}}');
\echo :SQLSTATE
SELECT obx.subscribe('billing', ARRAY['orders.placed.v1'], 'app.steal(obx.inbound_event)',
       '{"kafka": {"ssl.engine.location": "/tmp/evil.so"}}');
\echo :SQLSTATE
SELECT obx.subscribe('billing', ARRAY['orders.placed.v1'], 'app.steal(obx.inbound_event)',
       '{"kafka": {"ssl.ca.location": "/etc/shadow"}}');
\echo :SQLSTATE
SELECT obx.subscribe('billing', ARRAY['orders.placed.v1'], 'app.steal(obx.inbound_event)',
       '{"kafka": {"security.protocol": "PLAINTEXT"}}');
\echo :SQLSTATE
SELECT obx.subscribe('billing', ARRAY['orders.placed.v1'], 'app.steal(obx.inbound_event)',
       '{"kafka": {"debug": "all"}}');
\echo :SQLSTATE
SELECT obx.subscribe('billing', ARRAY['orders.placed.v1'], 'app.steal(obx.inbound_event)',
       '{"kafka": {"enable.auto.commit": "false"}}');
\echo :SQLSTATE
-- Names are exact: no other spelling of an allowed one.
SELECT obx.subscribe('billing', ARRAY['orders.placed.v1'], 'app.steal(obx.inbound_event)',
       '{"kafka": {"Session.Timeout.Ms": "6000"}}');
\echo :SQLSTATE
-- One bad property among good ones is enough.
SELECT obx.subscribe('billing', ARRAY['orders.placed.v1'], 'app.steal(obx.inbound_event)',
       '{"kafka": {"fetch.min.bytes": "1", "sasl.username": "x", "session.timeout.ms": "6000"}}');
\echo :SQLSTATE
-- Fetch and queue sizes: a subscription may lower them below librdkafka's
-- defaults, never raise them (every consumer worker would pre-fetch that
-- much for it), in whatever base librdkafka reads them.
SELECT obx.subscribe('billing', ARRAY['orders.placed.v1'], 'app.steal(obx.inbound_event)',
       '{"kafka": {"queued.max.messages.kbytes": "2097151"}}');
\echo :SQLSTATE
SELECT obx.subscribe('billing', ARRAY['orders.placed.v1'], 'app.steal(obx.inbound_event)',
       '{"kafka": {"fetch.max.bytes": "0x7fffffff"}}');
\echo :SQLSTATE
SELECT obx.subscribe('billing', ARRAY['orders.placed.v1'], 'app.steal(obx.inbound_event)',
       '{"kafka": {"max.partition.fetch.bytes": "1048577"}}');
\echo :SQLSTATE
SELECT obx.subscribe('billing', ARRAY['orders.placed.v1'], 'app.steal(obx.inbound_event)',
       '{"kafka": {"queued.min.messages": "99999999999999999999"}}');
\echo :SQLSTATE
-- A value librdkafka refuses is refused now, not by the workers later.
SELECT obx.subscribe('billing', ARRAY['orders.placed.v1'], 'app.steal(obx.inbound_event)',
       '{"kafka": {"session.timeout.ms": "soon"}}');
\echo :SQLSTATE
RESET ROLE;
-- A superuser gets the same answer: such properties go in obx.kafka_properties.
SELECT obx.subscribe('billing', ARRAY['orders.placed.v1'], 'app.handle(obx.inbound_event)',
       '{"kafka": {"metadata.broker.list": "127.0.0.1:1"}}');
\echo :SQLSTATE
-- None of them left a subscription or claimed the name.
SELECT count(*) AS subscriptions, (SELECT count(*) FROM obx.consumer_owners) AS owned
  FROM obx.subscriptions;

-- Tuning properties are accepted.
SET ROLE regress_bob;
SELECT obx.subscribe('billing', ARRAY['orders.placed.v1'], 'app.handle(obx.inbound_event)',
       '{"kafka": {"fetch.min.bytes": "1", "fetch.wait.max.ms": "100",
                   "session.timeout.ms": "6000", "isolation.level": "read_committed",
                   "auto.offset.reset": "earliest", "max.poll.interval.ms": "600000",
                   "queued.max.messages.kbytes": "1024", "fetch.max.bytes": "10485760"}}');
RESET ROLE;
SELECT consumer_name, handler, owner, options->'kafka' AS kafka FROM obx.subscriptions;
SELECT consumer_name, owner FROM obx.consumer_owners;

--
-- Ownership: another role cannot replace, change, unsubscribe or mark.
--
SET ROLE regress_mallory;
SELECT obx.subscribe('billing', ARRAY['orders.placed.v1'], 'app.steal(obx.inbound_event)');
\echo :SQLSTATE
SELECT obx.subscribe('billing', ARRAY['orders.placed.v1'], 'app.handle(obx.inbound_event)',
       '{"start": "latest"}');
\echo :SQLSTATE
SELECT obx.unsubscribe('billing');
\echo :SQLSTATE
SELECT obx.mark_processed('billing', 'evt-1');
\echo :SQLSTATE
-- No direct writes either, and no reading.
INSERT INTO obx.subscriptions (consumer_name, topics, handler, owner)
VALUES ('sneaky', ARRAY['orders.placed.v1'], 'app.steal(obx.inbound_event)', 'regress_mallory');
\echo :SQLSTATE
UPDATE obx.subscriptions SET handler = 'app.steal(obx.inbound_event)';
\echo :SQLSTATE
DELETE FROM obx.subscriptions;
\echo :SQLSTATE
UPDATE obx.consumer_owners SET owner = 'regress_mallory';
\echo :SQLSTATE
INSERT INTO obx.processed_events VALUES ('billing', 'evt-1');
\echo :SQLSTATE
SELECT count(*) FROM obx.subscriptions;
\echo :SQLSTATE
-- Nor calling the functions behind subscribe and mark_processed, which
-- take the caller as an argument.
SELECT obx._subscribe('regress_bob'::regrole, 'billing', ARRAY['orders.placed.v1'],
       'app.steal(obx.inbound_event)', '{}');
\echo :SQLSTATE
SELECT obx._mark_processed('regress_bob'::regrole, 'billing', 'evt-1');
\echo :SQLSTATE
SELECT obx._unsubscribe('regress_bob'::regrole, 'billing');
\echo :SQLSTATE
RESET ROLE;
-- Still bob's, unchanged, and nothing marked.
SELECT consumer_name, handler, owner, options->>'start' AS start FROM obx.subscriptions;
SELECT count(*) AS marked FROM obx.processed_events;

-- A member of the owner role acts for it; the subscription stays bob's.
SET ROLE regress_bob_deputy;
SELECT obx.subscribe('billing', ARRAY['orders.placed.v1', 'payments.captured.v1'],
                     'app.handle(obx.inbound_event)');
SELECT obx.mark_processed('billing', 'evt-1') AS first;
SELECT obx.mark_processed('billing', 'evt-1') AS duplicate;
RESET ROLE;
SELECT consumer_name, topics, owner FROM obx.subscriptions;

-- The handler must be one the owner may execute.
REVOKE EXECUTE ON FUNCTION app.steal(obx.inbound_event) FROM PUBLIC;
SET ROLE regress_bob;
SELECT obx.subscribe('billing', ARRAY['orders.placed.v1'], 'app.steal(obx.inbound_event)');
\echo :SQLSTATE
-- The owner unsubscribes; the name stays bob's (its dedupe history stays).
SELECT obx.unsubscribe('billing') AS existed;
RESET ROLE;
SET ROLE regress_mallory;
SELECT obx.subscribe('billing', ARRAY['orders.placed.v1'], 'app.handle(obx.inbound_event)');
\echo :SQLSTATE
SELECT obx.mark_processed('billing', 'evt-2');
\echo :SQLSTATE
RESET ROLE;
SELECT consumer_name, owner FROM obx.consumer_owners ORDER BY consumer_name COLLATE "C";

-- A hand-written consumer needs no setup: the first role to mark events
-- for a name claims it.  A superuser's marks claim nothing.
SELECT obx.mark_processed('reports', 'evt-1') AS by_superuser;
SELECT count(*) AS owned FROM obx.consumer_owners WHERE consumer_name = 'reports';
SET ROLE regress_mallory;
SELECT obx.mark_processed('reports', 'evt-2') AS claimed;
SELECT obx.mark_processed('reports', 'evt-2') AS duplicate;
RESET ROLE;
SET ROLE regress_bob;
SELECT obx.mark_processed('reports', 'evt-3');
\echo :SQLSTATE
SELECT obx.subscribe('reports', ARRAY['orders.placed.v1'], 'app.handle(obx.inbound_event)');
\echo :SQLSTATE
RESET ROLE;
SELECT consumer_name, owner FROM obx.consumer_owners ORDER BY consumer_name COLLATE "C";
SELECT consumer_name, event_id FROM obx.processed_events
 ORDER BY consumer_name COLLATE "C", event_id COLLATE "C";

--
-- Bad rows written directly by a superuser: obx.consumers says what is
-- wrong with each (the consumer workers skip them, and go on with the
-- others).
--
CREATE ROLE regress_gone;
INSERT INTO obx.subscriptions (consumer_name, topics, handler, options, owner) VALUES
  ('bad-retry', ARRAY['orders.placed.v1'], 'app.handle(obx.inbound_event)',
   '{"retry_sqlstates": {"a": 1}}', 'regress_bob'),
  ('bad-kafka', ARRAY['orders.placed.v1'], 'app.handle(obx.inbound_event)',
   '{"kafka": {"sasl.kerberos.kinit.cmd": "touch /tmp/obx-owned"}}', 'regress_bob'),
  ('big-queue', ARRAY['orders.placed.v1'], 'app.handle(obx.inbound_event)',
   '{"kafka": {"queued.max.messages.kbytes": "2000000"}}', 'regress_bob'),
  ('bad-topic', ARRAY['no such topic!'], 'app.handle(obx.inbound_event)', '{}', 'regress_bob'),
  ('bad-options', ARRAY['orders.placed.v1'], 'app.handle(obx.inbound_event)', '[1]', 'regress_bob'),
  ('orphan', ARRAY['orders.placed.v1'], 'app.handle(obx.inbound_event)', '{}', 'regress_gone'),
  ('fine', ARRAY['orders.placed.v1'], 'app.handle(obx.inbound_event)', '{}', 'regress_bob');
DROP ROLE regress_gone;
SELECT consumer_name, regexp_replace(problem, 'OID [0-9]+', 'OID N') AS problem
  FROM obx.consumers ORDER BY consumer_name COLLATE "C";
-- Only a superuser may act for a subscription whose owner is gone.
SET ROLE regress_mallory;
SELECT obx.unsubscribe('orphan');
\echo :SQLSTATE
RESET ROLE;
SELECT obx.unsubscribe('orphan') AS by_superuser;

--
-- A subscription names its handler by schema, name and argument type (so
-- that pg_upgrade keeps it), and serves it only while the function belongs
-- to the role that owned it when subscribed: a role that may create
-- functions in the handler's schema cannot put its own in place of a
-- dropped handler and have it run as the subscription's owner.
--
CREATE SCHEMA shared_fns;
GRANT USAGE, CREATE ON SCHEMA shared_fns TO regress_mallory;
CREATE FUNCTION shared_fns.on_order(e obx.inbound_event) RETURNS void
LANGUAGE sql AS 'SELECT NULL';
-- The name is stored schema-qualified, whatever the search_path.
SET search_path = shared_fns, public;
SELECT obx.subscribe('swapped', ARRAY['orders.placed.v1'], 'on_order(obx.inbound_event)');
RESET search_path;
SELECT s.handler, s.handler_owner = current_user::regrole AS owned_by_subscriber,
       c.problem
  FROM obx.subscriptions s JOIN obx.consumers c USING (consumer_name)
 WHERE consumer_name = 'swapped';
-- Renamed: no longer found.
ALTER FUNCTION shared_fns.on_order(obx.inbound_event) RENAME TO on_order_v2;
SELECT problem FROM obx.consumers WHERE consumer_name = 'swapped';
ALTER FUNCTION shared_fns.on_order_v2(obx.inbound_event) RENAME TO on_order;
SELECT problem FROM obx.consumers WHERE consumer_name = 'swapped';
-- Dropped, and re-created by another role: not the handler.
DROP FUNCTION shared_fns.on_order(obx.inbound_event);
SET ROLE regress_mallory;
CREATE FUNCTION shared_fns.on_order(e obx.inbound_event) RETURNS void
LANGUAGE sql AS 'SELECT NULL';
RESET ROLE;
SELECT problem FROM obx.consumers WHERE consumer_name = 'swapped';
SELECT obx._handler(s) IS NULL AS not_served FROM obx.subscriptions s
 WHERE consumer_name = 'swapped';
-- A write that leaves the handler alone does not adopt the new function.
UPDATE obx.subscriptions SET options = '{"start": "latest"}' WHERE consumer_name = 'swapped';
SELECT problem FROM obx.consumers WHERE consumer_name = 'swapped';
-- Subscribing again names it deliberately: then it is served.
SELECT obx.subscribe('swapped', ARRAY['orders.placed.v1'], 'shared_fns.on_order(obx.inbound_event)');
SELECT s.handler_owner::text AS handler_owner, c.problem
  FROM obx.subscriptions s JOIN obx.consumers c USING (consumer_name)
 WHERE consumer_name = 'swapped';
SELECT obx.unsubscribe('swapped');
DROP SCHEMA shared_fns CASCADE;

--
-- Error texts: only pg_monitor members, superusers and the consumer's
-- owner (and its members) see them; other readers of the views get NULL.
--
INSERT INTO obx.consumer_partitions (consumer_name, topic, kafka_partition,
       last_error_class, last_error, last_error_at)
VALUES ('fine', 'orders.placed.v1', 0, 'handler', 'P0001: card 4111-1111 declined', now());
GRANT SELECT ON obx.consumer_status, obx.consumers
   TO regress_bob, regress_mallory, regress_bob_deputy, regress_watch;
SET ROLE regress_mallory;
SELECT consumer_name, last_error_class, last_error FROM obx.consumer_status;
SELECT consumer_name, last_error FROM obx.consumers WHERE consumer_name = 'fine';
RESET ROLE;
SET ROLE regress_bob_deputy;
SELECT consumer_name, last_error_class, last_error FROM obx.consumer_status;
RESET ROLE;
SET ROLE regress_watch;
SELECT consumer_name, last_error FROM obx.consumers WHERE consumer_name = 'fine';
RESET ROLE;

--
-- Settings that hold or point at secrets are a superuser's.
--
SET ROLE regress_mallory;
-- The server words this denial differently across majors: its SQLSTATE counts.
\set VERBOSITY sqlstate
SHOW obx.kafka_properties;
\echo :SQLSTATE
SHOW obx.kafka_properties_file;
\echo :SQLSTATE
\set VERBOSITY default
SELECT name FROM pg_settings WHERE name LIKE 'obx.kafka%';
RESET ROLE;
SELECT current_setting('obx.kafka_properties_file') AS properties_file;
SHOW obx.dead_letter_retention;

-- Clean up.
DELETE FROM obx.subscriptions;
TRUNCATE obx.processed_events, obx.consumer_owners, obx.consumer_partitions;
SET client_min_messages = warning;
DROP SCHEMA app CASCADE;
RESET client_min_messages;
DROP OWNED BY regress_bob, regress_mallory, regress_bob_deputy, regress_watch;
DROP ROLE regress_bob_deputy, regress_bob, regress_mallory, regress_watch;
