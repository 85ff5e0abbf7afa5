--
-- Operating the outbox: the obx.status, obx.quarantine and obx.workers
-- views, obx.retry, obx.retry_quarantined, obx.replay, and the GUC that
-- holds credentials.
--
-- No relay runs (obx.workers = 0), so the states a relay would produce are
-- written directly, as superuser, the way the relay writes them
-- (docs/internals.md, "The outbox log"): published (a row of obx.records
-- with partition, offset and time), leased (a row of obx.claims whose
-- until is in the future), backing off (a row of obx.event_states with
-- last_error and next_attempt_at in the future), quarantined (one with
-- quarantined_at and last_error).  pg_temp.publish, pg_temp.fail: below.
--
\set VERBOSITY default
\set SHOW_CONTEXT never
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS obx;
RESET client_min_messages;
TRUNCATE obx.events, obx.claims, obx.records, obx.published_counts, obx.event_states,
	obx.processed_events;
-- The status views' copies of the claim's sets, checked against the claim's
-- functions at two points below.
\set check_sets 'SELECT (SELECT count(*) FROM ( (SELECT id FROM obx._unpublished_events EXCEPT SELECT u.id FROM obx._tick() t, obx._unpublished(t.floor, t.snap, t.tick) u) UNION ALL (SELECT u.id FROM obx._tick() t, obx._unpublished(t.floor, t.snap, t.tick) u EXCEPT SELECT id FROM obx._unpublished_events)) d) AS unpublished_differ, (SELECT count(*) FROM obx._unpublished_events) AS unpublished, (SELECT count(*) FROM ( (SELECT lease_id FROM obx._live_claims EXCEPT SELECT l.lease_id FROM obx._tick() t, obx._live_leases(t.floor, t.tick) l) UNION ALL (SELECT l.lease_id FROM obx._tick() t, obx._live_leases(t.floor, t.tick) l EXCEPT SELECT lease_id FROM obx._live_claims)) d) AS leases_differ, (SELECT count(*) FROM obx._live_claims) AS live_leases;'

-- obx.outbox_events' state agrees with obx.status, topic by topic: no row
-- when they agree.
\set check_state 'SELECT coalesce(s.topic, o.topic) AS topic, s.pending + s.leased + s.quarantined AS status_unpublished, o.unpublished AS outbox_unpublished, s.leased AS status_leased, o.leased AS outbox_leased, s.quarantined AS status_quarantined, o.quarantined AS outbox_quarantined FROM obx.status s FULL JOIN (SELECT topic, count(*) FILTER (WHERE state <> ''published'') AS unpublished, count(*) FILTER (WHERE state = ''leased'') AS leased, count(*) FILTER (WHERE state = ''quarantined'') AS quarantined FROM obx.outbox_events WHERE state <> ''published'' GROUP BY topic) o ON o.topic = s.topic WHERE (s.pending + s.leased + s.quarantined, s.leased, s.quarantined) IS DISTINCT FROM (coalesce(o.unpublished, 0), coalesce(o.leased, 0), coalesce(o.quarantined, 0));'

-- A record of these events at partition p, offsets from the first, and
-- their count per topic, as the record step writes them.
CREATE FUNCTION pg_temp.publish(ids uuid[], p integer, offsets bigint[])
RETURNS void LANGUAGE sql AS $$
	INSERT INTO obx.records (lease_id, max_seq, ids, partitions, offsets, published_at)
	SELECT nextval('obx.lease_seq'), (SELECT max(seq) FROM obx.events WHERE id = ANY (ids)),
		   ids, array_fill(p, ARRAY[cardinality(ids)]), offsets,
		   array_fill(now(), ARRAY[cardinality(ids)]);
	INSERT INTO obx.published_counts (generation, topic, published, last_published_at)
	SELECT currval('obx.lease_seq') >> 40, e.topic, count(*), now()
	  FROM obx.events e WHERE e.id = ANY (ids) GROUP BY e.topic;
$$;
-- A failed attempt: the event held in obx.event_states with this state.
CREATE FUNCTION pg_temp.fail(id uuid, attempts integer, cls text, err text,
							 next_attempt_at timestamptz, quarantined_at timestamptz)
