/* obx--1.0.sql: the transactional outbox, the inbox, and their SQL surface */

\echo Use "CREATE EXTENSION obx" to load this file. \quit

/*
 * The whole schema of obx 1.0, in this order: sequences and tables, their
 * indexes, the functions, the views, privileges, comments, and what
 * pg_dump keeps.  Upgrade scripts (obx--1.0--X.sql) start with the first
 * release after 1.0.
 */

/* ---------------------------------------------------------------------
 * The outbox: tables
 * --------------------------------------------------------------------- */

/*
 * Enqueue order.  CACHE 1 (the default) matters: with a per-backend cache,
 * two sessions could draw numbers out of the order in which they called
 * nextval, and per-key order is defined by this sequence.
 */
CREATE SEQUENCE obx.event_seq CACHE 1;

/* Lease identifiers: one per claimed batch, used to fence stale workers. */
CREATE SEQUENCE obx.lease_seq;

/*
 * The outbox.  Every event is inserted, marked published, and purged after
 * obx.retention.  A vacuum that keeps up with a queue-like table, and free
 * space per page for the new row versions, keep it from bloating.
 */
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
	quarantined_at		timestamptz,
	last_error			text,
	last_error_class	text,
	last_error_at		timestamptz,
	kafka_partition		integer,
	kafka_offset		bigint
) WITH (
	fillfactor = 80,
	autovacuum_vacuum_scale_factor = 0.01,
	autovacuum_vacuum_threshold = 1000,
	autovacuum_vacuum_insert_scale_factor = 0.01,
	autovacuum_analyze_scale_factor = 0.02,
	autovacuum_vacuum_cost_delay = 0
);

/*
 * Per-batch leases.  A claim writes one row here for the whole batch: its
 * events' ids and their topics and keys, which block those keys for other
 * claims while the lease lasts.  An event is then written once, when it is
 * published (or fails).  See src/outbox.c.
 */
CREATE TABLE obx.leases (
	lease_id			bigint		PRIMARY KEY,
	owner				integer		NOT NULL,
	until				timestamptz NOT NULL,
	claimed_at			timestamptz NOT NULL DEFAULT now(),
	ids					uuid[]		NOT NULL,
	topics				text[]		NOT NULL,
	keys				text[]		NOT NULL
);

/*
 * skip gives up on a quarantined event for good.  It leaves the outbox for
 * obx.skipped_events, with the reason and who skipped it, so its key moves
 * on and the decision stays on record.  obx.skip copies outbox rows into
 * it column for column.
 */
CREATE TABLE obx.skipped_events (
	LIKE obx.outbox_events,
	skipped_at			timestamptz NOT NULL DEFAULT now(),
	skipped_by			name		NOT NULL DEFAULT session_user,
	skip_reason			text		NOT NULL
);

/* ---------------------------------------------------------------------
 * The inbox: tables and the handler's argument type
 * --------------------------------------------------------------------- */

CREATE TABLE obx.processed_events (
	consumer_name		text		NOT NULL,
	event_id			text		NOT NULL,
	processed_at		timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (consumer_name, event_id)
);

/*
 * What a subscription handler receives, one Kafka message at a time.  The
 * event id comes from the event_id header, else the payload's eventId or
 * event_id field (see docs/consumers.md).
 */
CREATE TYPE obx.inbound_event AS (
	event_id			text,
	event_type			text,
	topic				text,
	kafka_partition		integer,
	kafka_offset		bigint,
	event_key			text,
	headers				jsonb,
	payload				jsonb,
	kafka_timestamp		timestamptz
);

CREATE TABLE obx.subscriptions (
	consumer_name		text		PRIMARY KEY
		CHECK (consumer_name ~ '^[A-Za-z0-9._-]{1,200}$'),
	topics				text[]		NOT NULL
		CHECK (cardinality(topics) > 0),
	handler				regprocedure NOT NULL,
	options				jsonb		NOT NULL DEFAULT '{}',
	owner				regrole		NOT NULL,
	created_at			timestamptz NOT NULL DEFAULT now(),
	updated_at			timestamptz NOT NULL DEFAULT now()
);

/*
 * Per subscription and partition: where the consumer is and what happened.
 * next_offset is written in each message's own transaction, so it is the
 * database's view of progress; Kafka's committed offset follows it.
 */
