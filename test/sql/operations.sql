--
-- Operating the outbox: the obx.status, obx.quarantine and obx.workers
-- views, obx.retry, obx.retry_quarantined, obx.replay, and the GUC that
-- holds credentials.
--
-- No relay runs (obx.workers = 0), so the states a relay would produce are
-- written directly, as superuser, the way the relay writes them: published
-- (published_at, partition, offset), leased (a row in obx.leases whose
-- until is in the future),
-- backing off (last_error, next_attempt_at in the future), quarantined
-- (quarantined_at, last_error).
--
\set VERBOSITY default
\set SHOW_CONTEXT never
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS obx;
RESET client_min_messages;
TRUNCATE obx.outbox_events, obx.processed_events, obx.leases;

-- orders.placed.v1: pending, leased, and pending again after its lease expired.
SELECT obx.enqueue('orders.placed.v1', 'ord_1', '{"n": 1}', event_id => '00000000-0000-4000-8000-000000000101');
SELECT obx.enqueue('orders.placed.v1', 'ord_2', '{"n": 2}', event_id => '00000000-0000-4000-8000-000000000102');
SELECT obx.enqueue('orders.placed.v1', 'ord_3', '{"n": 3}', event_id => '00000000-0000-4000-8000-000000000103');
INSERT INTO obx.leases (lease_id, owner, until, ids, topics, keys) VALUES
	(1, 0, now() + interval '1 hour', ARRAY['00000000-0000-4000-8000-000000000102']::uuid[],
	 ARRAY['orders.placed.v1'], ARRAY['ord_2']),
	(2, 1, now() - interval '1 hour', ARRAY['00000000-0000-4000-8000-000000000103']::uuid[],
	 ARRAY['orders.placed.v1'], ARRAY['ord_3']);
UPDATE obx.outbox_events
   SET attempts = 1
 WHERE id IN ('00000000-0000-4000-8000-000000000102', '00000000-0000-4000-8000-000000000103');

-- orders.paid.v1: two published, one backing off after a failed attempt.
SELECT obx.enqueue('orders.paid.v1', 'ord_1', '{"n": 4}', event_id => '00000000-0000-4000-8000-000000000201');
SELECT obx.enqueue('orders.paid.v1', 'ord_2', '{"n": 5}', event_id => '00000000-0000-4000-8000-000000000202');
SELECT obx.enqueue('orders.paid.v1', 'ord_3', '{"n": 6}', event_id => '00000000-0000-4000-8000-000000000203');
UPDATE obx.outbox_events
   SET published_at = now(), kafka_partition = 0, kafka_offset = 41 + (payload->>'n')::int, attempts = 1
 WHERE id IN ('00000000-0000-4000-8000-000000000201', '00000000-0000-4000-8000-000000000202');
UPDATE obx.outbox_events
   SET attempts = 2, last_error = 'Broker: Not enough in-sync replicas',
       last_error_class = 'transient', last_error_at = now(),
       next_attempt_at = now() + interval '1 hour'
 WHERE id = '00000000-0000-4000-8000-000000000203';

-- payments.captured.v1: one quarantined, one published, one pending.
SELECT obx.enqueue('payments.captured.v1', 'pay_1', '{"n": 7}', event_type => 'PaymentCaptured',
                   event_id => '00000000-0000-4000-8000-000000000301');
SELECT obx.enqueue('payments.captured.v1', 'pay_2', '{"n": 8}', event_id => '00000000-0000-4000-8000-000000000302');
SELECT obx.enqueue('payments.captured.v1', 'pay_3', '{"n": 9}', event_id => '00000000-0000-4000-8000-000000000303');
UPDATE obx.outbox_events
   SET attempts = 1, quarantined_at = now(), last_error = 'Broker: Message size too large',
       last_error_class = 'permanent', last_error_at = now()
 WHERE id = '00000000-0000-4000-8000-000000000301';
UPDATE obx.outbox_events
   SET published_at = now(), kafka_partition = 2, kafka_offset = 7, attempts = 1
 WHERE id = '00000000-0000-4000-8000-000000000302';

