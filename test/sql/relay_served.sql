--
-- No silent dead end: CREATE EXTENSION and the first obx.enqueue of a
-- session warn when no relay of this server publishes the database's
-- outbox; obx.status says so in its problem column; obx.workers names the
-- database its workers serve.  The warning never fails the statement: the
-- event is stored and goes out once a relay serves the database.
--
-- test/regress.conf preloads obx with obx.workers = 0 (no relay at all)
-- and turns the warning off for the other tests.
--
\set VERBOSITY default
\set SHOW_CONTEXT never
SELECT current_database() AS home \gset
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS obx;
SHOW shared_preload_libraries;
SHOW obx.workers;
SHOW obx.database;

SET obx.warn_without_relay = on;
-- The first enqueue of the session warns, and stores the event.
SELECT obx.enqueue('orders.served.v1', 'k1', '{"n": 1}') IS NOT NULL AS stored;
-- The second does not warn again.
SELECT obx.enqueue('orders.served.v1', 'k1', '{"n": 2}') IS NOT NULL AS stored;
SELECT count(*) AS kept FROM obx.outbox_events WHERE topic = 'orders.served.v1';
SELECT topic, pending, problem FROM obx.status WHERE topic = 'orders.served.v1';
-- obx.workers has a database column (no workers here).
SELECT attname FROM pg_attribute
 WHERE attrelid = 'obx.workers'::regclass AND attnum BETWEEN 1 AND 3 ORDER BY attnum;

-- A database that obx.database does not name: CREATE EXTENSION warns,
-- naming obx.database as well, and succeeds; so does the enqueue.
RESET client_min_messages;
CREATE DATABASE regress_obx_other;
\c regress_obx_other
\set VERBOSITY default
\set SHOW_CONTEXT never
SET obx.warn_without_relay = on;
CREATE EXTENSION obx;
SELECT extname FROM pg_extension WHERE extname = 'obx';
SELECT obx.enqueue('orders.served.v1', 'k2', '{"n": 3}') IS NOT NULL AS stored;
SELECT topic, pending, problem FROM obx.status;
-- Off: nothing is said.
\c regress_obx_other
\set VERBOSITY default
SET obx.warn_without_relay = off;
SELECT obx.enqueue('orders.served.v1', 'k2', '{"n": 4}') IS NOT NULL AS stored;
\c :home
DROP DATABASE regress_obx_other;
DELETE FROM obx.events WHERE topic = 'orders.served.v1';