CREATE TABLE obx.consumer_partitions (
	consumer_name		text		NOT NULL,
	topic				text		NOT NULL,
	kafka_partition		integer		NOT NULL,
	next_offset			bigint,
	low_watermark		bigint,
	high_watermark		bigint,
	watermarks_at		timestamptz,
	processed			bigint		NOT NULL DEFAULT 0,
	duplicates			bigint		NOT NULL DEFAULT 0,
	dead_lettered		bigint		NOT NULL DEFAULT 0,
	retries				bigint		NOT NULL DEFAULT 0,
	last_event_id		text,
	last_processed_at	timestamptz,
	last_error_class	text,
	last_error			text,
	last_error_at		timestamptz,
	PRIMARY KEY (consumer_name, topic, kafka_partition)
) WITH (fillfactor = 50);

/*
 * Messages a consumer could not apply: malformed ones and those whose
 * handler failed with a non-transient error.  Each is recorded in the
 * transaction that marks the event processed, so the partition moves on
 * and nothing is lost; obx.replay_dead_letter applies it later.
 */
CREATE TABLE obx.dead_letters (
	id					bigserial	PRIMARY KEY,
	consumer_name		text		NOT NULL,
	event_id			text,
	topic				text		NOT NULL,
	kafka_partition		integer		NOT NULL,
	kafka_offset		bigint		NOT NULL,
	event_key			text,
	event_type			text,
	headers				jsonb,
	payload				jsonb,
	raw_payload			bytea,
	kafka_timestamp		timestamptz,
	error_class			text		NOT NULL
		CHECK (error_class IN ('malformed', 'handler')),
	error_sqlstate		text,
	error_message		text		NOT NULL,
	failed_at			timestamptz NOT NULL DEFAULT now(),
	replayed_at			timestamptz,
	replay_attempts		integer		NOT NULL DEFAULT 0,
	last_replay_error	text,
	UNIQUE (consumer_name, topic, kafka_partition, kafka_offset)
);

/*
 * Who owns a consumer name: the role that first subscribed it, or first
 * marked an event processed for it (a hand-written consumer).  Only that
 * role, its members (pg_has_role ... 'USAGE') and superusers may
 * subscribe, replace or unsubscribe it, or mark events for it; several
 * roles share a consumer by being members of its owner.  Superusers (the
 * consumer workers among them) never claim a name by marking.  The name
 * stays owned after obx.unsubscribe, as its dedupe history stays; a
 * superuser hands it over by updating this table.
 */
CREATE TABLE obx.consumer_owners (
	consumer_name		text		PRIMARY KEY
		CHECK (consumer_name <> ''),
	owner				regrole		NOT NULL,
	claimed_at			timestamptz NOT NULL DEFAULT now()
);

/* ---------------------------------------------------------------------
 * Indexes
 * --------------------------------------------------------------------- */

/* What the relay scans: unpublished events in enqueue order. */
CREATE INDEX outbox_events_pending_idx
	ON obx.outbox_events (seq) WHERE published_at IS NULL;
/*
 * Events failing or quarantined: what blocks their key besides a lease.
 * Small: only unpublished events whose last attempt failed (see
 * src/outbox.c).
 */
CREATE INDEX outbox_events_active_idx
	ON obx.outbox_events (topic, event_key)
	WHERE published_at IS NULL
	  AND (next_attempt_at > '-infinity' OR quarantined_at IS NOT NULL);
/* Retention purge of published events. */
CREATE INDEX outbox_events_published_idx
	ON obx.outbox_events (published_at) WHERE published_at IS NOT NULL;

/* Retention purge of the dedupe history. */
CREATE INDEX processed_events_processed_at_idx
	ON obx.processed_events (processed_at);

/* Dead letters waiting for replay, per consumer. */
CREATE INDEX dead_letters_pending_idx
	ON obx.dead_letters (consumer_name, id) WHERE replayed_at IS NULL;

/* ---------------------------------------------------------------------
 * The outbox: functions
 * --------------------------------------------------------------------- */

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

CREATE FUNCTION obx._wake_at_commit()
RETURNS void
AS 'MODULE_PATHNAME', 'obx_wake'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

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

/* skip: give up on a quarantined event (see obx.skipped_events). */
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
		   attempts = 0, failures = 0, next_attempt_at = '-infinity'
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

/* ---------------------------------------------------------------------
 * The inbox: functions
 * --------------------------------------------------------------------- */

/*
 * The handler runs as the subscription's owner.  Subscriptions are written
 * by obx.subscribe (as the extension owner, which sets the owner it
 * checked); nobody else is granted writes.  Should a superuser grant them
 * anyway, a row written by a non-superuser is owned by that writer, so a
 * role allowed to write subscriptions cannot make a handler run as someone
 * else.
 */
CREATE FUNCTION obx._subscription_owner()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF NOT coalesce((SELECT r.rolsuper FROM pg_catalog.pg_roles r
					  WHERE r.rolname = current_user), false) THEN
		NEW.owner := current_user::regrole;
	END IF;
	RETURN NEW;
END
$$;