-- orders.shipped.v1: everything published.
SELECT obx.enqueue('orders.shipped.v1', 'ord_1', '{"n": 10}', event_id => '00000000-0000-4000-8000-000000000401');
SELECT obx.enqueue('orders.shipped.v1', 'ord_2', '{"n": 11}', event_id => '00000000-0000-4000-8000-000000000402');
SELECT obx.enqueue('orders.shipped.v1', 'ord_3', '{"n": 12}', event_id => '00000000-0000-4000-8000-000000000403');
UPDATE obx.outbox_events
   SET published_at = now(), kafka_partition = 1, kafka_offset = (payload->>'n')::int, attempts = 1
 WHERE topic = 'orders.shipped.v1';

--
-- obx.status: one row per topic.
--
SELECT topic, pending, leased, published, quarantined, failing,
       oldest_pending_at IS NOT NULL AS has_oldest_pending,
       oldest_pending_age > '0' AS oldest_pending_age_positive,
       last_published_at IS NOT NULL AS has_published, last_error,
       last_error_at IS NOT NULL AS has_error_at
  FROM obx.status ORDER BY topic COLLATE "C";

-- A topic with nothing unpublished has age 0, not NULL (alerting on
-- "age > x" must not miss it).
SELECT oldest_pending_at, oldest_pending_age = interval '0' AS age_is_zero
  FROM obx.status WHERE topic = 'orders.shipped.v1';