RETURNS void LANGUAGE sql AS $$
	SELECT obx._hold(ARRAY[id]);
	UPDATE obx.event_states s
	   SET attempts = fail.attempts, failures = fail.attempts, last_error_class = cls,
		   last_error = err, last_error_at = now(),
		   next_attempt_at = fail.next_attempt_at, quarantined_at = fail.quarantined_at
	 WHERE s.id = fail.id;
$$;

-- orders.placed.v1: pending, leased, and pending again after its lease expired.
SELECT obx.enqueue('orders.placed.v1', 'ord_1', '{"n": 1}', event_id => '00000000-0000-4000-8000-000000000101');
SELECT obx.enqueue('orders.placed.v1', 'ord_2', '{"n": 2}', event_id => '00000000-0000-4000-8000-000000000102');
SELECT obx.enqueue('orders.placed.v1', 'ord_3', '{"n": 3}', event_id => '00000000-0000-4000-8000-000000000103');
INSERT INTO obx.claims (lease_id, owner, until, snap, floor, max_seq, ids, topics, keys)
SELECT nextval('obx.lease_seq'), 0, now() + interval '1 hour', '1:1:', 0,
	   (SELECT seq FROM obx.events WHERE id = '00000000-0000-4000-8000-000000000102'),
	   ARRAY['00000000-0000-4000-8000-000000000102']::uuid[], ARRAY['orders.placed.v1'], ARRAY['ord_2'];
INSERT INTO obx.claims (lease_id, owner, until, snap, floor, max_seq, ids, topics, keys)
SELECT nextval('obx.lease_seq'), 1, now() - interval '1 hour', '1:1:', 0,
	   (SELECT seq FROM obx.events WHERE id = '00000000-0000-4000-8000-000000000103'),
	   ARRAY['00000000-0000-4000-8000-000000000103']::uuid[], ARRAY['orders.placed.v1'], ARRAY['ord_3'];

-- orders.paid.v1: two published, one backing off after a failed attempt.
SELECT obx.enqueue('orders.paid.v1', 'ord_1', '{"n": 4}', event_id => '00000000-0000-4000-8000-000000000201');
SELECT obx.enqueue('orders.paid.v1', 'ord_2', '{"n": 5}', event_id => '00000000-0000-4000-8000-000000000202');
SELECT obx.enqueue('orders.paid.v1', 'ord_3', '{"n": 6}', event_id => '00000000-0000-4000-8000-000000000203');
SELECT pg_temp.publish(ARRAY['00000000-0000-4000-8000-000000000201',
                             '00000000-0000-4000-8000-000000000202']::uuid[], 0, ARRAY[45, 46]);
SELECT pg_temp.fail('00000000-0000-4000-8000-000000000203', 2, 'transient',
                    'Broker: Not enough in-sync replicas', now() + interval '1 hour', NULL);

-- payments.captured.v1: one quarantined, one published, one pending.
SELECT obx.enqueue('payments.captured.v1', 'pay_1', '{"n": 7}', event_type => 'PaymentCaptured',
                   event_id => '00000000-0000-4000-8000-000000000301');
SELECT obx.enqueue('payments.captured.v1', 'pay_2', '{"n": 8}', event_id => '00000000-0000-4000-8000-000000000302');
SELECT obx.enqueue('payments.captured.v1', 'pay_3', '{"n": 9}', event_id => '00000000-0000-4000-8000-000000000303');
SELECT pg_temp.fail('00000000-0000-4000-8000-000000000301', 1, 'permanent',
                    'Broker: Message size too large', '-infinity', now());
SELECT pg_temp.publish(ARRAY['00000000-0000-4000-8000-000000000302']::uuid[], 2, ARRAY[7]);

-- orders.shipped.v1: everything published.
SELECT obx.enqueue('orders.shipped.v1', 'ord_1', '{"n": 10}', event_id => '00000000-0000-4000-8000-000000000401');
SELECT obx.enqueue('orders.shipped.v1', 'ord_2', '{"n": 11}', event_id => '00000000-0000-4000-8000-000000000402');
SELECT obx.enqueue('orders.shipped.v1', 'ord_3', '{"n": 12}', event_id => '00000000-0000-4000-8000-000000000403');
SELECT pg_temp.publish(ARRAY['00000000-0000-4000-8000-000000000401',
                             '00000000-0000-4000-8000-000000000402',
                             '00000000-0000-4000-8000-000000000403']::uuid[], 1, ARRAY[10, 11, 12]);