CREATE TRIGGER subscriptions_owner
	BEFORE INSERT OR UPDATE ON obx.subscriptions
	FOR EACH ROW EXECUTE FUNCTION obx._subscription_owner();

/*
 * The Kafka properties a subscription may set in options.kafka: consumer
 * tuning only (src/kafka_conf.c).  Everything else (brokers, security,
 * plugins, commands, files) is a superuser's, in obx.kafka_properties or
 * obx.kafka_properties_file; the consumer workers check the list again.
 */
CREATE FUNCTION obx.subscription_kafka_properties()
RETURNS SETOF text
AS 'MODULE_PATHNAME', 'obx_subscription_kafka_properties'
LANGUAGE C IMMUTABLE STRICT;

/*
 * What is wrong with subscription options, as {sqlstate, message, hint}
 * (hint may be NULL), or NULL when they are fine.  obx.subscribe raises
 * it; the consumer workers and obx.consumers report it for a row that
 * holds bad options anyway, and skip that subscription.
 */
CREATE FUNCTION obx._options_problem(options jsonb)
RETURNS text[]
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	opt record;
	bad text;
BEGIN
	IF options IS NULL OR jsonb_typeof(options) <> 'object' THEN
		RETURN ARRAY['22023', 'obx subscription options must be a JSON object', NULL];
	END IF;
	FOR opt IN SELECT * FROM jsonb_each(options) LOOP
		IF opt.key = 'kafka' THEN
			IF jsonb_typeof(opt.value) <> 'object' OR EXISTS (
				SELECT 1 FROM jsonb_each(opt.value) k WHERE jsonb_typeof(k.value) <> 'string') THEN
				RETURN ARRAY['22023',
					'obx subscription option "kafka" must be an object of string values',
					'For example: {"kafka": {"session.timeout.ms": "10000"}}'];
			END IF;
			SELECT k INTO bad FROM jsonb_object_keys(opt.value) k
			 WHERE k NOT IN (SELECT obx.subscription_kafka_properties())
			 ORDER BY k LIMIT 1;
			IF bad IS NOT NULL THEN
				RETURN ARRAY['22023',
					format('Kafka property "%s" cannot be set by an obx subscription', bad),
					'A subscription may set consumer tuning properties only (obx.subscription_kafka_properties() lists them). '
					'Connection, security, plugin and file properties are set by a superuser, '
					'in obx.kafka_properties or obx.kafka_properties_file.'];
			END IF;
		ELSIF opt.key = 'start' THEN
			IF opt.value NOT IN ('"earliest"', '"latest"') THEN
				RETURN ARRAY['22023',
					'obx subscription option "start" must be "earliest" or "latest"', NULL];
			END IF;
		ELSIF opt.key = 'retry_sqlstates' THEN
			IF jsonb_typeof(opt.value) <> 'array' OR EXISTS (
				SELECT 1 FROM jsonb_array_elements(opt.value) s
				 WHERE jsonb_typeof(s) <> 'string' OR s #>> '{}' !~ '^[0-9A-Z]{5}$') THEN
				RETURN ARRAY['22023',
					'obx subscription option "retry_sqlstates" must be an array of SQLSTATE codes',
					'For example: {"retry_sqlstates": ["P0001"]}'];
			END IF;
		ELSIF opt.key = 'handler_timeout_ms' THEN
			IF (CASE WHEN jsonb_typeof(opt.value) <> 'number' THEN true
					 ELSE opt.value::numeric <> trunc(opt.value::numeric)
						  OR opt.value::numeric NOT BETWEEN 0 AND 2147483647 END) THEN
				RETURN ARRAY['22023',
					'obx subscription option "handler_timeout_ms" must be a whole number of milliseconds from 0 to 2147483647',
					'For example: {"handler_timeout_ms": 5000}; 0 means no limit.'];
			END IF;
		ELSE
			RETURN ARRAY['22023', format('unknown obx subscription option "%s"', opt.key),
						 'Known options: kafka, start, retry_sqlstates, handler_timeout_ms.'];
		END IF;
	END LOOP;
	RETURN NULL;
END
$$;

/*
 * Why the consumer workers cannot serve a subscription row, or NULL: its
 * owner or handler is gone, or the row holds what obx.subscribe would
 * have refused (written by a superuser directly).  Such a subscription is
 * reported and skipped; the others go on.  It says nothing secret, and
 * whoever may read obx.consumers must be able to execute it (it runs as
 * the extension owner, so that its own calls need no grant).
 */
CREATE FUNCTION obx._subscription_problem(s obx.subscriptions)
RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
	SELECT CASE
		WHEN NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.oid = s.owner)
		THEN format('its owner (role with OID %s) no longer exists', s.owner::oid)
		WHEN NOT EXISTS (SELECT 1 FROM pg_catalog.pg_proc p WHERE p.oid = s.handler)
		THEN 'its handler no longer exists'
		WHEN s.topics IS NULL OR pg_catalog.cardinality(s.topics) = 0
			 OR pg_catalog.array_position(s.topics, NULL) IS NOT NULL
			 OR EXISTS (SELECT 1 FROM pg_catalog.unnest(s.topics) t
						 WHERE t !~ '^[A-Za-z0-9._-]{1,249}$')
		THEN 'its topics are not valid Kafka topic names'
		ELSE (obx._options_problem(s.options))[2]
	END
