/* obx--1.1--1.2.sql: from the 1.1 release to 1.2 */

\echo Use "ALTER EXTENSION obx UPDATE TO '1.2'" to load this file. \quit

/*
 * What came after the 1.1 release: the era of transaction ids (logical
 * replication and restores from pg_dump), the records found by their seq
 * range, the workers' role obx_worker, landing for consumers outside the
 * database (obx.land, obx:work) and obx-relay's consumer (obx._consume).
 * Every table keeps its rows: events, records, claims, states, marks,
 * subscriptions, offsets and dead letters.
 *
 * obx.events and obx.claims gain their column era at the end (a fresh
 * install of 1.2 runs this script too, so every 1.2 database has it
 * there): adding it with a constant default rewrites no row, where putting
 * it after xid would copy every retained event.  Nothing reads these
 * tables, or the views that read them whole, by column position.
 */

/*
 * The transaction-id space this database's rows come from (its era): a
 * number drawn at random when obx is installed, the constant of this
 * function.  Transaction ids and snapshots mean something only in the
 * cluster that assigned them, but logical replication copies obx's rows
 * into another cluster and pg_dump restores them into one: each event and
 * each claim keeps the era it was written in, and a relay compares only its
 * own era's transaction ids with its own snapshots.  A physical copy (a
 * standby, a point-in-time recovery, pg_upgrade, CREATE DATABASE from a
 * template) keeps the transaction ids and this function alike; CREATE
 * EXTENSION in another cluster, and so a restore from pg_dump, draws a new
 * era.  Two installs draw the same one with a chance of 1 in 2^31.
 */
DO $$
BEGIN
	EXECUTE format('CREATE FUNCTION obx._era() RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS %L',
				   'SELECT ' || (1 + floor(random() * 2147483646))::integer);
END
$$;

/*
 * The rows there are, events and claims alike, are of this cluster: they
 * take this install's era (a constant default: no row is rewritten).
 */
ALTER TABLE obx.events ADD COLUMN era integer NOT NULL DEFAULT obx._era();
ALTER TABLE obx.claims ADD COLUMN era integer NOT NULL DEFAULT obx._era();

/*
 * Records: min_seq is the claim's lowest seq, and seqs the range of both.
 * A record written by 1.1 has no min_seq, which is no lower bound:
 * obx.outbox_events looks at it for every event below its max_seq, until
 * its generation is truncated.  Adding the stored column rewrites
 * obx.records, which holds one row per batch.
 */
ALTER TABLE obx.records ADD COLUMN min_seq bigint;
ALTER TABLE obx.records
	ADD COLUMN seqs numrange GENERATED ALWAYS AS (numrange(min_seq, max_seq, '[]')) STORED;
DROP INDEX obx.records_ids_idx;
/*
 * Where one event landed (obx.outbox_events): the records whose claim's
 * seq range holds the event's seq, one index entry per record.  A GIN
 * index on ids, one entry per event, took a fifth of the relay's CPU in a
 * drain (docs/benchmarks.md, "The records' index").  numrange, not
 * int8range: a lease holding a retried event has max_seq 2^63 - 1, one
 * past which int8range cannot close.  Stored, so that a scan of a few
 * records compares ranges instead of building one per record and event.
 */
CREATE INDEX records_seqs_idx ON obx.records USING gist (seqs);

/*
 * The records of the last minute (obx.publish_latency_summary), found
 * without reading the older ones.
 */
CREATE INDEX records_recorded_at_idx ON obx.records (recorded_at);

/*
 * How many events were published, per generation of the lease that
 * published them and topic, and the newest publish time: what obx.status
 * says of published events without reading them.  The record step appends
 * one row per topic of its batch, in the batch's transaction; obx._rotate
 * sums each generation's and topic's rows into one every few seconds, and
 * deletes a generation's rows with its records.  A reader sums the rows:
 * what it reads is as many rows as batches since the last sum, and one per
 * generation and topic.  An event published twice (a replay, a stale
 * worker's late report) counts twice, as it reached Kafka twice.
 */
CREATE TABLE obx.published_counts (
	generation			bigint		NOT NULL,	/* the lease's: lease_id >> 40 */
	topic				text		NOT NULL,
	published			bigint		NOT NULL,
	last_published_at	timestamptz NOT NULL
);
/* The events published before this update, from their records. */
INSERT INTO obx.published_counts (generation, topic, published, last_published_at)
SELECT r.lease_id >> 40, e.topic, count(*), max(x.t)
  FROM obx.records r, unnest(r.ids, r.published_at) AS x(id, t), obx.events e
 WHERE e.id = x.id
 GROUP BY 1, 2;

/*
 * The records that can name an event _unpublished considers, as of the
 * tick (floor, tick): those of batches that held an event at or above the
 * floor, and those of every claim after the tick.
 *
 * PL/pgSQL, not an inlined SQL function, for the claim's sake: the claim
 * and the floor use this set four times between them, and inlined, each
 * use put a scan of every partition of obx.records into their plans, all
 * started (ExecutorStart) on every claim whether it ran or not, which
 * costs the relay most at a steady rate (docs/benchmarks.md).  Called, it
 * starts only where it runs.
 *
 * Each open range has its (always true) other end: a plan made without the
 * values, as a generic plan is, then expects a few rows of each index, as
 * for any range of unknown ends, instead of a third of the table, which
 * made it read every record.  The views below do the same.
 */
CREATE OR REPLACE FUNCTION obx._published_ids(floor bigint, tick bigint)
RETURNS SETOF uuid
LANGUAGE plpgsql STABLE
AS $$
BEGIN
	RETURN QUERY
	SELECT u.id
	  FROM obx.records r, pg_catalog.unnest(r.ids) AS u(id)
	 WHERE (r.max_seq >= _published_ids.floor AND r.max_seq <= 9223372036854775807)
		OR (r.lease_id > _published_ids.tick AND r.lease_id <= 9223372036854775807);
END
$$;

/*
 * The events neither published nor held in obx.event_states, as of the
 * tick (floor, snap, tick) of the latest claim, in two parts: those at or
 * above the floor (_unpublished_from, read in seq order on the seq index),
 * and the late committers below it (_unpublished_late: transactions of this
 * era that were running or not yet started when snap was taken, on the xid
 * index).
 * Each part is one SELECT, inlined into the claim, which reads each in seq
 * order up to the batch size: the planner merges the partitions' index
 * scans and stops early, which it does not do across a UNION ALL (the
 * claim's batch spells _unpublished_from out: OBX_SQL_CLAIM in
 * src/protocol/protocol.h says why).
 * _unpublished is both, for the rest.
 */
CREATE OR REPLACE FUNCTION obx._unpublished_from(floor bigint, tick bigint)
RETURNS SETOF obx.events
LANGUAGE sql STABLE
AS $$
	SELECT e.*
	  FROM obx.events e
	 WHERE e.seq >= _unpublished_from.floor
	   AND e.id NOT IN (SELECT p FROM obx._published_ids(_unpublished_from.floor,
														  _unpublished_from.tick) p)
	   AND e.id NOT IN (SELECT s.id FROM obx.event_states s)
$$;

CREATE OR REPLACE FUNCTION obx._unpublished_late(floor bigint, snap pg_snapshot, tick bigint)
RETURNS SETOF obx.events
LANGUAGE sql STABLE
AS $$
	/*
	 * seq + 0: the xid index, never the seq index below the floor (all
	 * history).  One scan of each partition for both kinds of late
	 * committer (a bitmap OR on the xid index): a UNION ALL of the two
	 * started twice as many scans on every claim (docs/benchmarks.md).
	 * The range ends at the current snapshot's horizon, which no visible
	 * event passes: events of another era whose xids lie beyond it (a
	 * cluster ahead of this one) stay out of the scan, and the few inside
	 * the range are left out by their era.  An index on (era, xid), or on
	 * xid for this era only, made the planner scan it whole instead.
	 * The range holds every transaction since snap, whose events are
	 * nearly all at or above the floor: the subquery (OFFSET 0 keeps it
	 * one) leaves them out before the published and held ids are looked
	 * up, which the planner would do first, reading obx.records on every
	 * claim for nothing, and once per partition.
	 */
	SELECT c.*
	  FROM (SELECT e.*
			  FROM obx.events e
			 WHERE ((e.xid >= pg_snapshot_xmax(_unpublished_late.snap)::text::bigint
					 AND e.xid < pg_snapshot_xmax(pg_current_snapshot())::text::bigint)
					OR e.xid = ANY (ARRAY(SELECT x::text::bigint
											FROM pg_snapshot_xip(_unpublished_late.snap) x)))
			   AND e.era = obx._era()
			   AND e.seq + 0 < _unpublished_late.floor
			OFFSET 0) c
	 WHERE c.id NOT IN (SELECT p FROM obx._published_ids(_unpublished_late.floor,
														  _unpublished_late.tick) p)
	   AND c.id NOT IN (SELECT s.id FROM obx.event_states s)
$$;