-- The age is never negative, not even in the transaction that enqueued the
-- event (now() is that transaction's start; occurred_at is taken later).
BEGIN;
SELECT obx.enqueue('orders.returned.v1', 'ord_1', '{}') IS NOT NULL AS enqueued;
SELECT topic, pending, oldest_pending_age >= '0' AS age_not_negative
  FROM obx.status WHERE topic = 'orders.returned.v1';
ROLLBACK;

-- The age is that of the oldest unpublished event.
UPDATE obx.outbox_events SET occurred_at = now() - interval '2 hours'
 WHERE id = '00000000-0000-4000-8000-000000000101';
SELECT topic, oldest_pending_age >= interval '2 hours' AS at_least_2h,
       oldest_pending_age < interval '3 hours' AS under_3h
  FROM obx.status WHERE topic = 'orders.placed.v1';

--
-- obx.quarantine: the events the relay gave up on, with their errors.
--
SELECT id, topic, event_key, event_type, attempts, last_error_class, last_error,
       quarantined_at IS NOT NULL AS has_quarantined_at, occurred_at IS NOT NULL AS has_occurred_at
  FROM obx.quarantine ORDER BY id;

--
-- obx.retry(id): a quarantined event becomes publishable now, once.
--
SELECT obx.retry('00000000-0000-4000-8000-000000000301') AS retried;
SELECT obx.retry('00000000-0000-4000-8000-000000000301') AS retried_again;
SELECT id, quarantined_at IS NULL AS not_quarantined, attempts,
       next_attempt_at = '-infinity' AS due_now, published_at IS NULL AS unpublished,
       last_error AS error_kept_for_diagnosis
  FROM obx.outbox_events WHERE id = '00000000-0000-4000-8000-000000000301';
SELECT count(*) AS quarantined FROM obx.quarantine;
-- A backing-off event is made due now as well.
SELECT obx.retry('00000000-0000-4000-8000-000000000203') AS retried_backing_off;
SELECT attempts, next_attempt_at = '-infinity' AS due_now
  FROM obx.outbox_events WHERE id = '00000000-0000-4000-8000-000000000203';
-- Nothing to do for a pending, a published or an unknown event, or NULL.
SELECT obx.retry('00000000-0000-4000-8000-000000000101') AS pending,
       obx.retry('00000000-0000-4000-8000-000000000201') AS published,
       obx.retry('00000000-0000-4000-8000-00000000dead') AS unknown,
       obx.retry(NULL) AS null_id;

SELECT topic, pending, leased, published, quarantined, failing
  FROM obx.status ORDER BY topic COLLATE "C";

--
-- obx.retry_quarantined(topic): every quarantined event of a topic, or of
-- all topics; returns how many.
--
UPDATE obx.outbox_events SET quarantined_at = now(), last_error = 'Broker: Invalid record',
       last_error_class = 'permanent', last_error_at = now()
 WHERE id IN ('00000000-0000-4000-8000-000000000101', '00000000-0000-4000-8000-000000000103',
              '00000000-0000-4000-8000-000000000301');
SELECT topic, count(*) FROM obx.quarantine GROUP BY topic ORDER BY topic COLLATE "C";
SELECT obx.retry_quarantined('orders.shipped.v1') AS none_in_topic;
SELECT obx.retry_quarantined('orders.placed.v1') AS placed;
SELECT topic, count(*) FROM obx.quarantine GROUP BY topic ORDER BY topic COLLATE "C";
SELECT obx.retry_quarantined() AS all_topics;
SELECT obx.retry_quarantined() AS all_topics_again;
SELECT count(*) AS quarantined FROM obx.quarantine;

--
-- obx.replay(ids): published events go out again, with the same ids and
-- in their original place in enqueue order.
--
SELECT seq AS seq_201 FROM obx.outbox_events WHERE id = '00000000-0000-4000-8000-000000000201' \gset
SELECT obx.replay(ARRAY['00000000-0000-4000-8000-000000000201',   -- published
                        '00000000-0000-4000-8000-000000000202',   -- published
                        '00000000-0000-4000-8000-000000000203',   -- never published
                        '00000000-0000-4000-8000-00000000dead']::uuid[]) AS replayed;
SELECT id, published_at IS NULL AS unpublished, kafka_partition, kafka_offset, attempts,
       next_attempt_at = '-infinity' AS due_now
  FROM obx.outbox_events WHERE topic = 'orders.paid.v1' ORDER BY seq;
SELECT count(*) AS paid_events, bool_or(id = '00000000-0000-4000-8000-000000000201' AND seq = :seq_201) AS replayed_event_keeps_seq
  FROM obx.outbox_events WHERE topic = 'orders.paid.v1';
SELECT obx.replay(ARRAY['00000000-0000-4000-8000-000000000201']::uuid[]) AS replayed_again;
SELECT obx.replay('{}'::uuid[]) AS empty, obx.replay(NULL::uuid[]) AS null_ids;

--
-- obx.replay(topic, since, until): the published events of a topic that
-- occurred in [since, until).
--
UPDATE obx.outbox_events
   SET occurred_at = '2026-09-29 10:00:00+00'::timestamptz + ((payload->>'n')::int - 10) * interval '30 minutes'
 WHERE topic = 'orders.shipped.v1';
SELECT id, to_char(occurred_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI') AS occurred_utc,
       published_at IS NOT NULL AS published
  FROM obx.outbox_events WHERE topic = 'orders.shipped.v1' ORDER BY seq;
SELECT obx.replay('orders.shipped.v1', '2026-09-29 10:30:00+00', '2026-09-29 11:00:00+00') AS half_open_window;
SELECT id, published_at IS NULL AS unpublished
  FROM obx.outbox_events WHERE topic = 'orders.shipped.v1' ORDER BY seq;
SELECT obx.replay('orders.shipped.v1', '2026-09-29 10:30:00+00', '2026-09-29 11:00:00+00') AS same_window_again;
SELECT obx.replay('orders.placed.v1', '-infinity') AS topic_without_published;
SELECT obx.replay('orders.nothing.v1', '-infinity') AS unknown_topic;
SELECT obx.replay('orders.shipped.v1', '2026-09-29 09:00:00+00') AS until_defaults_to_infinity;
SELECT count(*) FILTER (WHERE published_at IS NULL) AS unpublished, count(*) AS total
  FROM obx.outbox_events WHERE topic = 'orders.shipped.v1';

SELECT topic, pending, leased, published, quarantined, failing
  FROM obx.status ORDER BY topic COLLATE "C";

--
-- obx.skip: a quarantined event leaves the outbox for obx.skipped_events,
-- with its reason; nothing else can be skipped.
--
SELECT obx.enqueue('orders.skip.v1', 'ord_s', '{"n": 1}',
                   event_id => '00000000-0000-4000-8000-0000000005a1') IS NOT NULL AS enqueued;
SELECT obx.enqueue('orders.skip.v1', 'ord_s', '{"n": 2}',
                   event_id => '00000000-0000-4000-8000-0000000005a2') IS NOT NULL AS enqueued;
SELECT obx.skip('00000000-0000-4000-8000-0000000005a1', 'not quarantined') AS skipped_pending;
UPDATE obx.outbox_events SET quarantined_at = now(), failures = 3,
       last_error = 'MSG_SIZE_TOO_LARGE: Broker: Message size too large', last_error_class = 'permanent'
 WHERE id = '00000000-0000-4000-8000-0000000005a1';
SELECT obx.skip('00000000-0000-4000-8000-0000000005a1', '');
\echo :SQLSTATE
SELECT obx.skip('00000000-0000-4000-8000-0000000005a1', 'payload too large for the topic; reissued as ord_s v2') AS skipped;
SELECT obx.skip('00000000-0000-4000-8000-0000000005a1', 'again') AS skipped_twice;
SELECT id, event_key, last_error_class, skip_reason, skipped_by = session_user AS by_me
  FROM obx.skipped_events;
SELECT id, event_key FROM obx.outbox_events WHERE topic = 'orders.skip.v1';
SELECT count(*) AS quarantined_left FROM obx.quarantine WHERE topic = 'orders.skip.v1';

--
-- obx.workers: one row per configured relay worker; none here.
--
SHOW obx.workers;
SELECT * FROM obx.workers;

--
-- obx.kafka_properties may hold credentials: superusers only.
--
SHOW obx.kafka_properties;
SELECT count(*) AS listed_in_pg_settings FROM pg_settings WHERE name = 'obx.kafka_properties';
SHOW obx.brokers;
CREATE ROLE regress_obx_reader;
SET ROLE regress_obx_reader;
-- The server words this denial differently across majors: its SQLSTATE counts.
\set VERBOSITY sqlstate
SHOW obx.kafka_properties;
\echo :SQLSTATE
SELECT current_setting('obx.kafka_properties');
\echo :SQLSTATE
\set VERBOSITY default
SELECT count(*) AS listed_in_pg_settings FROM pg_settings WHERE name = 'obx.kafka_properties';
-- Other settings are public.
SHOW obx.brokers;
RESET ROLE;
DROP ROLE regress_obx_reader;

--
-- The extension itself: one install script, version 1.0.  Every object it
-- creates is a member (DROP EXTENSION removes it, pg_dump re-creates it
-- with CREATE EXTENSION and dumps none of it separately), nothing else
-- lives in schema obx, and pg_dump keeps the data of the tables and
-- sequences listed in extconfig.  (From 17 on, a table's or view's row type
-- and every array type are members too; they are left out of the list, so
-- that it reads the same on every major.)
--
SELECT extversion FROM pg_extension WHERE extname = 'obx';
SELECT pg_describe_object(d.classid, d.objid, d.objsubid) COLLATE "C" AS member
  FROM pg_depend d
 WHERE d.refclassid = 'pg_extension'::regclass
   AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'obx')
   AND d.deptype = 'e'
   AND NOT EXISTS (SELECT 1 FROM pg_type t LEFT JOIN pg_class c ON c.oid = t.typrelid
                    WHERE d.classid = 'pg_type'::regclass AND t.oid = d.objid
                      AND (t.typcategory = 'A' OR c.relkind <> 'c'))
 ORDER BY 1;
SELECT c.oid::regclass AS not_a_member
  FROM pg_class c
 WHERE c.relnamespace = 'obx'::regnamespace
   AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
   AND NOT EXISTS (SELECT 1 FROM pg_depend d
                    WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                      AND d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e');
SELECT p.oid::regprocedure AS not_a_member
  FROM pg_proc p
 WHERE p.pronamespace = 'obx'::regnamespace
   AND NOT EXISTS (SELECT 1 FROM pg_depend d
                    WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid
                      AND d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e');
SELECT c::regclass AS kept_by_pg_dump, w AS condition
  FROM pg_extension x, unnest(x.extconfig, x.extcondition) AS u(c, w)
 WHERE x.extname = 'obx'
 ORDER BY c::regclass::text COLLATE "C";