$$;

/*
 * Owner checks of the consumer side: caller may act for a consumer owned
 * by owner_role if it has that role's privileges (a member, or a
 * superuser), as PostgreSQL decides who may alter an object.
 */
CREATE FUNCTION obx._check_consumer_owner(caller oid, consumer_name text, owner_role oid)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	IF NOT pg_has_role(caller, owner_role, 'USAGE') THEN
		RAISE EXCEPTION 'must be owner of obx consumer "%"', consumer_name
			USING ERRCODE = 'insufficient_privilege',
				  DETAIL = CASE WHEN EXISTS (SELECT 1 FROM pg_roles r WHERE r.oid = owner_role)
							THEN format('It belongs to role %s.', owner_role::regrole)
							ELSE 'Its owner no longer exists; only a superuser may act for it.' END,
				  HINT = 'Only its owner, members of the owner role and superusers may subscribe, '
						 'replace or unsubscribe it, or mark events processed for it.';
	END IF;
END
$$;

/*
 * subscribe: register (or replace) a subscription.  The consumer workers
 * pick it up within obx.poll_interval.  The handler runs as the owner of
 * the consumer name: the role that subscribed it first.
 *
 * obx.subscribe itself is a C function (src/consumer_sql.c) that passes
 * its caller to obx._subscribe, which writes obx.subscriptions as the
 * extension owner: nobody else may write that table, and a SECURITY
 * DEFINER function cannot tell who called it.  obx._subscribe is granted
 * to nobody, so caller cannot be forged.
 */
CREATE FUNCTION obx._subscribe(caller oid, consumer_name text, topics text[],
							   handler regprocedure, options jsonb)
RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	fn pg_proc;
	problem text[];
	owner_role oid;
	sub_owner oid;
BEGIN
	IF consumer_name IS NULL OR topics IS NULL OR handler IS NULL OR options IS NULL THEN
		RAISE EXCEPTION 'obx.subscribe arguments must not be null'
			USING ERRCODE = 'null_value_not_allowed';
	END IF;
	IF consumer_name !~ '^[A-Za-z0-9._-]{1,200}$' THEN
		RAISE EXCEPTION 'invalid obx consumer name "%"', consumer_name
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'It names the Kafka consumer group: 1 to 200 of A-Z, a-z, 0-9, ".", "_" and "-".';
	END IF;
	IF cardinality(topics) = 0 OR array_position(topics, NULL) IS NOT NULL
	   OR EXISTS (SELECT 1 FROM unnest(topics) t WHERE t !~ '^[A-Za-z0-9._-]{1,249}$') THEN
		RAISE EXCEPTION 'obx.subscribe needs one or more valid Kafka topic names'
			USING ERRCODE = 'invalid_parameter_value',
				  DETAIL = format('Got %s.', topics);
	END IF;

	SELECT * INTO fn FROM pg_proc p WHERE p.oid = handler;
	IF fn.prokind <> 'f' OR fn.proretset OR fn.pronargs <> 1
	   OR fn.proargtypes[0] <> 'obx.inbound_event'::regtype THEN
		RAISE EXCEPTION 'obx handler % must be a function taking one obx.inbound_event', handler
			USING ERRCODE = 'invalid_parameter_value',
				  HINT = 'For example: CREATE FUNCTION app.on_order(e obx.inbound_event) RETURNS void ...';
	END IF;

	/*
	 * The consumer name is the caller's if nobody owns it yet; else the
	 * caller must act for its owner.  A subscription row written directly
	 * with another owner must be the caller's to replace, too.
	 */
	INSERT INTO obx.consumer_owners AS o (consumer_name, owner)
	VALUES (_subscribe.consumer_name, caller)
	ON CONFLICT DO NOTHING;
	SELECT o.owner INTO owner_role FROM obx.consumer_owners o
	 WHERE o.consumer_name = _subscribe.consumer_name FOR UPDATE;
	PERFORM obx._check_consumer_owner(caller, consumer_name, owner_role);
	IF NOT EXISTS (SELECT 1 FROM pg_roles r WHERE r.oid = owner_role) THEN
		/* Its owner was dropped: the superuser who got here takes it over. */
		UPDATE obx.consumer_owners o SET owner = caller, claimed_at = now()
		 WHERE o.consumer_name = _subscribe.consumer_name;
		owner_role := caller;
	END IF;
	SELECT s.owner INTO sub_owner FROM obx.subscriptions s
	 WHERE s.consumer_name = _subscribe.consumer_name FOR UPDATE;
	IF FOUND AND sub_owner <> owner_role THEN
		PERFORM obx._check_consumer_owner(caller, consumer_name, sub_owner);
	END IF;

	IF NOT has_function_privilege(caller, handler, 'EXECUTE')
	   OR NOT has_function_privilege(owner_role, handler, 'EXECUTE') THEN
		RAISE EXCEPTION 'permission denied for obx handler %', handler
			USING ERRCODE = 'insufficient_privilege';
	END IF;

	problem := obx._options_problem(options);
	IF problem IS NOT NULL AND problem[3] IS NULL THEN
		RAISE EXCEPTION USING ERRCODE = problem[1], MESSAGE = problem[2];
	ELSIF problem IS NOT NULL THEN
		RAISE EXCEPTION USING ERRCODE = problem[1], MESSAGE = problem[2], HINT = problem[3];
	END IF;

	INSERT INTO obx.subscriptions AS s (consumer_name, topics, handler, options, owner)
	VALUES (_subscribe.consumer_name, _subscribe.topics, _subscribe.handler,
			_subscribe.options, owner_role::regrole)
	ON CONFLICT ON CONSTRAINT subscriptions_pkey DO UPDATE
	   SET topics = excluded.topics, handler = excluded.handler,
		   options = excluded.options, owner = excluded.owner, updated_at = now()
	 WHERE (s.topics, s.handler, s.options, s.owner)
		   IS DISTINCT FROM (excluded.topics, excluded.handler, excluded.options, excluded.owner);