CREATE OR REPLACE FUNCTION obx._unpublished(floor bigint, snap pg_snapshot, tick bigint)
RETURNS SETOF obx.events
LANGUAGE sql STABLE
AS $$
	SELECT * FROM obx._unpublished_from(_unpublished.floor, _unpublished.tick)
	UNION ALL
	SELECT * FROM obx._unpublished_late(_unpublished.floor, _unpublished.snap, _unpublished.tick)
$$;

/*
 * The latest tick: the floor, snapshot and lease id of the latest claim.
 * With no claim (a new install, or a database restored from pg_dump, which
 * keeps no claim), or when the latest claim is of another era (copied by
 * logical replication: its snapshot names another cluster's transactions),
 * the floor and snapshot before everything: every event and every record is
 * read, and no transaction id compared.  The lease id is the latest claim's
 * all the same, so that a claim can tell that obx.lease_seq is behind the
 * claims (a relay's claim draws a higher one).
 */
CREATE OR REPLACE FUNCTION obx._tick()
RETURNS TABLE (floor bigint, snap pg_snapshot, tick bigint)	/* a set: inlined */
LANGUAGE sql STABLE
AS $$
	SELECT * FROM (
		SELECT CASE WHEN c.era = obx._era() THEN c.floor ELSE 0 END,
			   CASE WHEN c.era = obx._era() THEN c.snap ELSE '1:1:' END,
			   c.lease_id
		  FROM obx.claims c ORDER BY c.lease_id DESC LIMIT 1) t
	UNION ALL
	SELECT 0, '1:1:', 0
	ORDER BY 3 DESC
	LIMIT 1
$$;

/*
 * Live leases as of the tick: claims with no record whose lease (or its
 * latest renewal) has not run out.  Older claims cannot hold an event that
 * is still unpublished.
 */
CREATE OR REPLACE FUNCTION obx._live_leases(floor bigint, tick bigint)
RETURNS SETOF obx.claims
LANGUAGE sql STABLE
AS $$
	SELECT c.*
	  FROM obx.claims c
	 WHERE ((c.max_seq >= _live_leases.floor AND c.max_seq <= 9223372036854775807)
			OR (c.lease_id > _live_leases.tick AND c.lease_id <= 9223372036854775807))
	   AND c.ids IS NOT NULL
	   AND NOT EXISTS (SELECT 1 FROM obx.records r WHERE r.lease_id = c.lease_id)
	   AND greatest(c.until, (SELECT max(n.until) FROM obx.renewals n
							   WHERE n.lease_id = c.lease_id)) >= now()
$$;

/*
 * Replaced in place, so that the status views that read them stay, and
 * the grants on those: the era comes last in them, as in the tables.
 */
/*
 * The same two sets as of the latest tick, as views for the status views:
 * a view reads its tables as its owner, and a function called from a view
 * would need EXECUTE and SELECT granted to every reader.  They are not
 * written twice by hand: a view's text is the functions' with the latest
 * tick joined in, and test/sql/operations.sql checks that both give the
 * same rows.  Each table is read in a subquery of its own (LATERAL,
 * OFFSET 0) that takes the tick's values as parameters, as the functions
 * do: it reads the index ranges from the tick on.  Joined to the tick
 * instead, the planner read every retained row and filtered them (t/038).
 */
CREATE OR REPLACE VIEW obx._latest_tick AS
SELECT t.floor, t.snap, t.tick FROM (
	SELECT * FROM (
		SELECT CASE WHEN c.era = obx._era() THEN c.floor ELSE 0 END AS floor,
			   CASE WHEN c.era = obx._era() THEN c.snap ELSE '1:1:' END AS snap,
			   c.lease_id AS tick
		  FROM obx.claims c ORDER BY c.lease_id DESC LIMIT 1) x
	UNION ALL
	SELECT 0, '1:1:', 0
	ORDER BY 3 DESC
	LIMIT 1) t;

/*
 * The latest tick's floor, lease id and snapshot's xmax, for the planner.
 * The views below compare their tables with these as well as with the
 * tick's values read in the query (the same values: one snapshot).  The
 * planner evaluates a stable function to estimate a condition, as it does
 * now(), so it sees how few rows lie past the tick; with the tick's values
 * alone its estimates were a fixed share of the retained history, and past
 * jit_above_cost (a few million events) each read was compiled, which took
 * far longer than running it.  PL/pgSQL, whose plan a session keeps: each
 * is called some twenty times per read of obx.status, as planned and as
 * run.  Numbers only: a view's reader calls them, so they run as their
 * owner, and PUBLIC may execute them.
 */
CREATE FUNCTION obx._tick_floor() RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$ BEGIN RETURN (SELECT t.floor FROM obx._latest_tick t); END $$;

CREATE FUNCTION obx._tick_lease() RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$ BEGIN RETURN (SELECT t.tick FROM obx._latest_tick t); END $$;

CREATE FUNCTION obx._tick_xmax() RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$ BEGIN RETURN (SELECT pg_snapshot_xmax(t.snap)::text::bigint FROM obx._latest_tick t); END $$;

CREATE OR REPLACE VIEW obx._unpublished_events AS
WITH t AS MATERIALIZED (SELECT * FROM obx._latest_tick),
	 published AS MATERIALIZED (
		SELECT u.id
		  FROM t, LATERAL (
			SELECT r.ids FROM obx.records r
			 WHERE (r.max_seq >= t.floor AND r.max_seq >= obx._tick_floor()
					AND r.max_seq <= 9223372036854775807)
				OR (r.lease_id > t.tick AND r.lease_id > obx._tick_lease()
					AND r.lease_id <= 9223372036854775807)
			OFFSET 0) r, unnest(r.ids) AS u(id)),
	 held AS MATERIALIZED (SELECT s.id FROM obx.event_states s)
SELECT e.*
  FROM t, LATERAL (
	SELECT e.* FROM obx.events e
	 WHERE e.seq >= t.floor AND e.seq >= obx._tick_floor() AND e.seq <= 9223372036854775807
	OFFSET 0) e
 WHERE e.id NOT IN (SELECT id FROM published)
   AND e.id NOT IN (SELECT id FROM held)
UNION ALL
SELECT c.*
  FROM t, LATERAL (
	SELECT e.*
	  FROM obx.events e
	 WHERE ((e.xid >= pg_snapshot_xmax(t.snap)::text::bigint AND e.xid >= obx._tick_xmax()
			 AND e.xid < pg_snapshot_xmax(pg_current_snapshot())::text::bigint)
			OR e.xid = ANY (ARRAY(SELECT x::text::bigint FROM pg_snapshot_xip(t.snap) x)))
	   AND e.era = obx._era()
	   AND e.seq + 0 < t.floor
	OFFSET 0) c
 WHERE c.id NOT IN (SELECT id FROM published)
   AND c.id NOT IN (SELECT id FROM held);

CREATE OR REPLACE VIEW obx._live_claims AS
SELECT c.*
  FROM obx._latest_tick t, LATERAL (
	SELECT c.* FROM obx.claims c
	 WHERE ((c.max_seq >= t.floor AND c.max_seq >= obx._tick_floor()
			 AND c.max_seq <= 9223372036854775807)
			OR (c.lease_id > t.tick AND c.lease_id > obx._tick_lease()
				AND c.lease_id <= 9223372036854775807))
	   AND c.ids IS NOT NULL
	OFFSET 0) c
 WHERE NOT EXISTS (SELECT 1 FROM obx.records r WHERE r.lease_id = c.lease_id)
   AND greatest(c.until, (SELECT max(n.until) FROM obx.renewals n
						   WHERE n.lease_id = c.lease_id)) >= now();

/*
 * Rotation and truncation, run by the worker that purges (housekeeping.c)
 * every few seconds; returns what it did, NULL for nothing.
 *
 * A generation older than the current one is done when no event of it is
 * unpublished and no transaction can still insert into its partition (a
 * SHARE lock taken without waiting); the events that wait behind a failing
 * event of their key are held first.  It is truncated obx.retention after
 * it was done, in all four tables at once (and its counts in
 * obx.published_counts), without waiting for the lock: a claim or a
 * report that holds a partition makes it try again later.
 * The current generation is rotated away after half of obx.retention,
 * once the partition it moves to is empty, under the claim lock, so that
 * a claim's lease ids and the events it can see change generation
 * together.  retention_s 0 keeps every event: no rotation.
 *
 * First the table of generations is made to agree with the events: a row
 * for the current generation and for each of the two before it whose
 * partition holds events, and none for an older one, whose partition is a
 * newer generation's now (truncating it would take that generation's
 * events).  They disagree only where obx's rows came from elsewhere: a
 * restore from pg_dump, which dumps no row for generation 0 (CREATE
 * EXTENSION makes it), or a logical replica, whose first copy of this
 * table collides with that row and stops.
 */
CREATE OR REPLACE FUNCTION obx._rotate(retention_s float8)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	cur bigint := (SELECT last_value FROM obx.event_seq) >> 40;
	g obx.generations;
	slot integer;
	t record;