-- The status views' copies of the claim's sets (obx._unpublished_events,
-- obx._live_claims) give what the claim's functions give (here and below).
:check_sets

--
-- obx.status: one row per topic.
--
SELECT topic, pending, leased, published, quarantined, failing,
       oldest_pending_at IS NOT NULL AS has_oldest_pending,
       oldest_pending_age > '0' AS oldest_pending_age_positive,
       last_published_at IS NOT NULL AS has_published, last_error,
       last_error_at IS NOT NULL AS has_error_at
  FROM obx.status ORDER BY topic COLLATE "C";
:check_state

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
UPDATE obx.events SET occurred_at = now() - interval '2 hours'
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
:check_state

--
-- obx.retry_quarantined(topic): every quarantined event of a topic, or of
-- all topics; returns how many.
--
SELECT pg_temp.fail(id, 1, 'permanent', 'Broker: Invalid record', '-infinity', now())
  FROM unnest(ARRAY['00000000-0000-4000-8000-000000000101', '00000000-0000-4000-8000-000000000103',
                    '00000000-0000-4000-8000-000000000301']::uuid[]) AS id;
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
UPDATE obx.events
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
:check_state

--
-- obx.skip: a quarantined event leaves the outbox for obx.skipped_events,
-- with its reason; nothing else can be skipped.
--
SELECT obx.enqueue('orders.skip.v1', 'ord_s', '{"n": 1}',
                   event_id => '00000000-0000-4000-8000-0000000005a1') IS NOT NULL AS enqueued;
SELECT obx.enqueue('orders.skip.v1', 'ord_s', '{"n": 2}',
                   event_id => '00000000-0000-4000-8000-0000000005a2') IS NOT NULL AS enqueued;
SELECT obx.skip('00000000-0000-4000-8000-0000000005a1', 'not quarantined') AS skipped_pending;
SELECT pg_temp.fail('00000000-0000-4000-8000-0000000005a1', 3, 'permanent',
                    'MSG_SIZE_TOO_LARGE: Broker: Message size too large', '-infinity', now());
SELECT obx.skip('00000000-0000-4000-8000-0000000005a1', '');
\echo :SQLSTATE
SELECT obx.skip('00000000-0000-4000-8000-0000000005a1', 'payload too large for the topic; reissued as ord_s v2') AS skipped;
SELECT obx.skip('00000000-0000-4000-8000-0000000005a1', 'again') AS skipped_twice;
SELECT id, event_key, last_error_class, skip_reason, skipped_by = session_user AS by_me
  FROM obx.skipped_events;
SELECT id, event_key FROM obx.outbox_events WHERE topic = 'orders.skip.v1';
SELECT count(*) AS quarantined_left FROM obx.quarantine WHERE topic = 'orders.skip.v1';

:check_sets

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
-- obx._rotate first makes the generations agree with the events: a row for
-- the current generation, and none for one three or more behind it, whose
-- partition is a newer generation's (truncating it would take that one's
-- events).  As after a restore: the sequences in generation 3, whose
-- partition holds generation 0's events, and a row left for generation 0.
--
SELECT last_value AS event_seq_was FROM obx.event_seq \gset
SELECT count(*) > 0 AS generation_0_has_events FROM obx.events_0;
SELECT generation FROM obx.generations;
SELECT setval('obx.event_seq', 3::bigint << 40) >> 40 AS current_generation;
SELECT obx._rotate(86400) AS rotate_did;
SELECT generation FROM obx.generations;
SELECT count(*) > 0 AS generation_0_events_kept FROM obx.events_0;
DELETE FROM obx.generations;
INSERT INTO obx.generations (generation) VALUES (0);
SELECT setval('obx.event_seq', :event_seq_was) >> 40 AS current_generation;

--
-- The extension itself: version 1.1 (obx--1.0.sql, then obx--1.0--1.1.sql).
-- Every object it creates is a member (DROP EXTENSION removes it, pg_dump re-creates it
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