END
$$;

CREATE FUNCTION obx.subscribe(consumer_name text, topics text[],
							  handler regprocedure, options jsonb DEFAULT '{}')
RETURNS void
AS 'MODULE_PATHNAME', 'obx_subscribe'
LANGUAGE C VOLATILE;

CREATE FUNCTION obx._unsubscribe(caller oid, consumer_name text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	sub_owner oid;
BEGIN
	SELECT s.owner INTO sub_owner FROM obx.subscriptions s
	 WHERE s.consumer_name = _unsubscribe.consumer_name FOR UPDATE;
	IF NOT FOUND THEN
		RETURN false;
	END IF;
	PERFORM obx._check_consumer_owner(caller, consumer_name, sub_owner);
	DELETE FROM obx.subscriptions s WHERE s.consumer_name = _unsubscribe.consumer_name;
	RETURN true;
END
$$;

CREATE FUNCTION obx.unsubscribe(consumer_name text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'obx_unsubscribe'
LANGUAGE C VOLATILE;

/*
 * mark_processed: true the first time a consumer sees an event, false for
 * a duplicate.  ON CONFLICT DO NOTHING waits for a concurrent insert of the
 * same pair and then reports false if that transaction committed, true if
 * it rolled back: exactly one of two racing transactions gets true.
 *
 * Only for consumers the caller may act for (see obx.consumer_owners).
 * The first non-superuser to mark events for an unowned name claims it,
 * so hand-written consumers need no setup.  A C function passes its
 * caller to obx._mark_processed, as subscribe does.
 */
CREATE FUNCTION obx._mark_processed(caller oid, consumer_name text, event_id text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	inserted integer;
	owner_role oid;
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
	IF NOT coalesce((SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.oid = caller), false) THEN
		SELECT o.owner INTO owner_role FROM obx.consumer_owners o
		 WHERE o.consumer_name = _mark_processed.consumer_name;
		IF NOT FOUND THEN
			INSERT INTO obx.consumer_owners AS o (consumer_name, owner)
			VALUES (_mark_processed.consumer_name, caller)
			ON CONFLICT DO NOTHING;
			SELECT o.owner INTO owner_role FROM obx.consumer_owners o
			 WHERE o.consumer_name = _mark_processed.consumer_name;
		END IF;
		PERFORM obx._check_consumer_owner(caller, consumer_name, owner_role);
	END IF;
	INSERT INTO obx.processed_events AS p (consumer_name, event_id)
	VALUES (_mark_processed.consumer_name, _mark_processed.event_id)
	ON CONFLICT DO NOTHING;
	GET DIAGNOSTICS inserted = ROW_COUNT;
	RETURN inserted = 1;
END
$$;

CREATE FUNCTION obx.mark_processed(consumer_name text, event_id text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'obx_mark_processed'
LANGUAGE C VOLATILE SECURITY INVOKER;

/*
 * _replay_handler: run the subscription's handler on one dead letter as
 * the subscription's owner (never as the caller), in a security-restricted
 * operation, with the subscription's handler timeout (src/inbox.c).
 */
CREATE FUNCTION obx._replay_handler(dead_letter_id bigint)
RETURNS void
AS 'MODULE_PATHNAME', 'obx_replay_handler'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp;

/*
 * replay_dead_letter: run the subscription's current handler on dead
 * letters, in the caller's transaction, each in a subtransaction of its
 * own.  One that fails again stays a dead letter with the new error.
 * Who may replay is who may EXECUTE it: it runs as the extension owner
 * (it marks the event processed and reads the subscription), and the
 * handler itself runs as the subscription's owner, restricted
 * (obx._replay_handler), never as the caller or the extension owner.
 */
CREATE FUNCTION obx.replay_dead_letter(ids bigint[])
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	d obx.dead_letters;
	fn regprocedure;
	applied integer := 0;
BEGIN
	IF ids IS NULL THEN
		RAISE EXCEPTION 'obx.replay_dead_letter needs dead letter ids'
			USING ERRCODE = 'null_value_not_allowed';
	END IF;
	FOR d IN SELECT * FROM obx.dead_letters l
			  WHERE l.id = ANY (ids) AND l.replayed_at IS NULL
			  ORDER BY l.id FOR UPDATE
	LOOP
		SELECT s.handler INTO fn FROM obx.subscriptions s
		 WHERE s.consumer_name = d.consumer_name;
		BEGIN
			IF fn IS NULL THEN
				RAISE EXCEPTION 'no obx subscription "%"', d.consumer_name
					USING ERRCODE = 'undefined_object';
			END IF;
			IF d.event_id IS NULL OR d.payload IS NULL THEN
				RAISE EXCEPTION 'dead letter % has no %', d.id,
					CASE WHEN d.event_id IS NULL THEN 'event id' ELSE 'JSON payload' END
					USING ERRCODE = 'invalid_parameter_value',
						  HINT = 'Set event_id and payload in obx.dead_letters first.';
			END IF;
			INSERT INTO obx.processed_events (consumer_name, event_id)
			VALUES (d.consumer_name, d.event_id)
			ON CONFLICT DO NOTHING;
			PERFORM obx._replay_handler(d.id);
			UPDATE obx.dead_letters l
			   SET replayed_at = now(), replay_attempts = l.replay_attempts + 1,
				   last_replay_error = NULL
			 WHERE l.id = d.id;
			applied := applied + 1;
		EXCEPTION WHEN OTHERS THEN
			UPDATE obx.dead_letters l
			   SET replay_attempts = l.replay_attempts + 1,
				   last_replay_error = SQLSTATE || ': ' || SQLERRM
			 WHERE l.id = d.id;
		END;
	END LOOP;
	RETURN applied;
END
$$;

CREATE FUNCTION obx.replay_dead_letter(consumer_name text)
RETURNS integer
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
	SELECT obx.replay_dead_letter(coalesce(array_agg(l.id), '{}'))
	  FROM obx.dead_letters l
	 WHERE l.consumer_name = replay_dead_letter.consumer_name
	   AND l.replayed_at IS NULL;
$$;

/* ---------------------------------------------------------------------
 * Views
 * --------------------------------------------------------------------- */

/* Per-topic health: the numbers to alert on. */
CREATE VIEW obx.status AS
WITH leased AS (
	SELECT DISTINCT u.id
	  FROM obx.leases l, unnest(l.ids) AS u(id)
	 WHERE l.until >= now()
)
SELECT e.topic,
	   count(*) FILTER (WHERE e.published_at IS NULL AND e.quarantined_at IS NULL
						AND l.id IS NULL) AS pending,
	   count(*) FILTER (WHERE e.published_at IS NULL AND e.quarantined_at IS NULL
						AND l.id IS NOT NULL) AS leased,
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
  LEFT JOIN leased l ON l.id = e.id
 GROUP BY e.topic;

/* One row per leased event, for people and tests. */
CREATE VIEW obx.leased_events AS
SELECT u.id, u.topic, u.event_key, l.lease_id, l.owner AS lease_owner,
	   l.until AS lease_until, l.claimed_at
  FROM obx.leases l,
	   unnest(l.ids, l.topics, l.keys) AS u(id, topic, event_key);

CREATE VIEW obx.quarantine AS
SELECT e.id, e.topic, e.event_key, e.event_type, e.attempts,
	   e.last_error_class, e.last_error, e.quarantined_at, e.occurred_at
  FROM obx.outbox_events e
 WHERE e.quarantined_at IS NOT NULL AND e.published_at IS NULL;

CREATE VIEW obx.workers AS SELECT * FROM obx.worker_status();

/*
 * Error texts (a handler's errors can quote the data it was given) are
 * shown to pg_monitor members, superusers and the consumer's owner (and
 * its members) only; others who may read the view see NULL there.
 */
CREATE VIEW obx.consumer_status AS
SELECT p.consumer_name, p.topic, p.kafka_partition, p.next_offset,
	   p.high_watermark,
	   greatest(p.high_watermark - coalesce(p.next_offset, p.low_watermark), 0) AS lag,
	   p.processed, p.duplicates, p.dead_lettered, p.retries,
	   p.last_processed_at, p.last_error_class,
	   CASE WHEN pg_has_role('pg_monitor', 'USAGE')
				 OR pg_has_role(coalesce(s.owner, o.owner), 'USAGE')
			THEN p.last_error END AS last_error,
	   p.last_error_at, p.watermarks_at
  FROM obx.consumer_partitions p
  LEFT JOIN obx.subscriptions s ON s.consumer_name = p.consumer_name
  LEFT JOIN obx.consumer_owners o ON o.consumer_name = p.consumer_name;

CREATE VIEW obx.consumers AS
SELECT s.consumer_name, s.topics, s.handler, s.owner,
	   coalesce(sum(c.processed), 0) AS processed,
	   coalesce(sum(c.duplicates), 0) AS duplicates,
	   coalesce(sum(c.dead_lettered), 0) AS dead_lettered,
	   coalesce(sum(c.retries), 0) AS retries,
	   coalesce(sum(c.lag), 0) AS lag,
	   (SELECT count(*) FROM obx.dead_letters l
		 WHERE l.consumer_name = s.consumer_name
		   AND l.replayed_at IS NULL) AS dead_letters_pending,
	   max(c.last_processed_at) AS last_processed_at,
	   (array_agg(c.last_error ORDER BY c.last_error_at DESC)
		  FILTER (WHERE c.last_error IS NOT NULL))[1] AS last_error,
	   max(c.last_error_at) AS last_error_at,
	   obx._subscription_problem(s) AS problem
  FROM obx.subscriptions s
  LEFT JOIN obx.consumer_status c ON c.consumer_name = s.consumer_name
		AND c.topic = ANY (s.topics)
 GROUP BY s.consumer_name, s.topics, s.handler, s.owner;

/* ---------------------------------------------------------------------
 * Privileges
 * --------------------------------------------------------------------- */

/*
 * Nothing is granted to PUBLIC but what the views need.  An application
 * role gets USAGE on the schema and EXECUTE on obx.enqueue (which runs as
 * the extension owner and can only insert validated events).  A
 * subscriber gets EXECUTE on subscribe and unsubscribe (and no privilege
 * on the tables: every change goes through those functions, which check
 * ownership); a hand-written consumer EXECUTE on mark_processed.  An
 * operator gets EXECUTE on retry, retry_quarantined, replay, skip and
 * replay_dead_letter (which run as the extension owner too) and SELECT on
 * dead_letters; monitoring SELECT on the views.  The obx._* functions are
 * granted to nobody, but for obx._subscription_problem.  See
 * docs/security.md.
 */
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA obx FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA obx FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA obx FROM PUBLIC;

/*
 * A function called by a view is checked against the user querying the
 * view, so whoever may read obx.workers must be able to execute
 * obx.worker_status, and whoever may read obx.consumers
 * obx._subscription_problem.  They say nothing secret, and USAGE on
 * schema obx still gates them.  obx.subscription_kafka_properties() only
 * lists the Kafka properties a subscription may set.
 */
GRANT EXECUTE ON FUNCTION obx.worker_status(),
	obx._subscription_problem(obx.subscriptions),
	obx.subscription_kafka_properties() TO PUBLIC;

/* ---------------------------------------------------------------------
 * Comments
 * --------------------------------------------------------------------- */

COMMENT ON TABLE obx.outbox_events IS
	'Events waiting for Kafka (published_at IS NULL) and, for obx.retention, the published ones';
COMMENT ON COLUMN obx.outbox_events.seq IS
	'Enqueue order; events of one topic and key are published in this order';
COMMENT ON COLUMN obx.outbox_events.attempts IS
	'Publish attempts that ended (delivered or failed); an attempt cut short by a crash or a lost lease is not counted';
COMMENT ON COLUMN obx.outbox_events.failures IS
	'Failed attempts that count toward obx.max_attempts (not transient ones)';
COMMENT ON TABLE obx.leases IS
	'Batches claimed by relay workers and in flight to Kafka: one row per batch, its events in parallel arrays';
COMMENT ON TABLE obx.skipped_events IS
	'Quarantined events an operator decided never to publish (obx.skip)';
COMMENT ON TABLE obx.processed_events IS
	'Dedupe history of consumers: one row per (consumer, event) whose effect happened';
COMMENT ON TYPE obx.inbound_event IS
	'A Kafka message as a subscription handler receives it';
COMMENT ON TABLE obx.subscriptions IS
	'Kafka topics the consumer workers read, as consumer group consumer_name, and the handler each message goes to';
COMMENT ON TABLE obx.consumer_partitions IS
	'Consumer progress and counters per subscription, topic and partition';
COMMENT ON TABLE obx.dead_letters IS
	'Messages a consumer quarantined (malformed, or a non-transient handler error); obx.replay_dead_letter applies them after a fix';
COMMENT ON COLUMN obx.dead_letters.raw_payload IS
	'The message value as received, kept only when it is not JSON';
COMMENT ON TABLE obx.consumer_owners IS
	'The role each consumer name belongs to: who may subscribe, unsubscribe and mark events for it';
COMMENT ON FUNCTION obx.enqueue(text, text, jsonb, text, text, jsonb, uuid) IS
	'Store an event in the outbox inside the current transaction; returns its id';
COMMENT ON FUNCTION obx.retry(uuid) IS
	'Make a quarantined or backing-off event publishable now; false if it is neither';
COMMENT ON FUNCTION obx.retry_quarantined(text) IS
	'Retry every quarantined event, or those of one topic; returns how many';
COMMENT ON FUNCTION obx.skip(uuid, text) IS
	'Give up on a quarantined event: move it to obx.skipped_events so its key moves on';
COMMENT ON FUNCTION obx.replay(uuid[]) IS
	'Publish these already-published events again with the same ids; returns how many';
COMMENT ON FUNCTION obx.replay(text, timestamptz, timestamptz) IS
	'Publish again the events of a topic that occurred in [since, until); returns how many';
COMMENT ON FUNCTION obx.subscription_kafka_properties() IS
	'The librdkafka consumer properties a subscription may set in its options.kafka';
COMMENT ON FUNCTION obx.subscribe(text, text[], regprocedure, jsonb) IS
	'Consume these topics as consumer group consumer_name, calling handler once per new event';
COMMENT ON FUNCTION obx.unsubscribe(text) IS
	'Stop consuming for this subscription (its dedupe history, progress and dead letters stay)';
COMMENT ON FUNCTION obx.mark_processed(text, text) IS
	'Record that a consumer processed an event: true the first time, false for a duplicate; only for consumers the caller owns';
COMMENT ON FUNCTION obx.replay_dead_letter(bigint[]) IS
	'Apply these dead letters with their subscription''s current handler; returns how many succeeded';
COMMENT ON FUNCTION obx.replay_dead_letter(text) IS
	'Apply every dead letter of this consumer not yet replayed; returns how many succeeded';
COMMENT ON VIEW obx.status IS
	'Per topic: pending, leased, published (still retained), quarantined, age of the oldest unpublished event, last error';
COMMENT ON VIEW obx.leased_events IS
	'Events leased to a relay worker (an expired lease stays until the next claim removes it)';
COMMENT ON VIEW obx.quarantine IS
	'Events the relay gave up on, with their errors; obx.retry(id) sends one again';
COMMENT ON VIEW obx.workers IS
	'One row per relay worker: state, counters, events/s, last success and last error';
COMMENT ON VIEW obx.consumer_status IS
	'Per consumer, topic and partition: position, lag, processed, duplicates, dead letters, retries, last error';
COMMENT ON VIEW obx.consumers IS
	'One row per subscription: totals, lag, dead letters waiting for replay, last error, and why the workers skip it (problem)';

/* ---------------------------------------------------------------------
 * pg_dump keeps the data: pending events, the dedupe history,
 * subscriptions, consumer progress, dead letters and consumer owners.
 * --------------------------------------------------------------------- */

SELECT pg_catalog.pg_extension_config_dump('obx.outbox_events', '');
SELECT pg_catalog.pg_extension_config_dump('obx.event_seq', '');
SELECT pg_catalog.pg_extension_config_dump('obx.skipped_events', '');
SELECT pg_catalog.pg_extension_config_dump('obx.processed_events', '');
SELECT pg_catalog.pg_extension_config_dump('obx.subscriptions', '');
SELECT pg_catalog.pg_extension_config_dump('obx.consumer_partitions', '');
SELECT pg_catalog.pg_extension_config_dump('obx.dead_letters', '');
SELECT pg_catalog.pg_extension_config_dump('obx.dead_letters_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('obx.consumer_owners', '');