BEGIN
	/*
	 * The counts of published events, one row per batch and topic since
	 * the last call: each generation's and topic's rows become one.  At
	 * every retention, 0 included: they are what obx.status reads.
	 */
	IF EXISTS (SELECT 1 FROM obx.published_counts c
				GROUP BY c.generation, c.topic HAVING count(*) > 1) THEN
		WITH d AS (DELETE FROM obx.published_counts RETURNING *)
		INSERT INTO obx.published_counts (generation, topic, published, last_published_at)
		SELECT d.generation, d.topic, sum(d.published), max(d.last_published_at)
		  FROM d GROUP BY d.generation, d.topic;
	END IF;
	IF retention_s <= 0 THEN
		RETURN NULL;
	END IF;
	DELETE FROM obx.generations WHERE generation <= cur - 3;
	INSERT INTO obx.generations (generation)
	SELECT DISTINCT x.g
	  FROM (SELECT cur
			UNION ALL SELECT min(seq) >> 40 FROM obx.events_0
			UNION ALL SELECT max(seq) >> 40 FROM obx.events_0
			UNION ALL SELECT min(seq) >> 40 FROM obx.events_1
			UNION ALL SELECT max(seq) >> 40 FROM obx.events_1
			UNION ALL SELECT min(seq) >> 40 FROM obx.events_2
			UNION ALL SELECT max(seq) >> 40 FROM obx.events_2) AS x(g)
	 WHERE x.g BETWEEN cur - 2 AND cur
	ON CONFLICT (generation) DO NOTHING;
	SELECT * INTO g FROM obx.generations WHERE generation < cur ORDER BY generation LIMIT 1;
	IF FOUND THEN
		slot := g.generation % 3;
		IF g.done_at IS NULL THEN
			BEGIN
				EXECUTE format('LOCK TABLE obx.events_%s IN SHARE MODE NOWAIT', slot);
			EXCEPTION WHEN lock_not_available THEN
				RETURN NULL;
			END;
			SELECT * INTO t FROM obx._tick();
			/*
			 * Events that wait behind a failing or quarantined event of their
			 * key could wait for ever: they are held (copied into
			 * obx.event_states, due, in their place in seq order), so that
			 * the generation can go.
			 */
			PERFORM obx._hold(ARRAY(
				SELECT u.id FROM obx._unpublished(t.floor, t.snap, t.tick) u
				 WHERE u.seq >> 40 = g.generation
				   AND (u.topic, u.event_key) IN (
						SELECT s.topic, s.event_key FROM obx.event_states s
						 WHERE s.published_at IS NULL AND s.skipped_at IS NULL)
				   AND u.id NOT IN (SELECT x.id FROM obx._live_leases(t.floor, t.tick) l,
												 unnest(l.ids) AS x(id))));
			IF t.tick >> 40 <= g.generation
			   OR EXISTS (SELECT 1 FROM obx._unpublished(t.floor, t.snap, t.tick) u
						   WHERE u.seq >> 40 = g.generation)
			   OR EXISTS (SELECT 1 FROM obx._live_leases(t.floor, t.tick) l
						   WHERE l.lease_id >> 40 = g.generation) THEN
				RETURN NULL;
			END IF;
			UPDATE obx.generations SET done_at = now() WHERE generation = g.generation;
			RETURN format('generation %s published', g.generation);
		END IF;
		IF g.done_at >= now() - make_interval(secs => retention_s) THEN
			RETURN NULL;
		END IF;
		BEGIN
			EXECUTE format('LOCK TABLE obx.events_%1$s, obx.claims_%1$s, obx.records_%1$s,'
						   ' obx.renewals_%1$s IN ACCESS EXCLUSIVE MODE NOWAIT', slot);
		EXCEPTION WHEN lock_not_available THEN
			RETURN NULL;
		END;
		EXECUTE format('TRUNCATE obx.events_%1$s, obx.claims_%1$s, obx.records_%1$s,'
					   ' obx.renewals_%1$s', slot);
		DELETE FROM obx.published_counts c WHERE c.generation % 3 = slot;
		DELETE FROM obx.event_states s
		 WHERE s.seq >> 40 = g.generation
		   AND (s.published_at IS NOT NULL OR s.skipped_at IS NOT NULL);
		DELETE FROM obx.generations WHERE generation = g.generation;
		RETURN format('generation %s truncated', g.generation);
	END IF;

	/* Rotate: the current generation is old enough and the next slot free. */
	IF coalesce((SELECT started_at FROM obx.generations WHERE generation = cur), now())
		 >= now() - make_interval(secs => retention_s / 2)
	   OR EXISTS (SELECT 1 FROM obx.generations WHERE generation = cur - 2) THEN
		RETURN NULL;
	END IF;
	PERFORM pg_advisory_xact_lock(7299704, 1);	/* the claim lock ("obx", 1) */
	PERFORM setval('obx.event_seq', (cur + 1) << 40, false);
	PERFORM setval('obx.lease_seq', greatest((cur + 1) << 40,
											 (SELECT last_value FROM obx.lease_seq) + 1), false);
	INSERT INTO obx.generations (generation) VALUES (cur + 1);
	RETURN format('rotated to generation %s', cur + 1);
END
$$;

/*
 * Every retained event, as 1.0's table showed it, and its state: pending,
 * leased, failing, quarantined or published.  Three parts, none of which
 * reads another's events:
 *   - unpublished with no state (obx._unpublished_events): what is
 *     pending or leased, read from the latest tick up, never the history;
 *   - published with no state: every other event, published_at and where
 *     it landed from its record;
 *   - with a state (obx.event_states): failing, quarantined, replayed, or
 *     published after that; a held event stays here after its generation
 *     was truncated.
 * state is a constant in the published part, so that a query for the
 * others (state <> 'published', state IN ('pending', 'leased')) is planned
 * without that part: it costs what is unpublished, not what is retained
 * (docs/sql.md, "What a read costs").  published_at IS NULL reads every
 * retained event: the planner cannot tell that a record's time is never
 * NULL.  A record is an index lookup of the records whose claims spanned
 * the event's seq, and a search of their ids: partition and offset from
 * the first record since the event's latest replay (a stale worker's late
 * report of a second copy does not move them).  They are sorted by an
 * expression of recorded_at, not by its index: read in that index's order
 * and filtered, every event read the records until its own.  Skipped
 * events are in obx.skipped_events instead.  1.0's obx.replay(topic, since, until)
 * reads it as it read the table, unchanged.
 */
CREATE OR REPLACE VIEW obx.outbox_events AS
SELECT u.id, u.seq, u.aggregate_id, u.topic, u.event_key, u.event_type,
	   u.headers, u.payload, u.occurred_at,
	   NULL::timestamptz AS published_at, 0 AS attempts, 0 AS failures,
	   '-infinity'::timestamptz AS next_attempt_at, NULL::timestamptz AS quarantined_at,
	   NULL::text AS last_error, NULL::text AS last_error_class,
	   NULL::timestamptz AS last_error_at, NULL::integer AS kafka_partition,
	   NULL::bigint AS kafka_offset,
	   CASE WHEN u.id IN (SELECT x.id FROM obx._live_claims l, unnest(l.ids) AS x(id))
			THEN 'leased' ELSE 'pending' END AS state
  FROM obx._unpublished_events u
UNION ALL
SELECT e.id, e.seq, e.aggregate_id, e.topic, e.event_key, e.event_type,
	   e.headers, e.payload, e.occurred_at, r.published_at, 1, 0, '-infinity', NULL, NULL,
	   NULL, NULL, r.kafka_partition, r.kafka_offset, 'published'
  FROM obx.events e
  LEFT JOIN LATERAL (
	SELECT x.published_at[i] AS published_at, x.partitions[i] AS kafka_partition,
		   x.offsets[i] AS kafka_offset
	  FROM obx.records x, array_position(x.ids, e.id) AS i
	 WHERE x.seqs @> e.seq::numeric
	   AND i IS NOT NULL
	 ORDER BY x.recorded_at + interval '0'
	 LIMIT 1) r ON true
 WHERE NOT EXISTS (SELECT 1 FROM obx.event_states s WHERE s.id = e.id)
   AND NOT EXISTS (SELECT 1 FROM obx._unpublished_events u WHERE u.id = e.id)
UNION ALL
SELECT s.id, s.seq, s.aggregate_id, s.topic, s.event_key, s.event_type,
	   s.headers, s.payload, s.occurred_at, s.published_at, s.attempts, s.failures,
	   s.next_attempt_at, s.quarantined_at, s.last_error, s.last_error_class,
	   s.last_error_at,
	   CASE WHEN s.published_at IS NOT NULL THEN r.kafka_partition END,
	   CASE WHEN s.published_at IS NOT NULL THEN r.kafka_offset END,
	   CASE WHEN s.published_at IS NOT NULL THEN 'published'
			WHEN s.id IN (SELECT x.id FROM obx._live_claims l, unnest(l.ids) AS x(id))
			THEN 'leased'
			WHEN s.quarantined_at IS NOT NULL THEN 'quarantined'
			WHEN s.last_error IS NOT NULL THEN 'failing'
			ELSE 'pending' END
  FROM obx.event_states s
  LEFT JOIN LATERAL (
	SELECT x.partitions[i] AS kafka_partition, x.offsets[i] AS kafka_offset
	  FROM obx.records x, array_position(x.ids, s.id) AS i
	 WHERE x.seqs @> s.seq::numeric
	   AND i IS NOT NULL
	   AND x.recorded_at >= coalesce(s.replayed_at, '-infinity')
	 ORDER BY x.recorded_at + interval '0'
	 LIMIT 1) r ON s.published_at IS NOT NULL
 WHERE s.skipped_at IS NULL;

