--
-- upgrade: a database created with obx 1.0 gets the consumer with
-- ALTER EXTENSION obx UPDATE, keeping its outbox and dedupe history.
--
SET client_min_messages = warning;
DROP EXTENSION IF EXISTS obx CASCADE;
RESET client_min_messages;
CREATE EXTENSION obx VERSION '1.0';
SELECT extversion FROM pg_extension WHERE extname = 'obx';
SELECT to_regclass('obx.subscriptions') IS NULL AS no_subscriptions_in_1_0;

SELECT obx.enqueue('orders.upgrade.v1', 'ord_1', '{"n": 1}',
                   event_id => '01a22ab1-0000-7000-8000-000000000001') IS NOT NULL AS enqueued;
SELECT obx.mark_processed('inventory', 'evt-1');

ALTER EXTENSION obx UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'obx';

-- what 1.0 held is still there
SELECT count(*) AS events FROM obx.outbox_events WHERE topic = 'orders.upgrade.v1';
SELECT obx.mark_processed('inventory', 'evt-1') AS again;

-- the 1.1 objects exist, and belong to the extension
SELECT c.relname
  FROM pg_depend d JOIN pg_class c ON c.oid = d.objid
 WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'obx')
   AND d.classid = 'pg_class'::regclass
   AND c.relname IN ('subscriptions', 'consumer_partitions', 'dead_letters',
                     'consumer_status', 'consumers')
 ORDER BY c.relname COLLATE "C";
SELECT p.oid::regprocedure
  FROM pg_proc p
 WHERE p.pronamespace = 'obx'::regnamespace
   AND p.proname IN ('subscribe', 'unsubscribe', 'replay_dead_letter')
 ORDER BY 1::text COLLATE "C";

-- a subscription can be made right away
CREATE FUNCTION upgrade_handler(e obx.inbound_event) RETURNS void
LANGUAGE sql AS 'SELECT NULL';
SELECT obx.subscribe('after-upgrade', ARRAY['orders.upgrade.v1'],
                     'upgrade_handler(obx.inbound_event)');
SELECT consumer_name, topics, handler FROM obx.subscriptions;

-- an updated extension and a fresh one have the same objects
SELECT count(*) AS objects FROM pg_depend
 WHERE refobjid = (SELECT oid FROM pg_extension WHERE extname = 'obx')
   AND deptype = 'e';
-- (the handler depends on obx.inbound_event and goes with it)
DROP EXTENSION obx CASCADE;
CREATE EXTENSION obx;
SELECT count(*) AS objects FROM pg_depend
 WHERE refobjid = (SELECT oid FROM pg_extension WHERE extname = 'obx')
   AND deptype = 'e';
SELECT to_regprocedure('upgrade_handler(obx.inbound_event)') IS NULL AS handler_dropped;
