/* obx--1.0.sql: the transactional outbox, the inbox, and their SQL surface */

\echo Use "CREATE EXTENSION obx" to load this file. \quit

/*
 * Enqueue order.  CACHE 1 (the default) matters: with a per-backend cache,
 * two sessions could draw numbers out of the order in which they called
 * nextval, and per-key order is defined by this sequence.
 */
CREATE SEQUENCE obx.event_seq CACHE 1;

/* Lease identifiers: one per claimed batch, used to fence stale workers. */
CREATE SEQUENCE obx.lease_seq;

CREATE TABLE obx.outbox_events (
	id					uuid		PRIMARY KEY,
	seq					bigint		NOT NULL DEFAULT nextval('obx.event_seq'),
	aggregate_id		text		NOT NULL,
	topic				text		NOT NULL,
	event_key			text		NOT NULL,
	event_type			text,
	headers				jsonb,
	payload				jsonb		NOT NULL,
	occurred_at			timestamptz NOT NULL DEFAULT clock_timestamp(),
	published_at		timestamptz,
	attempts			integer		NOT NULL DEFAULT 0,
	failures			integer		NOT NULL DEFAULT 0,
	next_attempt_at		timestamptz NOT NULL DEFAULT '-infinity',
	lease_id			bigint,
	lease_owner			integer,
	lease_until			timestamptz,
	quarantined_at		timestamptz,
	last_error			text,
	last_error_class	text,
	last_error_at		timestamptz,
	kafka_partition		integer,
	kafka_offset		bigint
);

/*
 * Every event is inserted, leased, marked published, and purged after
 * obx.retention: three dead row versions per event.  A vacuum that keeps up
 * with a queue-like table, and free space per page for the new versions,
 * keep it from bloating.
 */
ALTER TABLE obx.outbox_events SET (
	fillfactor = 80,
	autovacuum_vacuum_scale_factor = 0.01,
	autovacuum_vacuum_threshold = 1000,
	autovacuum_vacuum_insert_scale_factor = 0.01,
	autovacuum_analyze_scale_factor = 0.02,
	autovacuum_vacuum_cost_delay = 0
);

COMMENT ON TABLE obx.outbox_events IS
	'Events waiting for Kafka (published_at IS NULL) and, for obx.retention, the published ones';
COMMENT ON COLUMN obx.outbox_events.seq IS
	'Enqueue order; events of one topic and key are published in this order';
COMMENT ON COLUMN obx.outbox_events.attempts IS
	'Times the relay claimed the event to publish it';
COMMENT ON COLUMN obx.outbox_events.failures IS
	'Failed attempts that count toward obx.max_attempts (not transient ones)';

/* What the relay scans: unpublished events in enqueue order. */
CREATE INDEX outbox_events_pending_idx
	ON obx.outbox_events (seq) WHERE published_at IS NULL;
/*
 * Events in flight or failing: what blocks their key.  Stays small, since
 * it holds only unpublished events that are leased, backing off or
 * quarantined (see src/outbox.c).
 */
CREATE INDEX outbox_events_active_idx
	ON obx.outbox_events (topic, event_key)
	WHERE published_at IS NULL
	  AND (lease_until IS NOT NULL OR next_attempt_at > '-infinity'
		   OR quarantined_at IS NOT NULL);
/* Retention purge of published events. */
CREATE INDEX outbox_events_published_idx
	ON obx.outbox_events (published_at) WHERE published_at IS NOT NULL;

CREATE TABLE obx.processed_events (
	consumer_name		text		NOT NULL,
	event_id			text		NOT NULL,
	processed_at		timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (consumer_name, event_id)
);

CREATE INDEX processed_events_processed_at_idx
	ON obx.processed_events (processed_at);

COMMENT ON TABLE obx.processed_events IS
	'Dedupe history of consumers: one row per (consumer, event) whose effect happened';

/* pg_dump must keep pending events and the dedupe history. */
SELECT pg_catalog.pg_extension_config_dump('obx.outbox_events', '');
SELECT pg_catalog.pg_extension_config_dump('obx.event_seq', '');
SELECT pg_catalog.pg_extension_config_dump('obx.processed_events', '');

CREATE FUNCTION obx.enqueue(
	topic text,
	event_key text,
	payload jsonb,
	aggregate_id text DEFAULT NULL,
	event_type text DEFAULT NULL,
	headers jsonb DEFAULT NULL,
	event_id uuid DEFAULT NULL)
RETURNS uuid
AS 'MODULE_PATHNAME', 'obx_enqueue'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION obx.enqueue(text, text, jsonb, text, text, jsonb, uuid) IS
	'Store an event in the outbox inside the current transaction; returns its id';

CREATE FUNCTION obx._wake_at_commit()
RETURNS void
AS 'MODULE_PATHNAME', 'obx_wake'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