/*
 * Per-topic health: the numbers to alert on, each from what is pending,
 * leased or held, never from the retained history: the unpublished events
 * as of the latest tick (obx._unpublished_events), the live leases, the
 * states, and the counts of published events (obx.published_counts).
 * published is how many events were published in the generations still
 * retained (an event published twice counts twice), and falls when a
 * generation is truncated; last_published_at the newest publish of those.
 */
CREATE OR REPLACE VIEW obx.status AS
WITH leased AS (
	SELECT DISTINCT x.id FROM obx._live_claims l, unnest(l.ids) AS x(id)
),
un AS (
	SELECT u.topic,
		   count(*) FILTER (WHERE l.id IS NULL) AS pending,
		   count(*) FILTER (WHERE l.id IS NOT NULL) AS leased,
		   min(u.occurred_at) AS oldest
	  FROM obx._unpublished_events u LEFT JOIN leased l ON l.id = u.id
	 GROUP BY u.topic
),
st AS (
	SELECT s.topic,
		   count(*) FILTER (WHERE s.published_at IS NULL AND s.skipped_at IS NULL
							AND s.quarantined_at IS NULL AND l.id IS NULL) AS pending,
		   count(*) FILTER (WHERE s.published_at IS NULL AND s.skipped_at IS NULL
							AND s.quarantined_at IS NULL AND l.id IS NOT NULL) AS leased,
		   count(*) FILTER (WHERE s.published_at IS NULL AND s.skipped_at IS NULL
							AND s.quarantined_at IS NOT NULL) AS quarantined,
		   count(*) FILTER (WHERE s.published_at IS NULL AND s.skipped_at IS NULL
							AND s.quarantined_at IS NULL AND s.last_error IS NOT NULL) AS failing,
		   min(s.occurred_at) FILTER (WHERE s.published_at IS NULL AND s.skipped_at IS NULL) AS oldest,
		   (array_agg(s.last_error ORDER BY s.last_error_at DESC)
			  FILTER (WHERE s.last_error IS NOT NULL))[1] AS last_error,
		   max(s.last_error_at) AS last_error_at,
		   max(s.published_at) AS last_published_at
	  FROM obx.event_states s LEFT JOIN leased l ON l.id = s.id
	 GROUP BY s.topic
),
pub AS (
	SELECT c.topic, sum(c.published)::bigint AS n, max(c.last_published_at) AS last_published_at
	  FROM obx.published_counts c
	 GROUP BY c.topic
),
topics AS (
	SELECT topic FROM un UNION SELECT topic FROM st UNION SELECT topic FROM pub
)
SELECT t.topic,
	   coalesce(un.pending, 0) + coalesce(st.pending, 0) AS pending,
	   coalesce(un.leased, 0) + coalesce(st.leased, 0) AS leased,
	   coalesce(pub.n, 0) AS published,
	   coalesce(st.quarantined, 0) AS quarantined,
	   coalesce(st.failing, 0) AS failing,
	   least(un.oldest, st.oldest) AS oldest_pending_at,
	   greatest(coalesce(now() - least(un.oldest, st.oldest), '0'::interval), '0'::interval)
		 AS oldest_pending_age,
	   greatest(pub.last_published_at, st.last_published_at) AS last_published_at,
	   st.last_error,
	   st.last_error_at,
	   obx._relay_problem() AS problem
  FROM topics t
  LEFT JOIN un ON un.topic = t.topic
  LEFT JOIN st ON st.topic = t.topic
  LEFT JOIN pub ON pub.topic = t.topic;

/*
 * Median and 99th percentile of the publish latency per topic over the
 * last minute, from the records of that minute (found by their index on
 * recorded_at) and each of their events (by its id).
 */
CREATE OR REPLACE VIEW obx.publish_latency_summary AS
SELECT e.topic,
	   count(*) AS events,
	   percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM x.t - e.occurred_at)) AS p50,
	   percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM x.t - e.occurred_at)) AS p99,
	   interval '1 minute' AS window_length
  FROM obx.records r
 CROSS JOIN LATERAL unnest(r.ids, r.published_at) AS x(id, t)
 CROSS JOIN LATERAL (SELECT v.topic, v.occurred_at FROM obx.events v
					  WHERE v.id = x.id LIMIT 1) e
 WHERE r.recorded_at > now() - interval '1 minute'
   AND x.t > now() - interval '1 minute'
 GROUP BY e.topic;

/*
 * Why a relay must not claim in this database, or NULL: a logical
 * replication subscription of this database writes into obx's tables
 * (partitions included), so its events are another database's, published
 * by that database's relay, and the claims and records a relay writes here
 * would mix with the replicated ones (docs/operations.md, "Logical
 * replication").  Both relays read it when they get ready and then every
 * few seconds, never per claim.  pg_subscription_rel, and pg_subscription's
 * oid and subname, are readable by every role.
 */
CREATE FUNCTION obx._replica_problem()
RETURNS text
LANGUAGE sql STABLE
AS $$
	SELECT pg_catalog.format('subscription "%s" replicates %s of obx''s tables into this database',
							 s.subname, pg_catalog.count(*))
	  FROM pg_catalog.pg_subscription_rel r
	  JOIN pg_catalog.pg_subscription s ON s.oid = r.srsubid
	  JOIN pg_catalog.pg_class c ON c.oid = r.srrelid
	 WHERE c.relnamespace = 'obx'::pg_catalog.regnamespace
	 GROUP BY s.subname
	 ORDER BY s.subname
	 LIMIT 1
$$;

REVOKE ALL ON obx.generations, obx.events, obx.claims, obx.renewals, obx.records,
	obx.published_counts, obx.event_states, obx.outbox_events, obx.status, obx.leased_events,
	obx.quarantine, obx.publish_latency_summary, obx.leases, obx._latest_tick,
	obx._unpublished_events, obx._live_claims FROM PUBLIC;
/* The era is no secret, and the status views, read as their reader, use it. */
GRANT EXECUTE ON FUNCTION obx._era() TO PUBLIC;
/* Numbers for the planner's estimates (above): the views' readers call them. */
GRANT EXECUTE ON FUNCTION obx._tick_floor(), obx._tick_lease(), obx._tick_xmax() TO PUBLIC;
REVOKE ALL ON FUNCTION obx._published_ids(bigint, bigint),
	obx._unpublished(bigint, pg_snapshot, bigint), obx._unpublished_from(bigint, bigint),
	obx._unpublished_late(bigint, pg_snapshot, bigint), obx._tick(),
	obx._live_leases(bigint, bigint),
	obx._rotate(float8), obx._hold(uuid[]), obx._replica_problem() FROM PUBLIC;

/*
 * The workers' role.  The relay and consumer workers run every statement
 * as obx.worker_role, never as a superuser: obx_worker, or a role granted
 * it.  It holds exactly what their statements need, and cannot log in.
 * Roles belong to the cluster: the first CREATE EXTENSION creates it, the
 * next ones (other databases) grant it their database's objects.  A role
 * of that name made by someone else first would be used as it is: see
 * docs/security.md, "The workers".
 */
DO $$
BEGIN
	IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'obx_worker') THEN
		CREATE ROLE obx_worker NOLOGIN;
	END IF;
END
$$;

/*
 * Statements the workers cannot be granted piecemeal run as the
 * extension's owner: the rotation (locks, TRUNCATE and sequences of every
 * generation), the ANALYZE of the outbox (only its owner may) and the
 * look-up of a handler by name (in its owner's schemas).
 */
ALTER FUNCTION obx._rotate(float8) SECURITY DEFINER;
ALTER FUNCTION obx._handler(obx.subscriptions) SECURITY DEFINER;

CREATE FUNCTION obx._analyze_events()
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	ANALYZE obx.events;
END
$$;
REVOKE ALL ON FUNCTION obx._analyze_events() FROM PUBLIC;

GRANT USAGE ON SCHEMA obx TO obx_worker;
/* The relay: claim, record, renew, release, hold, rotate, analyze. */
GRANT SELECT, INSERT ON obx.claims, obx.records, obx.renewals TO obx_worker;
GRANT INSERT ON obx.published_counts TO obx_worker;
GRANT SELECT ON obx.events TO obx_worker;
GRANT SELECT, INSERT, UPDATE ON obx.event_states TO obx_worker;
GRANT USAGE ON SEQUENCE obx.lease_seq TO obx_worker;
GRANT EXECUTE ON FUNCTION obx._published_ids(bigint, bigint),
	obx._unpublished(bigint, pg_snapshot, bigint), obx._unpublished_from(bigint, bigint),
	obx._unpublished_late(bigint, pg_snapshot, bigint), obx._tick(),
	obx._live_leases(bigint, bigint), obx._hold(uuid[]), obx._rotate(float8),
	obx._analyze_events(), obx._replica_problem() TO obx_worker;
/* The consumer: subscriptions, marks, offsets, dead letters, their purge. */
GRANT SELECT ON obx.subscriptions TO obx_worker;
GRANT SELECT, INSERT, DELETE ON obx.processed_events TO obx_worker;
GRANT SELECT, INSERT, UPDATE, DELETE ON obx.consumer_partitions,
	obx.consumer_kafka_errors TO obx_worker;
GRANT SELECT, INSERT, DELETE ON obx.dead_letters TO obx_worker;
GRANT USAGE ON SEQUENCE obx.dead_letters_id_seq TO obx_worker;
GRANT EXECUTE ON FUNCTION obx._handler(obx.subscriptions) TO obx_worker;

COMMENT ON COLUMN obx.events.era IS
	'The transaction-id space xid belongs to (obx._era() where the event was enqueued): another era''s xid means nothing here';

/* Not generation 0's row: CREATE EXTENSION makes it, and a restore would collide with it. */
SELECT pg_catalog.pg_extension_config_dump('obx.generations', 'WHERE generation <> 0');
SELECT pg_catalog.pg_extension_config_dump('obx.published_counts', '');

/* ---------------------------------------------------------------------
 * Landing: messages for a consumer that runs outside the database
 * (php artisan obx:work, docs/laravel.md).  A subscription whose handler
 * is obx.land has each new message written into obx.landed by the consumer
 * workers, in the transaction that marks it processed: it lands once.  The
 * outside worker then takes the landed rows of its consumer one at a time,
 * per key in landing order, and deletes each in the transaction that
 * commits its effect (obx.claim_landed, obx.complete_landed); a failure
 * backs off, and after max_attempts the row becomes a dead letter
 * (obx.fail_landed), which obx.replay_dead_letter lands again.
 * --------------------------------------------------------------------- */

CREATE TABLE obx.landed (
	id					bigserial	PRIMARY KEY,	/* landing order */
	consumer_name		text		COLLATE pg_catalog."C" NOT NULL,
	event_id			text		NOT NULL,
	event_type			text,
	topic				text		NOT NULL,
	kafka_partition		integer		NOT NULL,
	kafka_offset		bigint		NOT NULL,
	event_key			text		COLLATE pg_catalog."C",
	headers				jsonb,
	payload				jsonb,		/* NULL: a tombstone */
	kafka_timestamp		timestamptz,
	landed_at			timestamptz NOT NULL DEFAULT now(),
	attempts			integer		NOT NULL DEFAULT 0,
	next_attempt_at		timestamptz NOT NULL DEFAULT '-infinity',
	last_error			text
);
/*
 * How many times a worker started on a landed row: written on a second
 * connection before the listener runs (obx.start_landed), so that it
 * survives a worker killed inside the listener, whose transaction is lost.
 * No foreign key: it must not wait for the row lock the claim holds.
 */
CREATE TABLE obx.landed_starts (
	landed_id			bigint		PRIMARY KEY,
	starts				integer		NOT NULL
);

/* The claim: a consumer's rows in order, and whether a key has an earlier one. */
CREATE INDEX landed_consumer_idx ON obx.landed (consumer_name, id);
CREATE INDEX landed_key_idx ON obx.landed (consumer_name, event_key, id);

/*
 * Writes one landed row; called by obx.land alone (src/consumer/land.c).
 * At commit the consumer's waiting workers are woken: the channel is
 * obx_landed_ and the md5 of the consumer name (a channel name has at most
 * 63 bytes; a hash says nothing to a listener that does not know the name),
 * notified once per transaction however many rows it lands.
 */
CREATE FUNCTION obx._land(consumer_name text, e obx.inbound_event)
RETURNS void
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
	INSERT INTO obx.landed (consumer_name, event_id, event_type, topic, kafka_partition,
							kafka_offset, event_key, headers, payload, kafka_timestamp)
	VALUES (_land.consumer_name, (_land.e).event_id, (_land.e).event_type, (_land.e).topic,
			(_land.e).kafka_partition, (_land.e).kafka_offset, (_land.e).event_key,
			(_land.e).headers, (_land.e).payload, (_land.e).kafka_timestamp);
	SELECT pg_notify('obx_landed_' || md5(_land.consumer_name), '');
$$;

/*
 * The built-in handler that lands messages.  It lands for the consumer
 * whose handler is running and refuses to run otherwise, so anyone may
 * execute it: a role can land only into a consumer it subscribed.
 */
CREATE FUNCTION obx.land(e obx.inbound_event)
RETURNS void
AS 'MODULE_PATHNAME', 'obx_land'
LANGUAGE C VOLATILE;

/*
 * Who may take, complete or fail a consumer's landed rows: its owner, the
 * owner's members and superusers (obx.consumer_owners), as for marking.
 * The C wrappers (src/api/consumer_sql.c) pass the caller.
 */
CREATE FUNCTION obx._check_landed_owner(caller oid, consumer_name text)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	owner_role oid;
BEGIN
	SELECT o.owner INTO owner_role FROM obx.consumer_owners o
	 WHERE o.consumer_name = _check_landed_owner.consumer_name;
	IF NOT FOUND THEN
		IF NOT coalesce((SELECT r.rolsuper FROM pg_roles r WHERE r.oid = caller), false) THEN
			RAISE EXCEPTION 'no obx consumer "%"', consumer_name
				USING ERRCODE = 'undefined_object',
					  HINT = 'obx.subscribe it with the handler obx.land(obx.inbound_event) first.';
		END IF;
		RETURN;
	END IF;
	PERFORM obx._check_consumer_owner(caller, consumer_name, owner_role);
END
$$;

/*
 * claim: the consumer's next landed row, locked for the caller's
 * transaction; NULL when none is ready.  A row is ready when its backoff
 * has passed and no earlier row of its consumer and key is still landed
 * (locked by another worker, backing off, or not yet done): the effects
 * of a key's rows commit in landing order, whatever the number of
 * workers.  The row stays landed until complete or fail in the same
 * transaction; if that transaction ends otherwise (an error, a killed
 * worker) it is simply ready again.
 */
CREATE FUNCTION obx._claim_landed(caller oid, consumer_name text)
RETURNS obx.landed
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	r obx.landed;
BEGIN
	PERFORM obx._check_landed_owner(caller, consumer_name);
	/* Usually a ready row is among the first ones. */
	SELECT l.* INTO r
	  FROM obx.landed l
	 WHERE l.id IN (SELECT f.id FROM obx.landed f
					 WHERE f.consumer_name = _claim_landed.consumer_name
					 ORDER BY f.id LIMIT 100)
	   AND l.next_attempt_at <= clock_timestamp()
	   AND NOT EXISTS (SELECT 1 FROM obx.landed p
						WHERE p.consumer_name = l.consumer_name
						  AND p.event_key = l.event_key
						  AND p.id < l.id)
	 ORDER BY l.id
	 LIMIT 1
	   FOR UPDATE OF l SKIP LOCKED;
	IF FOUND THEN
		RETURN r;
	END IF;
	/*
	 * Else they wait behind a few keys' first rows (backing off, or held
	 * by other workers), and the rows behind those are no candidates: take
	 * the first row of each key, one index probe per key (a loose scan of
	 * landed_key_idx), and rows without a key.
	 */
	WITH RECURSIVE k(event_key) AS (
		SELECT min(h.event_key) FROM obx.landed h
		 WHERE h.consumer_name = _claim_landed.consumer_name
		UNION ALL
		SELECT (SELECT min(h.event_key) FROM obx.landed h
				 WHERE h.consumer_name = _claim_landed.consumer_name
				   AND h.event_key > k.event_key)
		  FROM k WHERE k.event_key IS NOT NULL
	)
	SELECT l.* INTO r
	  FROM obx.landed l
	 WHERE l.id IN (SELECT (SELECT h.id FROM obx.landed h
							 WHERE h.consumer_name = _claim_landed.consumer_name
							   AND h.event_key = k.event_key
							 ORDER BY h.id LIMIT 1)
					  FROM k WHERE k.event_key IS NOT NULL
					UNION ALL
					SELECT h.id FROM obx.landed h
					 WHERE h.consumer_name = _claim_landed.consumer_name
					   AND h.event_key IS NULL)
	   AND l.next_attempt_at <= clock_timestamp()
	 ORDER BY l.id
	 LIMIT 1
	   FOR UPDATE OF l SKIP LOCKED;
	IF NOT FOUND THEN
		RETURN NULL;
	END IF;
	RETURN r;
END
$$;

CREATE FUNCTION obx.claim_landed(consumer_name text)
RETURNS obx.landed
AS 'MODULE_PATHNAME', 'obx_claim_landed'
LANGUAGE C VOLATILE;

/*
 * start: count one more start of a worker on the row, and return the
 * count (NULL: no such row).  Called outside the claim's transaction (a
 * second connection, autocommit) once the row is claimed: a start that
 * ends in neither complete nor fail is a worker that died in the listener.
 */