/*
 * mark_processed: true the first time a consumer sees an event, false for
 * a duplicate.  ON CONFLICT DO NOTHING waits for a concurrent insert of the
 * same pair and then reports false if that transaction committed, true if
 * it rolled back: exactly one of two racing transactions gets true.
 */
CREATE FUNCTION obx.mark_processed(consumer_name text, event_id text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	inserted integer;
BEGIN
	IF consumer_name IS NULL THEN
		RAISE EXCEPTION 'obx consumer name must not be null'
			USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF event_id IS NULL THEN
		RAISE EXCEPTION 'obx event id must not be null'
			USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF consumer_name = '' THEN
		RAISE EXCEPTION 'obx consumer name must not be empty'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	IF event_id = '' THEN
		RAISE EXCEPTION 'obx event id must not be empty'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	INSERT INTO obx.processed_events AS p (consumer_name, event_id)
	VALUES (mark_processed.consumer_name, mark_processed.event_id)
	ON CONFLICT DO NOTHING;
	GET DIAGNOSTICS inserted = ROW_COUNT;
	RETURN inserted = 1;
END
$$;

COMMENT ON FUNCTION obx.mark_processed(text, text) IS
	'Record that a consumer processed an event: true the first time, false for a duplicate';

/*
 * retry: make a quarantined (or backing-off) event publishable now.
 */
CREATE FUNCTION obx.retry(event_id uuid)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	n integer;
BEGIN
	UPDATE obx.outbox_events e
	   SET quarantined_at = NULL, attempts = 0, failures = 0, next_attempt_at = '-infinity'
	 WHERE e.id = retry.event_id
	   AND e.published_at IS NULL
	   AND (e.quarantined_at IS NOT NULL OR e.next_attempt_at > now());
	GET DIAGNOSTICS n = ROW_COUNT;
	IF n > 0 THEN
		PERFORM obx._wake_at_commit();
	END IF;
	RETURN n > 0;
END
$$;

COMMENT ON FUNCTION obx.retry(uuid) IS
	'Make a quarantined or backing-off event publishable now; false if it is neither';

CREATE FUNCTION obx.retry_quarantined(topic text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	n bigint;
BEGIN
	UPDATE obx.outbox_events e
	   SET quarantined_at = NULL, attempts = 0, failures = 0, next_attempt_at = '-infinity'
	 WHERE e.published_at IS NULL
	   AND e.quarantined_at IS NOT NULL
	   AND (retry_quarantined.topic IS NULL OR e.topic = retry_quarantined.topic);
	GET DIAGNOSTICS n = ROW_COUNT;
	IF n > 0 THEN
		PERFORM obx._wake_at_commit();
	END IF;
	RETURN n;
END
$$;

COMMENT ON FUNCTION obx.retry_quarantined(text) IS
	'Retry every quarantined event, or those of one topic; returns how many';

/*
 * skip: give up on a quarantined event for good.  It leaves the outbox for
 * obx.skipped_events, with the reason and who skipped it, so its key moves
 * on and the decision stays on record.
 */
CREATE TABLE obx.skipped_events (
	LIKE obx.outbox_events,
	skipped_at			timestamptz NOT NULL DEFAULT now(),
	skipped_by			name		NOT NULL DEFAULT session_user,
	skip_reason			text		NOT NULL
);

COMMENT ON TABLE obx.skipped_events IS
	'Quarantined events an operator decided never to publish (obx.skip)';

SELECT pg_catalog.pg_extension_config_dump('obx.skipped_events', '');

CREATE FUNCTION obx.skip(event_id uuid, reason text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	n integer;
BEGIN
	IF reason IS NULL OR reason = '' THEN
		RAISE EXCEPTION 'obx skip needs a reason'
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'Say why the event will never be published; it is kept in obx.skipped_events.';
	END IF;
	WITH gone AS (
		DELETE FROM obx.outbox_events e
		 WHERE e.id = skip.event_id
		   AND e.published_at IS NULL
		   AND e.quarantined_at IS NOT NULL
		RETURNING e.*
	)
	INSERT INTO obx.skipped_events
	SELECT gone.*, now(), session_user, skip.reason FROM gone;
	GET DIAGNOSTICS n = ROW_COUNT;
	IF n > 0 THEN
		PERFORM obx._wake_at_commit();
	END IF;
	RETURN n > 0;
END
$$;

COMMENT ON FUNCTION obx.skip(uuid, text) IS
	'Give up on a quarantined event: move it to obx.skipped_events so its key moves on';

/*
 * replay: publish already-published events again, with the same ids.
 * They keep their place in enqueue order, so a replayed event of a key is
 * sent before that key's events still pending.
 */
CREATE FUNCTION obx.replay(event_ids uuid[])
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	n bigint;
BEGIN
	UPDATE obx.outbox_events e
	   SET published_at = NULL, kafka_partition = NULL, kafka_offset = NULL,
		   attempts = 0, failures = 0, next_attempt_at = '-infinity',
		   lease_id = NULL, lease_owner = NULL, lease_until = NULL
	 WHERE e.id = ANY (replay.event_ids)
	   AND e.published_at IS NOT NULL;
	GET DIAGNOSTICS n = ROW_COUNT;
	IF n > 0 THEN
		PERFORM obx._wake_at_commit();
	END IF;
	RETURN n;
END
$$;

CREATE FUNCTION obx.replay(topic text, since timestamptz,
						   until timestamptz DEFAULT 'infinity')
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
	SELECT obx.replay(coalesce(array_agg(e.id), '{}'))
	  FROM obx.outbox_events e
	 WHERE e.topic = replay.topic
	   AND e.published_at IS NOT NULL
	   AND e.occurred_at >= replay.since
	   AND e.occurred_at < replay.until;
$$;

COMMENT ON FUNCTION obx.replay(uuid[]) IS
	'Publish these already-published events again with the same ids; returns how many';
COMMENT ON FUNCTION obx.replay(text, timestamptz, timestamptz) IS
	'Publish again the events of a topic that occurred in [since, until); returns how many';

/* Per-topic health: the numbers to alert on. */
CREATE VIEW obx.status AS
SELECT e.topic,
	   count(*) FILTER (WHERE e.published_at IS NULL AND e.quarantined_at IS NULL
						AND (e.lease_until IS NULL OR e.lease_until < now())) AS pending,
	   count(*) FILTER (WHERE e.published_at IS NULL AND e.quarantined_at IS NULL
						AND e.lease_until >= now()) AS leased,
	   count(*) FILTER (WHERE e.published_at IS NOT NULL) AS published,
	   count(*) FILTER (WHERE e.quarantined_at IS NOT NULL
						AND e.published_at IS NULL) AS quarantined,
	   count(*) FILTER (WHERE e.published_at IS NULL AND e.quarantined_at IS NULL
						AND e.last_error IS NOT NULL) AS failing,
	   min(e.occurred_at) FILTER (WHERE e.published_at IS NULL) AS oldest_pending_at,
	   greatest(coalesce(now() - min(e.occurred_at) FILTER (WHERE e.published_at IS NULL),
						 '0'::interval), '0'::interval) AS oldest_pending_age,
	   max(e.published_at) AS last_published_at,
	   (array_agg(e.last_error ORDER BY e.last_error_at DESC)
		  FILTER (WHERE e.last_error IS NOT NULL))[1] AS last_error,
	   max(e.last_error_at) AS last_error_at
  FROM obx.outbox_events e
 GROUP BY e.topic;

COMMENT ON VIEW obx.status IS
	'Per topic: pending, leased, published (still retained), quarantined, age of the oldest unpublished event, last error';

CREATE VIEW obx.quarantine AS
SELECT e.id, e.topic, e.event_key, e.event_type, e.attempts,
	   e.last_error_class, e.last_error, e.quarantined_at, e.occurred_at
  FROM obx.outbox_events e
 WHERE e.quarantined_at IS NOT NULL AND e.published_at IS NULL;

COMMENT ON VIEW obx.quarantine IS
	'Events the relay gave up on, with their errors; obx.retry(id) sends one again';

CREATE FUNCTION obx.worker_status(
	OUT worker integer,
	OUT pid integer,
	OUT state text,
	OUT batches bigint,
	OUT published bigint,
	OUT errors bigint,
	OUT started_at timestamptz,
	OUT last_success_at timestamptz,
	OUT last_error_at timestamptz,
	OUT last_error text,
	OUT events_per_second float8)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'obx_worker_status'
LANGUAGE C VOLATILE;

CREATE VIEW obx.workers AS SELECT * FROM obx.worker_status();

COMMENT ON VIEW obx.workers IS
	'One row per relay worker: state, counters, events/s, last success and last error';

/*
 * Privileges: nothing is granted to PUBLIC.  An application role gets
 * USAGE on the schema and EXECUTE on obx.enqueue (which runs as the
 * extension owner and can only insert validated events); a consumer role
 * gets EXECUTE on obx.mark_processed; an operator gets EXECUTE on retry,
 * retry_quarantined, replay and skip (which run as the extension owner
 * too); monitoring gets SELECT on the views.
 */
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA obx FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA obx FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA obx FROM PUBLIC;

/*
 * A function called by a view is checked against the user querying the
 * view, so whoever may read obx.workers must be able to execute
 * obx.worker_status.  It shows relay state only, and USAGE on schema obx
 * still gates it.
 */
GRANT EXECUTE ON FUNCTION obx.worker_status() TO PUBLIC;