CREATE FUNCTION obx._start_landed(caller oid, consumer_name text, landed_id bigint)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	n integer;
BEGIN
	PERFORM obx._check_landed_owner(caller, consumer_name);
	IF NOT EXISTS (SELECT 1 FROM obx.landed l
					WHERE l.id = _start_landed.landed_id
					  AND l.consumer_name = _start_landed.consumer_name) THEN
		RETURN NULL;
	END IF;
	INSERT INTO obx.landed_starts AS t (landed_id, starts)
	VALUES (_start_landed.landed_id, 1)
	ON CONFLICT ON CONSTRAINT landed_starts_pkey DO UPDATE SET starts = t.starts + 1
	RETURNING t.starts INTO n;
	RETURN n;
END
$$;

CREATE FUNCTION obx.start_landed(consumer_name text, landed_id bigint)
RETURNS integer
AS 'MODULE_PATHNAME', 'obx_start_landed'
LANGUAGE C VOLATILE;

/* complete: the row's effect commits with this transaction; the row goes. */
CREATE FUNCTION obx._complete_landed(caller oid, consumer_name text, landed_id bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM obx._check_landed_owner(caller, consumer_name);
	DELETE FROM obx.landed l
	 WHERE l.id = _complete_landed.landed_id
	   AND l.consumer_name = _complete_landed.consumer_name;
	IF NOT FOUND THEN
		RETURN false;
	END IF;
	DELETE FROM obx.landed_starts t WHERE t.landed_id = _complete_landed.landed_id;
	RETURN true;
END
$$;

CREATE FUNCTION obx.complete_landed(consumer_name text, landed_id bigint)
RETURNS boolean
AS 'MODULE_PATHNAME', 'obx_complete_landed'
LANGUAGE C VOLATILE;

/*
 * fail: the row's attempt failed with error (its effects rolled back).  It
 * stays first of its key and is ready again after retry_after, or, at its
 * max_attempts-th failure, moves to obx.dead_letters (class handler) and
 * its key goes on.  A dead letter of the same message replayed before is
 * pending again.  Returns 'retry' or 'dead_letter' (NULL: no such row).
 */
CREATE FUNCTION obx._fail_landed(caller oid, consumer_name text, landed_id bigint,
								 error text, max_attempts integer, retry_after interval)
RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
	r obx.landed;
BEGIN
	PERFORM obx._check_landed_owner(_fail_landed.caller, _fail_landed.consumer_name);
	IF max_attempts IS NULL OR max_attempts < 1 THEN
		RAISE EXCEPTION 'obx.fail_landed needs max_attempts of 1 or more'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	UPDATE obx.landed l
	   SET attempts = l.attempts + 1,
		   last_error = coalesce(_fail_landed.error, 'unknown error'),
		   next_attempt_at = clock_timestamp() + coalesce(_fail_landed.retry_after, '0')
	 WHERE l.id = _fail_landed.landed_id
	   AND l.consumer_name = _fail_landed.consumer_name
	RETURNING l.* INTO r;
	IF NOT FOUND THEN
		RETURN NULL;
	ELSIF r.attempts < max_attempts THEN
		RETURN 'retry';
	END IF;
	DELETE FROM obx.landed l WHERE l.id = r.id;
	DELETE FROM obx.landed_starts t WHERE t.landed_id = r.id;
	INSERT INTO obx.dead_letters AS d
		(consumer_name, event_id, topic, kafka_partition, kafka_offset, event_key,
		 event_type, headers, payload, kafka_timestamp, error_class, error_message)
	VALUES (r.consumer_name, r.event_id, r.topic, r.kafka_partition, r.kafka_offset,
			r.event_key, r.event_type, r.headers, r.payload, r.kafka_timestamp, 'handler',
			format('%s (attempt %s of max_attempts %s)', r.last_error, r.attempts, max_attempts))
	ON CONFLICT (consumer_name, topic, kafka_partition, kafka_offset) DO UPDATE
	   SET event_id = excluded.event_id, event_key = excluded.event_key,
		   event_type = excluded.event_type, headers = excluded.headers,
		   payload = excluded.payload, raw_payload = NULL,
		   kafka_timestamp = excluded.kafka_timestamp, error_class = excluded.error_class,
		   error_sqlstate = NULL, error_message = excluded.error_message,
		   failed_at = now(), replayed_at = NULL;
	RETURN 'dead_letter';
END
$$;

CREATE FUNCTION obx.fail_landed(consumer_name text, landed_id bigint, error text,
								max_attempts integer, retry_after interval)
RETURNS text
AS 'MODULE_PATHNAME', 'obx_fail_landed'
LANGUAGE C VOLATILE;

/* Per consumer: what waits for the outside worker. */
CREATE VIEW obx.landed_status AS
SELECT l.consumer_name,
	   count(*) AS landed,
	   count(*) FILTER (WHERE l.attempts > 0) AS failing,
	   count(*) FILTER (WHERE l.next_attempt_at > now()) AS backing_off,
	   min(l.landed_at) AS oldest_landed_at,
	   greatest(now() - min(l.landed_at), '0'::interval) AS oldest_landed_age
  FROM obx.landed l
 GROUP BY l.consumer_name;

/*
 * Nothing granted but obx.land (see above): an outside worker's role gets
 * EXECUTE on claim_landed, complete_landed and fail_landed, which check
 * that it acts for the consumer (docs/security.md).
 */
REVOKE ALL ON obx.landed, obx.landed_status, obx.landed_starts FROM PUBLIC;
REVOKE ALL ON SEQUENCE obx.landed_id_seq FROM PUBLIC;
REVOKE ALL ON FUNCTION obx._land(text, obx.inbound_event),
	obx._check_landed_owner(oid, text), obx._claim_landed(oid, text),
	obx._complete_landed(oid, text, bigint), obx._start_landed(oid, text, bigint),
	obx.start_landed(text, bigint),
	obx._fail_landed(oid, text, bigint, text, integer, interval),
	obx.claim_landed(text), obx.complete_landed(text, bigint),
	obx.fail_landed(text, bigint, text, integer, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION obx.land(obx.inbound_event) TO PUBLIC;

/*
 * Who owns a subscription row (obx--1.0.sql): obx._subscribe writes the
 * owner it checked as obx's owner, who is a superuser with the extension
 * but the database's owner in the SQL-only install; a row written by
 * anyone else is owned by that writer.  obx-relay runs subscriptions in
 * the SQL-only install, as their owner: the row must name the subscriber.
 */
CREATE OR REPLACE FUNCTION obx._subscription_owner()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	fn regprocedure := pg_catalog.to_regprocedure(NEW.handler);
BEGIN
	IF NOT coalesce((SELECT r.rolsuper FROM pg_catalog.pg_roles r
					  WHERE r.rolname = current_user), false)
	   AND current_user::regrole::oid <> (SELECT c.relowner FROM pg_catalog.pg_class c
										   WHERE c.oid = 'obx.subscriptions'::regclass) THEN
		NEW.owner := current_user::regrole;
		NEW.handler_owner := NULL;
	END IF;
	IF fn IS NOT NULL THEN
		NEW.handler := fn::text;
		IF NEW.handler_owner IS NULL THEN
			NEW.handler_owner := (SELECT p.proowner FROM pg_catalog.pg_proc p
								   WHERE p.oid = fn)::regrole;
		END IF;
	END IF;
	RETURN NEW;
END
$$;

/* ---------------------------------------------------------------------
 * The consumer of obx-relay (src/daemon/consume.c): one message per call
 * --------------------------------------------------------------------- */

/*
 * What a handler must be for obx-relay to call it: SECURITY DEFINER, owned
 * by the subscription's owner, with a SET search_path clause, executable
 * by that owner and by obx_handler_caller (obx._call_handler).  Outside the
 * database no one can switch to the owner the way the consumer workers do
 * (a security-restricted operation), so the function must switch itself.
 * NULL when it is fine, else why not.  See docs/consumers.md, "Consuming
 * with obx-relay".
 */
CREATE FUNCTION obx._daemon_handler_problem(s obx.subscriptions, fn regprocedure)
RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
	SELECT CASE
		WHEN NOT EXISTS (SELECT 1 FROM pg_catalog.pg_proc w
						  WHERE w.oid = pg_catalog.to_regprocedure('obx._call_handler(regprocedure, obx.inbound_event)')
							AND w.prosecdef AND pg_catalog.pg_get_userbyid(w.proowner) = 'obx_handler_caller')
		THEN 'obx._call_handler is not a SECURITY DEFINER function of role obx_handler_caller, which the install could not give it (see its warning)'
		WHEN p.oid IS NULL
		THEN coalesce(obx._subscription_problem(s), 'its handler no longer exists')
		WHEN NOT p.prosecdef OR p.proowner <> s.owner
		THEN pg_catalog.format('its handler %s must be SECURITY DEFINER and owned by the subscription''s owner %s',
							   fn, s.owner)
		WHEN NOT EXISTS (SELECT 1 FROM pg_catalog.unnest(p.proconfig) c
						  WHERE c LIKE 'search\_path=%')
		THEN pg_catalog.format('its handler %s must have a SET search_path clause', fn)
		WHEN NOT pg_catalog.has_function_privilege(s.owner, fn, 'EXECUTE')
		THEN pg_catalog.format('the subscription''s owner %s may not execute its handler %s', s.owner, fn)
		WHEN NOT pg_catalog.has_schema_privilege('obx_handler_caller', p.pronamespace, 'USAGE')
			 OR NOT pg_catalog.has_function_privilege('obx_handler_caller', fn, 'EXECUTE')
		THEN pg_catalog.format('role obx_handler_caller needs USAGE on schema %s and EXECUTE on its handler %s',
							   p.pronamespace::regnamespace, fn)
	END
	  FROM (SELECT 1) AS one
	  LEFT JOIN pg_catalog.pg_proc p ON p.oid = fn
$$;

/*
 * obx-relay calls a handler through this function, as its owner
 * obx_handler_caller: a role that can log in to nothing, read nothing and
 * change nothing.  A handler that meets the rule above runs as its own
 * owner all the same.  One that a CREATE OR REPLACE turned into SECURITY
 * INVOKER between that check and the call would run as its caller: here
 * that is obx_handler_caller, not the daemon's role with obx_worker's
 * rights, and inside a SECURITY DEFINER function it cannot SET ROLE back.
 * (obx._consume rolls such a call back as well, see there.)
 */
DO $$
BEGIN
	IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'obx_handler_caller') THEN
		CREATE ROLE obx_handler_caller NOLOGIN;
	END IF;
END
$$;

CREATE FUNCTION obx._call_handler(fn regprocedure, ev obx.inbound_event)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	call text;
BEGIN
	SELECT pg_catalog.format('SELECT %I.%I($1)', n.nspname, p.proname) INTO STRICT call
	  FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
	 WHERE p.oid = fn;
	EXECUTE call USING ev;
END
$$;
REVOKE ALL ON FUNCTION obx._call_handler(regprocedure, obx.inbound_event) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION obx._call_handler(regprocedure, obx.inbound_event) TO obx_worker;

/*
 * It becomes obx_handler_caller's, and only then SECURITY DEFINER: never
 * a SECURITY DEFINER function of the installer's, which would run a
 * handler as obx's owner.  Its privileges are set first: once it is
 * obx_handler_caller's, its former owner may no longer change them.
 * Unless a superuser gives it, the giver must be able to SET ROLE to the
 * new owner (for as long as it takes: a member would inherit the USAGE
 * subscribers grant it), and the new owner needs CREATE on the schema.
 * An installer that cannot (obx_handler_caller made by another role, no
 * CREATEROLE) leaves it as it is, and obx-relay runs no subscription in
 * this database until it is given (obx._daemon_handler_problem).
 */
DO $$
DECLARE
	lent boolean;
BEGIN
	/* From 16 on a member may lack SET (a CREATEROLE creator holds ADMIN only). */
	IF pg_catalog.current_setting('server_version_num')::integer >= 160000 THEN
		lent := NOT pg_catalog.pg_has_role('obx_handler_caller', 'SET');
	ELSE
		lent := NOT pg_catalog.pg_has_role('obx_handler_caller', 'MEMBER');
	END IF;
	BEGIN
		IF lent THEN
			EXECUTE pg_catalog.format('GRANT obx_handler_caller TO %I', current_user);
		END IF;
		GRANT CREATE ON SCHEMA obx TO obx_handler_caller;
		ALTER FUNCTION obx._call_handler(regprocedure, obx.inbound_event) OWNER TO obx_handler_caller;
		ALTER FUNCTION obx._call_handler(regprocedure, obx.inbound_event) SECURITY DEFINER;
		REVOKE CREATE ON SCHEMA obx FROM obx_handler_caller;
		IF lent THEN
			EXECUTE pg_catalog.format('REVOKE obx_handler_caller FROM %I', current_user);
		END IF;
	EXCEPTION WHEN insufficient_privilege THEN
		RAISE WARNING 'obx-relay will run no subscription in database "%": role "%" could not give obx._call_handler to role obx_handler_caller',
			pg_catalog.current_database(), current_user
			USING HINT = 'Once, as a superuser or a role that may SET ROLE obx_handler_caller: '
						 'ALTER FUNCTION obx._call_handler(regprocedure, obx.inbound_event) OWNER TO obx_handler_caller; '
						 'ALTER FUNCTION obx._call_handler(regprocedure, obx.inbound_event) SECURITY DEFINER;';
	END;
END
$$;

/*
 * One Kafka message of a subscription, applied in the caller's
 * transaction, as the consumer workers apply a message alone
 * (src/consumer/inbox.c): the event built (src/consumer/inbound.c), the
 * mark, the handler, a dead letter, and the partition's row of
 * obx.consumer_partitions (src/consumer/progress.c).  The caller commits,
 * then stores the offset past the message; on 'retry' or 'refused' it
 * holds the partition and reads the message again after a backoff.
 *
 * event_key and the header values come as text: the bytes as they are
 * when valid UTF-8, else "\x" and their hex (the caller decides).
 * handler_failures: how many times the handler failed transiently on this
 * message before (for max_attempts); timed_out_ms, when not 0: the
 * caller's call of this message was cancelled after the subscription's
 * handler_timeout_ms, so the message is dead-lettered without a call.
 *
 * result: 'processed', 'duplicate', 'dead letter', 'retry' (a transient
 * error of the handler: rolled back, counted in retries) or 'refused' (the
 * subscription cannot be served now: its handler was not called); error
 * says why for the last three.
 */
CREATE FUNCTION obx._consume(consumer_name text, topic text, kafka_partition integer,
							 kafka_offset bigint, event_key text, header_names text[],
							 header_values text[], value bytea, kafka_timestamp timestamptz,
							 handler_failures integer, timed_out_ms integer,
							 OUT result text, OUT error text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
	s obx.subscriptions;
	fn regprocedure;
	ev obx.inbound_event;
	malformed text;
	is_json boolean := false;
	code text;
	msg text;
	transient boolean;
	problem text;
	max_attempts integer;
	version xid;
BEGIN
	SELECT * INTO s FROM obx.subscriptions x WHERE x.consumer_name = _consume.consumer_name;
	IF NOT FOUND THEN
		result := 'refused';
		error := 'the subscription no longer exists';
		RETURN;
	END IF;

	/* The event (inbound.c): headers, id, type, payload. */
	ev.topic := _consume.topic;
	ev.kafka_partition := _consume.kafka_partition;
	ev.kafka_offset := _consume.kafka_offset;
	ev.event_key := _consume.event_key;
	ev.kafka_timestamp := _consume.kafka_timestamp;
	/* One pass over the headers; a name given twice: its last value. */
	SELECT coalesce(jsonb_object_agg(h.n, h.v ORDER BY h.i), '{}'),
		   nullif((array_agg(h.v ORDER BY h.i DESC) FILTER (WHERE h.n = 'event_id'))[1], ''),
		   (array_agg(h.v ORDER BY h.i DESC) FILTER (WHERE h.n = 'event_type'))[1]
	  INTO ev.headers, ev.event_id, ev.event_type
	  FROM unnest(header_names, header_values) WITH ORDINALITY AS h(n, v, i);
	IF value IS NULL AND ev.event_id IS NULL THEN
		malformed := 'message has no value (a tombstone) and no event_id header';
	ELSIF value IS NOT NULL THEN
		BEGIN
			ev.payload := convert_from(value, current_setting('server_encoding'))::jsonb;
			is_json := true;
		EXCEPTION
			WHEN character_not_in_repertoire OR untranslatable_character THEN
				malformed := 'payload is not JSON: message value is not valid '
							 || current_setting('server_encoding');
			WHEN others THEN
				GET STACKED DIAGNOSTICS msg = MESSAGE_TEXT;
				malformed := 'payload is not JSON: ' || msg;
		END;
	END IF;
	IF is_json AND jsonb_typeof(ev.payload) = 'object' THEN
		IF ev.event_id IS NULL THEN
			ev.event_id := CASE WHEN jsonb_typeof(ev.payload -> 'eventId') = 'string'
								THEN nullif(ev.payload ->> 'eventId', '') END;
		END IF;
		IF ev.event_id IS NULL THEN
			ev.event_id := CASE WHEN jsonb_typeof(ev.payload -> 'event_id') = 'string'
								THEN nullif(ev.payload ->> 'event_id', '') END;
		END IF;
		IF ev.event_type IS NULL THEN
			ev.event_type := CASE WHEN jsonb_typeof(ev.payload -> 'eventType') = 'string'
								  THEN nullif(ev.payload ->> 'eventType', '') END;
		END IF;
	END IF;
	IF octet_length(ev.event_id) > 512 THEN
		/* The dedupe index could never hold it (inbound.h, OBX_MAX_EVENT_ID_LEN). */
		malformed := format('event id is not valid: %s bytes, at most 512 allowed',
							octet_length(ev.event_id));
		ev.event_id := NULL;
	ELSIF malformed IS NULL AND ev.event_id IS NULL THEN
		malformed := 'no event id: no event_id header and no eventId or event_id field in the payload';
	END IF;

	IF malformed IS NOT NULL THEN
		/* A duplicate if its id is known, else a dead letter (inbox.c). */
		IF ev.event_id IS NOT NULL THEN
			INSERT INTO obx.processed_events AS p (consumer_name, event_id)
			VALUES (_consume.consumer_name, ev.event_id) ON CONFLICT DO NOTHING;
			IF NOT FOUND THEN
				result := 'duplicate';
			END IF;
		END IF;
		IF result IS NULL THEN
			result := 'dead letter';
			error := malformed;
			INSERT INTO obx.dead_letters AS d
				(consumer_name, event_id, topic, kafka_partition, kafka_offset, event_key,
				 event_type, headers, payload, raw_payload, kafka_timestamp, error_class,
				 error_sqlstate, error_message)
			VALUES (_consume.consumer_name, ev.event_id, ev.topic, ev.kafka_partition,
					ev.kafka_offset, ev.event_key, ev.event_type, ev.headers,
					CASE WHEN is_json THEN ev.payload END,
					CASE WHEN NOT is_json THEN value END, ev.kafka_timestamp, 'malformed',
					NULL, malformed)
			ON CONFLICT (consumer_name, topic, kafka_partition, kafka_offset) DO NOTHING;
		END IF;
	ELSIF timed_out_ms > 0 THEN
		/* As the consumer workers dead-letter a handler past its timeout (handler.c). */
		code := '57014';
		msg := format('obx handler %s ran longer than its timeout of %s ms and was cancelled',
					  s.handler, timed_out_ms);
		result := 'dead letter';
	ELSE
		fn := obx._handler(s);
		problem := obx._daemon_handler_problem(s, fn);
		IF problem IS NOT NULL THEN
			result := 'refused';
			error := format('obx-relay cannot run subscription "%s": %s', s.consumer_name, problem);
		END IF;
	END IF;

	IF result IS NULL AND malformed IS NULL THEN
		SELECT p.xmin INTO version FROM pg_catalog.pg_proc p WHERE p.oid = fn;
		BEGIN
			/* The mark and the handler's work: all or nothing (inbox.c). */
			INSERT INTO obx.processed_events AS p (consumer_name, event_id)
			VALUES (_consume.consumer_name, ev.event_id) ON CONFLICT DO NOTHING;
			IF NOT FOUND THEN
				result := 'duplicate';
			ELSE
				PERFORM obx._call_handler(fn, ev);
				result := 'processed';
			END IF;
		EXCEPTION WHEN others THEN
			/*
			 * Not query_canceled: the caller's statement_timeout is the
			 * handler's timeout, and a cancel fails the whole call.
			 */
			GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
			/* is_transient (inbox.c) */
			transient := left(code, 2) IN ('40', '08', '53') OR code IN ('55P03', '57014')
						 OR code IN (SELECT x FROM jsonb_array_elements_text(
										CASE WHEN jsonb_typeof(s.options -> 'retry_sqlstates') = 'array'
											 THEN s.options -> 'retry_sqlstates' END) x);
			max_attempts := CASE WHEN jsonb_typeof(s.options -> 'max_attempts') = 'number'
								 THEN (s.options ->> 'max_attempts')::integer END;
			IF transient AND (max_attempts IS NULL OR handler_failures + 1 < max_attempts) THEN
				result := 'retry';
				error := code || ': ' || msg;
			ELSE
				IF transient THEN
					msg := format('%s (attempt %s of max_attempts %s)', msg,
								  handler_failures + 1, max_attempts);
				END IF;
				result := 'dead letter';
			END IF;
		END;
	END IF;

	/*
	 * A handler's error or timeout: the mark (the handler's own was rolled
	 * back with it, or never made) and the dead letter, unless the event
	 * was marked meanwhile.
	 */
	IF result = 'dead letter' AND malformed IS NULL THEN
		INSERT INTO obx.processed_events AS p (consumer_name, event_id)
		VALUES (_consume.consumer_name, ev.event_id) ON CONFLICT DO NOTHING;
		IF NOT FOUND THEN
			result := 'duplicate';
		ELSE
			error := code || ': ' || msg;
			INSERT INTO obx.dead_letters AS d
				(consumer_name, event_id, topic, kafka_partition, kafka_offset, event_key,
				 event_type, headers, payload, raw_payload, kafka_timestamp, error_class,
				 error_sqlstate, error_message)
			VALUES (_consume.consumer_name, ev.event_id, ev.topic, ev.kafka_partition,
					ev.kafka_offset, ev.event_key, ev.event_type, ev.headers, ev.payload,
					NULL, ev.kafka_timestamp, 'handler', code, msg)
			ON CONFLICT (consumer_name, topic, kafka_partition, kafka_offset) DO NOTHING;
		END IF;
	END IF;

	/*
	 * The function checked above is the one that ran: a concurrent CREATE
	 * OR REPLACE (say, without SECURITY DEFINER, to run as the caller) rolls
	 * the whole call back.
	 */
	IF version IS NOT NULL AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_proc p
											WHERE p.oid = fn AND p.xmin = version) THEN
		RAISE EXCEPTION 'obx handler % changed while it ran', fn
			USING ERRCODE = '40001';
	END IF;

	/* The partition's row (progress.c): position and counts, or a retry. */
	IF result IN ('retry', 'refused') THEN
		INSERT INTO obx.consumer_partitions AS p
			(consumer_name, topic, kafka_partition, retries, last_error_class, last_error,
			 last_error_at)
		VALUES (_consume.consumer_name, _consume.topic, _consume.kafka_partition,
				1, 'transient', error, now())
		ON CONFLICT (consumer_name, topic, kafka_partition) DO UPDATE
		   SET retries = p.retries + 1, last_error_class = 'transient',
			   last_error = excluded.last_error, last_error_at = now();
	ELSE
		INSERT INTO obx.consumer_partitions AS p
			(consumer_name, topic, kafka_partition, next_offset, processed, duplicates,
			 dead_lettered, last_event_id, last_processed_at, last_error_class, last_error,
			 last_error_at)
		VALUES (_consume.consumer_name, _consume.topic, _consume.kafka_partition,
				_consume.kafka_offset + 1, (result = 'processed')::int,
				(result = 'duplicate')::int, (result = 'dead letter')::int, ev.event_id, now(),
				CASE WHEN error IS NOT NULL THEN CASE WHEN malformed IS NOT NULL
					 THEN 'malformed' ELSE 'handler' END END,
				error, CASE WHEN error IS NOT NULL THEN now() END)
		ON CONFLICT (consumer_name, topic, kafka_partition) DO UPDATE
		   SET next_offset = excluded.next_offset,
			   processed = p.processed + excluded.processed,
			   duplicates = p.duplicates + excluded.duplicates,
			   dead_lettered = p.dead_lettered + excluded.dead_lettered,
			   last_event_id = coalesce(excluded.last_event_id, p.last_event_id),
			   last_processed_at = excluded.last_processed_at,
			   last_error_class = coalesce(excluded.last_error_class, p.last_error_class),
			   last_error = coalesce(excluded.last_error, p.last_error),
			   last_error_at = coalesce(excluded.last_error_at, p.last_error_at);
	END IF;
	/*
	 * Its commit is durable before the caller stores the offset, whatever
	 * the handler set for the session (a SET there outlives the call).
	 */
	PERFORM set_config('synchronous_commit', 'on', true);
END
$$;

/* obx-relay's role (a member of obx_worker) only. */
REVOKE ALL ON FUNCTION obx._daemon_handler_problem(obx.subscriptions, regprocedure),
	obx._consume(text, text, integer, bigint, text, text[], text[], bytea, timestamptz,
				 integer, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION obx._daemon_handler_problem(obx.subscriptions, regprocedure),
	obx._consume(text, text, integer, bigint, text, text[], text[], bytea, timestamptz,
				 integer, integer) TO obx_worker;

COMMENT ON TABLE obx.landed IS
	'Messages landed by the handler obx.land for a consumer outside the database (obx:work), until it completes them';
COMMENT ON VIEW obx.landed_status IS
	'Per consumer outside the database: landed messages waiting, failing, backing off, and the age of the oldest';
COMMENT ON FUNCTION obx.land(obx.inbound_event) IS
	'Handler that lands each message in obx.landed for a worker outside the database; only runs as a subscription''s handler';
COMMENT ON FUNCTION obx.claim_landed(text) IS
	'Lock and return the consumer''s next landed row ready to run (per key in landing order), or NULL';
COMMENT ON TABLE obx.landed_starts IS
	'How many times a worker started on each landed row, counted outside its transaction so that a killed worker counts';
COMMENT ON FUNCTION obx.start_landed(text, bigint) IS
	'Count a start on a claimed landed row (from a second connection, before the listener runs); returns the count';
COMMENT ON FUNCTION obx.complete_landed(text, bigint) IS
	'Delete a landed row in the transaction that commits its effect';
COMMENT ON FUNCTION obx.fail_landed(text, bigint, text, integer, interval) IS
	'Record a failed attempt of a landed row: retry after a backoff, or at max_attempts move it to obx.dead_letters';

SELECT pg_catalog.pg_extension_config_dump('obx.landed', '');
SELECT pg_catalog.pg_extension_config_dump('obx.landed_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('obx.landed_starts', '');
