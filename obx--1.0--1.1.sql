/* obx--1.0--1.1.sql: from the 1.0 release to the 1.1 release */

\echo Use "ALTER EXTENSION obx UPDATE TO '1.1'" to load this file. \quit

/*
 * Two parts.  The 1.1 release's obx--1.0.sql was not the 1.0 release's:
 * enqueue_many, tombstones, the publish latency views, obx.status.problem,
 * obx.consumers.kafka_error, handlers by name and more went into it after
 * 1.0 shipped.  Part 1 makes a database the 1.0 release created into what
 * that script creates, carrying the subscriptions over.  Part 2 is 1.1's
 * own update: the insert-only outbox.
 *
 * 1.1 writes each event once.  An event is inserted into obx.events and
 * never updated or deleted: publishing it appends one row per batch to
 * obx.records, and old events go by TRUNCATE of a whole generation.
 * docs/internals.md ("The outbox log") gives the design and why it keeps
 * per-key order and the late committer; this script builds it and carries
 * the events of 1.0 over.  CREATE EXTENSION obx runs obx--1.0.sql and then
 * this script, so a fresh install and an upgrade end in the same schema.
 *
 * Released scripts are never edited: obx--1.0.sql is the 1.0 release's,
 * and this script ends in the 1.1 release's schema.  What came after is
 * in obx--1.1--1.2.sql.
 */

/* ---------------------------------------------------------------------
 * Part 1: what 1.1's obx--1.0.sql has that 1.0's had not
 * --------------------------------------------------------------------- */

/* Tombstones: an event's payload may be NULL (obx.enqueue_tombstone). */
ALTER TABLE obx.outbox_events ALTER COLUMN payload DROP NOT NULL;
ALTER TABLE obx.skipped_events ALTER COLUMN payload DROP NOT NULL;

/* The dedupe history compares bytes (its primary key is rebuilt). */
ALTER TABLE obx.processed_events
	ALTER COLUMN consumer_name TYPE text COLLATE pg_catalog."C",
	ALTER COLUMN event_id TYPE text COLLATE pg_catalog."C";

/*
 * obx.subscriptions names its handler by text, with handler_owner after
 * it: the table is made again, in 1.1's column order, and its rows copied.
 * What depends on its row type goes first and comes back below.
 */
DROP VIEW obx.consumers;
DROP VIEW obx.consumer_status;
DROP FUNCTION obx._subscription_problem(obx.subscriptions);
ALTER TABLE obx.subscriptions RENAME TO subscriptions_1_0;
/*
 * Its constraints too (the primary key, the checks and, from PostgreSQL 18
 * on, the NOT NULLs), so that the new table's get the names 1.1's have.
 */
DO $$
DECLARE
	c record;
BEGIN
	FOR c IN SELECT k.conname FROM pg_catalog.pg_constraint k
			  WHERE k.conrelid = 'obx.subscriptions_1_0'::pg_catalog.regclass
				AND k.conname LIKE 'subscriptions\_%'
	LOOP
		EXECUTE pg_catalog.format('ALTER TABLE obx.subscriptions_1_0 RENAME CONSTRAINT %I TO %I',
								  c.conname, 'subscriptions_1_0_' || pg_catalog.substr(c.conname, 15));
	END LOOP;
END
$$;

CREATE TABLE obx.subscriptions (
	consumer_name		text		PRIMARY KEY
		CHECK (consumer_name ~ '^[A-Za-z0-9._-]{1,200}$'),
	topics				text[]		NOT NULL
		CHECK (cardinality(topics) > 0),
	/*
	 * The handler by name, schema-qualified ("app.on_order(obx.inbound_event)"),
	 * not by OID: pg_upgrade keeps no function's OID.  handler_owner is the
	 * function's owner when it was subscribed; a function of that name that
	 * another role owns is not the handler (obx._handler).
	 */
	handler				text		NOT NULL,
	handler_owner		regrole,
	options				jsonb		NOT NULL DEFAULT '{}',
	owner				regrole		NOT NULL,
	created_at			timestamptz NOT NULL DEFAULT now(),
	updated_at			timestamptz NOT NULL DEFAULT now()
);

/*
 * The last Kafka error a consumer group's workers met (a subscribed topic
 * that does not exist, brokers out of reach, a configuration librdkafka
 * refused), one row per group: written when the workers log it (at most
 * once a minute per error), deleted once a message of the group is
 * fetched again, and by obx.unsubscribe.  obx.consumers shows it, the
 * text to pg_monitor only: it can name brokers and the superuser's Kafka
 * settings, which the subscription's owner may not read.
 */
CREATE TABLE obx.consumer_kafka_errors (
	consumer_name		text		PRIMARY KEY,
	error				text		NOT NULL,
	error_at			timestamptz NOT NULL
);

/*
 * The function a subscription's handler names, while it is owned by the
 * role that owned it when subscribed; NULL otherwise (dropped, renamed,
 * or re-created by another role).
 */
CREATE FUNCTION obx._handler(s obx.subscriptions)
RETURNS regprocedure
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
	SELECT p.oid::pg_catalog.regprocedure
	  FROM pg_catalog.pg_proc p
	 WHERE p.oid = pg_catalog.to_regprocedure(s.handler)
	   AND p.proowner = s.handler_owner
$$;

/*
 * A 1.0 row's handler is a regprocedure: its text with the search_path
 * pinned is the schema-qualified form 1.1 writes, and its owner now is
 * the handler's owner (1.0 did not keep it).  A handler dropped since
 * (its OID names no function) is written as a name no function has, not
 * as the OID, which to_regprocedure reads as an OID from PostgreSQL 16 on
 * and refuses before: obx.consumers.problem says the handler no longer
 * exists, until obx.subscribe names one.
 */
DO $$
DECLARE
	path text := pg_catalog.current_setting('search_path');
BEGIN
	PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
	INSERT INTO obx.subscriptions (consumer_name, topics, handler, handler_owner, options,
								   owner, created_at, updated_at)
	SELECT s.consumer_name, s.topics,
		   CASE WHEN p.oid IS NOT NULL THEN s.handler::text
				ELSE pg_catalog.format('obx.%I(obx.inbound_event)',
									   'dropped handler ' || s.handler::oid) END,
		   p.proowner::regrole, s.options, s.owner, s.created_at, s.updated_at
	  FROM obx.subscriptions_1_0 s
	  LEFT JOIN pg_catalog.pg_proc p ON p.oid = s.handler;
	PERFORM pg_catalog.set_config('search_path', path, true);
END
$$;
ALTER EXTENSION obx DROP TABLE obx.subscriptions_1_0;
DROP TABLE obx.subscriptions_1_0;

/*
 * The handler runs as the subscription's owner.  Subscriptions are written
 * by obx.subscribe (as the extension owner, which sets the owner and the
 * handler's owner it checked); nobody else is granted writes.  Should a
 * superuser grant them anyway, a row written by a non-superuser is owned by
 * that writer, and its handler_owner is the function's current owner, so a
 * role allowed to write subscriptions cannot make a handler run as someone
 * else.  Every row's handler is written in its schema-qualified form, the
 * one obx._handler resolves whatever the search_path.
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
					  WHERE r.rolname = current_user), false) THEN
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

CREATE TRIGGER subscriptions_owner
	BEFORE INSERT OR UPDATE ON obx.subscriptions
	FOR EACH ROW EXECUTE FUNCTION obx._subscription_owner();

/*
 * enqueue_many: obx.enqueue for many events of one topic at once.  Element
 * i of the arrays is one event; NULL optional arrays or elements mean what
 * NULL arguments of obx.enqueue mean.  Returns the ids in array order.
 */
CREATE FUNCTION obx.enqueue_many(
	topic text,
	event_keys text[],
	payloads jsonb[],
	aggregate_ids text[] DEFAULT NULL,
	event_types text[] DEFAULT NULL,
	headers jsonb[] DEFAULT NULL,
	event_ids uuid[] DEFAULT NULL)
RETURNS uuid[]
AS 'MODULE_PATHNAME', 'obx_enqueue_many'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

/*
 * A tombstone: the key with a null value, for compacted topics.  Stored
 * as an event whose payload is NULL, so it keeps its place (seq) among
 * the key's events.  Only this function stores a NULL payload.
 */
CREATE FUNCTION obx.enqueue_tombstone(
	topic text,
	event_key text,
	aggregate_id text DEFAULT NULL,
	event_type text DEFAULT NULL,
	headers jsonb DEFAULT NULL,
	event_id uuid DEFAULT NULL)
RETURNS uuid
AS 'MODULE_PATHNAME', 'obx_enqueue_tombstone'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

/*
 * Whether a relay of this server publishes the current database's outbox:
 * NULL if one does, else why not (obx.status.problem).  _warn_unserved
 * raises the warning the end of this script and a session's first
 * obx.enqueue give then.  See src/status.c.
 */
CREATE FUNCTION obx._relay_problem()
RETURNS text
AS 'MODULE_PATHNAME', 'obx_relay_problem'
LANGUAGE C STABLE;

CREATE FUNCTION obx._warn_unserved()
RETURNS void
AS 'MODULE_PATHNAME', 'obx_warn_unserved'
LANGUAGE C VOLATILE;

/*
 * Publish latency per topic, from enqueue (occurred_at) to the broker's
 * acknowledgement (published_at), counted in shared memory by the relay
 * as it records deliveries: Prometheus-style cumulative buckets.  See
 * src/latency.c.
 */
CREATE FUNCTION obx.publish_latency_buckets(
	OUT topic text,
	OUT le float8,
	OUT count bigint,
	OUT sum float8)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'obx_publish_latency'
LANGUAGE C VOLATILE;

/*
 * What is wrong with the value a subscription gives an allowed Kafka
 * property, as {message, hint} (hint may be NULL), or NULL: a fetch or
 * queue size over librdkafka's default (a subscription may lower them, not
 * raise them), or a value librdkafka refuses.  Granted to nobody: the
 * functions below run as the extension owner.
 */
CREATE FUNCTION obx._kafka_value_problem(name text, value text)
RETURNS text[]
AS 'MODULE_PATHNAME', 'obx_subscription_kafka_value_problem'
LANGUAGE C IMMUTABLE STRICT;

/* obx.workers gains the database column. */
DROP VIEW obx.workers;
DROP FUNCTION obx.worker_status();
CREATE FUNCTION obx.worker_status(
	OUT worker integer,
	OUT database text,
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

/*
 * What is wrong with subscription options, as {sqlstate, message, hint}
 * (hint may be NULL), or NULL when they are fine.  obx.subscribe raises
 * it; the consumer workers and obx.consumers report it for a row that
 * holds bad options anyway, and skip that subscription.
 */
CREATE OR REPLACE FUNCTION obx._options_problem(options jsonb)
RETURNS text[]
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	opt record;
	bad text;
	problem text[];
	whole numeric;
BEGIN
	IF options IS NULL OR jsonb_typeof(options) <> 'object' THEN
		RETURN ARRAY['22023', 'obx subscription options must be a JSON object', NULL];
	END IF;
	FOR opt IN SELECT * FROM jsonb_each(options) LOOP
		/* The value as a whole number, or NULL if it is not one. */
		whole := CASE WHEN jsonb_typeof(opt.value) = 'number' THEN
					 CASE WHEN opt.value::numeric = trunc(opt.value::numeric)
						  THEN opt.value::numeric END END;
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
			SELECT p INTO problem
			  FROM jsonb_each_text(opt.value) k, obx._kafka_value_problem(k.key, k.value) p
			 WHERE p IS NOT NULL
			 ORDER BY k.key LIMIT 1;
			IF problem IS NOT NULL THEN
				RETURN ARRAY['22023', problem[1], problem[2]];
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
			IF whole IS NULL OR whole NOT BETWEEN 0 AND 2147483647 THEN
				RETURN ARRAY['22023',
					'obx subscription option "handler_timeout_ms" must be a whole number of milliseconds from 0 to 2147483647',
					'For example: {"handler_timeout_ms": 5000}; 0 means no limit.'];
			END IF;
		ELSIF opt.key = 'max_attempts' THEN
			IF whole IS NULL OR whole NOT BETWEEN 1 AND 1000000 THEN
				RETURN ARRAY['22023',
					'obx subscription option "max_attempts" must be a whole number from 1 to 1000000',
					'For example: {"max_attempts": 10}: a message whose handler fails transiently 10 times is dead-lettered. '
					'Without it, such a message is retried until it succeeds.'];
			END IF;
		ELSE
			RETURN ARRAY['22023', format('unknown obx subscription option "%s"', opt.key),
						 'Known options: kafka, start, retry_sqlstates, handler_timeout_ms, max_attempts.'];
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
		WHEN pg_catalog.to_regprocedure(s.handler) IS NULL
		THEN 'its handler no longer exists'
		WHEN obx._handler(s) IS NULL
		THEN 'its handler belongs to another role than when it was subscribed'
		WHEN s.topics IS NULL OR pg_catalog.cardinality(s.topics) = 0
			 OR pg_catalog.array_position(s.topics, NULL) IS NOT NULL
			 OR EXISTS (SELECT 1 FROM pg_catalog.unnest(s.topics) t
						 WHERE t !~ '^[A-Za-z0-9._-]{1,249}$')
		THEN 'its topics are not valid Kafka topic names'
		ELSE (obx._options_problem(s.options))[2]
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
CREATE OR REPLACE FUNCTION obx._subscribe(caller oid, consumer_name text, topics text[],
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

	INSERT INTO obx.subscriptions AS s (consumer_name, topics, handler, handler_owner,
										options, owner)
	VALUES (_subscribe.consumer_name, _subscribe.topics, _subscribe.handler::text,
			fn.proowner::regrole, _subscribe.options, owner_role::regrole)
	ON CONFLICT ON CONSTRAINT subscriptions_pkey DO UPDATE
	   SET topics = excluded.topics, handler = excluded.handler,
		   handler_owner = excluded.handler_owner,
		   options = excluded.options, owner = excluded.owner, updated_at = now()
	 WHERE (s.topics, s.handler, s.handler_owner, s.options, s.owner)
		   IS DISTINCT FROM (excluded.topics, excluded.handler, excluded.handler_owner,
							 excluded.options, excluded.owner);
END
$$;

CREATE OR REPLACE FUNCTION obx._unsubscribe(caller oid, consumer_name text)
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
	DELETE FROM obx.consumer_kafka_errors k WHERE k.consumer_name = _unsubscribe.consumer_name;
	RETURN true;
END
$$;

/*
 * replay_dead_letter: run the subscription's current handler on dead
 * letters, in the caller's transaction, each in a subtransaction of its
 * own.  One that fails again stays a dead letter with the new error.
 * Who may replay is who may EXECUTE it: it runs as the extension owner
 * (it marks the event processed and reads the subscription), and the
 * handler itself runs as the subscription's owner, restricted
 * (obx._replay_handler), never as the caller or the extension owner.
 */
CREATE OR REPLACE FUNCTION obx.replay_dead_letter(ids bigint[])
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	d obx.dead_letters;
	sub text;
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
		SELECT s.consumer_name, obx._handler(s) INTO sub, fn FROM obx.subscriptions s
		 WHERE s.consumer_name = d.consumer_name;
		BEGIN
			IF sub IS NULL THEN
				RAISE EXCEPTION 'no obx subscription "%"', d.consumer_name
					USING ERRCODE = 'undefined_object';
			ELSIF fn IS NULL THEN
				RAISE EXCEPTION 'the handler of obx subscription "%" no longer exists', d.consumer_name
					USING ERRCODE = 'undefined_function',
						  HINT = 'obx.consumers.problem says why; obx.subscribe names a handler again.';
			END IF;
			/* A tombstone (no payload, no raw value) is replayed as one. */
			IF d.event_id IS NULL OR (d.payload IS NULL AND d.raw_payload IS NOT NULL) THEN
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

CREATE VIEW obx.workers AS SELECT * FROM obx.worker_status();

/* Cumulative histogram per topic since the server started (src/latency.c). */
CREATE VIEW obx.publish_latency AS SELECT * FROM obx.publish_latency_buckets();

/*
 * Median and 99th percentile of the publish latency per topic over the
 * last minute, from the retained events themselves (the published_at
 * index finds them).  Reads every event published in the window: at high
 * rates prefer histogram_quantile over obx_publish_latency_seconds.
 */
CREATE VIEW obx.publish_latency_summary AS
SELECT e.topic,
	   count(*) AS events,
	   percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM e.published_at - e.occurred_at)) AS p50,
	   percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM e.published_at - e.occurred_at)) AS p99,
	   interval '1 minute' AS window_length
  FROM obx.outbox_events e
 WHERE e.published_at IS NOT NULL
   AND e.published_at > now() - interval '1 minute'
 GROUP BY e.topic;

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
	   obx._subscription_problem(s) AS problem,
	   CASE WHEN pg_has_role('pg_monitor', 'USAGE') THEN k.error END AS kafka_error,
	   k.error_at AS kafka_error_at
  FROM obx.subscriptions s
  LEFT JOIN obx.consumer_status c ON c.consumer_name = s.consumer_name
		AND c.topic = ANY (s.topics)
  LEFT JOIN obx.consumer_kafka_errors k ON k.consumer_name = s.consumer_name
 GROUP BY s.consumer_name, s.topics, s.handler, s.owner, k.error, k.error_at;

/* As 1.0 left the rest (obx--1.0.sql, "Privileges"). */
REVOKE ALL ON obx.subscriptions, obx.consumer_kafka_errors, obx.workers, obx.publish_latency,
	obx.publish_latency_summary, obx.consumer_status, obx.consumers FROM PUBLIC;
REVOKE ALL ON FUNCTION obx.enqueue_many(text, text[], jsonb[], text[], text[], jsonb[], uuid[]),
	obx.enqueue_tombstone(text, text, text, text, jsonb, uuid), obx._warn_unserved(),
	obx._handler(obx.subscriptions), obx._kafka_value_problem(text, text),
	obx.worker_status(), obx._subscription_problem(obx.subscriptions),
	obx._relay_problem(), obx.publish_latency_buckets() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION obx.worker_status(), obx._subscription_problem(obx.subscriptions),
	obx._relay_problem(), obx.publish_latency_buckets() TO PUBLIC;

COMMENT ON TABLE obx.subscriptions IS
	'Kafka topics the consumer workers read, as consumer group consumer_name, and the handler each message goes to';
COMMENT ON TABLE obx.consumer_kafka_errors IS
	'The last Kafka error of each consumer group, until a message of it is fetched again (obx.consumers.kafka_error)';
COMMENT ON FUNCTION obx.enqueue_many(text, text[], jsonb[], text[], text[], jsonb[], uuid[]) IS
	'Store many events of one topic in the outbox inside the current transaction, in array order; returns their ids';
COMMENT ON FUNCTION obx.enqueue_tombstone(text, text, text, text, jsonb, uuid) IS
	'Store a tombstone (the key with a null value) in the outbox inside the current transaction; returns its id';
COMMENT ON COLUMN obx.outbox_events.payload IS
	'The message value; NULL for a tombstone (obx.enqueue_tombstone), published as a null value';
COMMENT ON VIEW obx.workers IS
	'One row per relay worker: the database it serves, state, counters, events/s, last success and last error';
COMMENT ON VIEW obx.publish_latency IS
	'Per topic, enqueue to Kafka acknowledgement: cumulative counts of events whose latency was at most le seconds, and the sum in seconds, since the server started';
COMMENT ON VIEW obx.publish_latency_summary IS
	'Per topic, median and 99th percentile of enqueue to Kafka acknowledgement, in seconds, over the events published in the last minute';
COMMENT ON VIEW obx.consumer_status IS
	'Per consumer, topic and partition: position, lag, processed, duplicates, dead letters, retries, last error';
COMMENT ON VIEW obx.consumers IS
	'One row per subscription: totals, lag, dead letters waiting for replay, last error, and why the workers skip it (problem)';

SELECT pg_catalog.pg_extension_config_dump('obx.subscriptions', '');

/*
 * No silent dead end: warn now if no relay of this server will publish
 * this database's outbox (src/base/status.c), as 1.1's obx--1.0.sql did
 * at its end.
 */
SELECT obx._warn_unserved();

/* ---------------------------------------------------------------------
 * Part 2: the outbox log (1.1's own update)
 * --------------------------------------------------------------------- */


/* ---------------------------------------------------------------------
 * Generations.  The high bits of obx.event_seq and obx.lease_seq (bits 40
 * and up) count generations; a row's generation modulo 3 is the partition
 * it lives in.  Rotation (obx._rotate) moves both sequences to the next
 * generation; a generation whose events are all published and past
 * obx.retention is truncated, partition by partition.
 * --------------------------------------------------------------------- */

CREATE TABLE obx.generations (
	generation			bigint		PRIMARY KEY,
	started_at			timestamptz NOT NULL DEFAULT now(),
	done_at				timestamptz		/* every event of it published (or held aside) */
);
INSERT INTO obx.generations (generation) VALUES (0);

/*
 * The events, in three partitions.  Inserted by obx.enqueue and never
 * written again.  xid is the inserting transaction's 64-bit id (an xid8 as
 * a bigint, which the planner can estimate ranges of): the claim finds
 * late committers by it.
 */
CREATE TABLE obx.events (
	id					uuid		NOT NULL,
	seq					bigint		NOT NULL DEFAULT nextval('obx.event_seq'),
	xid					bigint		NOT NULL DEFAULT pg_current_xact_id()::text::bigint,
	aggregate_id		text		NOT NULL,
	topic				text		NOT NULL,
	event_key			text		NOT NULL,
	event_type			text,
	headers				jsonb,
	payload				jsonb,		/* NULL: a tombstone (obx.enqueue_tombstone) */
	occurred_at			timestamptz NOT NULL DEFAULT clock_timestamp()
) PARTITION BY LIST (((seq >> 40) % 3));
CREATE TABLE obx.events_0 PARTITION OF obx.events FOR VALUES IN (0);
CREATE TABLE obx.events_1 PARTITION OF obx.events FOR VALUES IN (1);
CREATE TABLE obx.events_2 PARTITION OF obx.events FOR VALUES IN (2);
/* Unique per partition; obx.enqueue looks a given id up in all three. */
CREATE UNIQUE INDEX events_0_id_idx ON obx.events_0 (id);
CREATE UNIQUE INDEX events_1_id_idx ON obx.events_1 (id);
CREATE UNIQUE INDEX events_2_id_idx ON obx.events_2 (id);
/* The claim: from the floor in enqueue order, and late committers by xid. */
CREATE INDEX events_seq_idx ON obx.events (seq);
CREATE INDEX events_xid_idx ON obx.events (xid);

/*
 * Claims: one row per claimed batch, appended under the claim lock, never
 * updated.  Every row is also a tick: snap is the claim's snapshot and
 * floor the lowest seq it found unpublished, so that every event visible
 * in snap with a lower seq is published or held in obx.event_states.  The
 * next claim starts from the latest tick (obx._unpublished).  A claim that
 * took nothing appends a tick only (ids NULL) when the floor moved.
 */
CREATE TABLE obx.claims (
	lease_id			bigint		NOT NULL,
	owner				integer		NOT NULL,
	until				timestamptz NOT NULL,
	claimed_at			timestamptz NOT NULL DEFAULT now(),
	snap				pg_snapshot NOT NULL,
	floor				bigint		NOT NULL,
	max_seq				bigint,
	ids					uuid[],
	topics				text[],
	keys				text[]
) PARTITION BY LIST (((lease_id >> 40) % 3));
CREATE TABLE obx.claims_0 PARTITION OF obx.claims FOR VALUES IN (0);
CREATE TABLE obx.claims_1 PARTITION OF obx.claims FOR VALUES IN (1);
CREATE TABLE obx.claims_2 PARTITION OF obx.claims FOR VALUES IN (2);
CREATE INDEX claims_lease_idx ON obx.claims (lease_id);
CREATE INDEX claims_max_seq_idx ON obx.claims (max_seq);

/* A lease extended while its batch is still in flight. */
CREATE TABLE obx.renewals (
	lease_id			bigint		NOT NULL,
	until				timestamptz NOT NULL
) PARTITION BY LIST (((lease_id >> 40) % 3));
CREATE TABLE obx.renewals_0 PARTITION OF obx.renewals FOR VALUES IN (0);
CREATE TABLE obx.renewals_1 PARTITION OF obx.renewals FOR VALUES IN (1);
CREATE TABLE obx.renewals_2 PARTITION OF obx.renewals FOR VALUES IN (2);
CREATE INDEX renewals_lease_idx ON obx.renewals (lease_id);

/*
 * Records: one row per batch that came back, appended by the record step:
 * the events Kafka acknowledged, where each landed and when.  A record ends
 * its lease, whatever it holds (a release holds no event).  max_seq is the
 * claim's, so that the claim finds every record that can matter to it.
 */
CREATE TABLE obx.records (
	lease_id			bigint		NOT NULL,
	recorded_at			timestamptz NOT NULL DEFAULT now(),
	max_seq				bigint		NOT NULL,
	ids					uuid[]		NOT NULL,
	partitions			integer[]	NOT NULL,
	offsets				bigint[]	NOT NULL,
	published_at		timestamptz[] NOT NULL
) PARTITION BY LIST (((lease_id >> 40) % 3));
CREATE TABLE obx.records_0 PARTITION OF obx.records FOR VALUES IN (0);
CREATE TABLE obx.records_1 PARTITION OF obx.records FOR VALUES IN (1);
CREATE TABLE obx.records_2 PARTITION OF obx.records FOR VALUES IN (2);
CREATE INDEX records_lease_idx ON obx.records (lease_id);
CREATE INDEX records_max_seq_idx ON obx.records (max_seq);
/* Where one event landed (obx.outbox_events). */
CREATE INDEX records_ids_idx ON obx.records USING gin (ids);

/*
 * The few events that are not simply pending or published: failing
 * (backing off), quarantined, skipped, or replayed.  Each holds a copy of
 * its event, so it outlives the event's generation.  The only table of the
 * publish path whose rows are updated, and only for those events.
 */
CREATE TABLE obx.event_states (
	id					uuid		PRIMARY KEY,
	seq					bigint		NOT NULL,
	aggregate_id		text		NOT NULL,
	topic				text		NOT NULL,
	event_key			text		NOT NULL,
	event_type			text,
	headers				jsonb,
	payload				jsonb,
	occurred_at			timestamptz NOT NULL,
	attempts			integer		NOT NULL DEFAULT 0,
	failures			integer		NOT NULL DEFAULT 0,
	next_attempt_at		timestamptz NOT NULL DEFAULT '-infinity',
	quarantined_at		timestamptz,
	skipped_at			timestamptz,
	replayed_at			timestamptz,
	published_at		timestamptz,	/* set when it is published again */
	last_error			text,
	last_error_class	text,
	last_error_at		timestamptz
);

/* ---------------------------------------------------------------------
 * 1.0's events, carried over: published ones as one record per 1,000
 * (there is no claim yet, so the first claim reads them all), failed
 * and quarantined ones into obx.event_states; pending ones need nothing.
 * 1.0's leases are dropped: their events were not published, and are
 * claimed again (at least once, with the same ids).
 * --------------------------------------------------------------------- */

INSERT INTO obx.events (id, seq, aggregate_id, topic, event_key, event_type,
						headers, payload, occurred_at)
SELECT id, seq, aggregate_id, topic, event_key, event_type, headers, payload, occurred_at
  FROM obx.outbox_events;

INSERT INTO obx.records (lease_id, recorded_at, max_seq, ids, partitions, offsets, published_at)
SELECT nextval('obx.lease_seq'), now(), max(seq), array_agg(id ORDER BY seq),
	   array_agg(coalesce(kafka_partition, -1) ORDER BY seq),
	   array_agg(coalesce(kafka_offset, -1) ORDER BY seq),
	   array_agg(published_at ORDER BY seq)
  FROM (SELECT e.*, (row_number() OVER (ORDER BY seq) - 1) / 1000 AS chunk
		  FROM obx.outbox_events e WHERE published_at IS NOT NULL) p
 GROUP BY chunk;

INSERT INTO obx.event_states (id, seq, aggregate_id, topic, event_key, event_type,
							  headers, payload, occurred_at, attempts, failures,
							  next_attempt_at, quarantined_at, last_error,
							  last_error_class, last_error_at)
SELECT id, seq, aggregate_id, topic, event_key, event_type, headers, payload,
	   occurred_at, attempts, failures, next_attempt_at, quarantined_at,
	   last_error, last_error_class, last_error_at
  FROM obx.outbox_events
 WHERE published_at IS NULL
   AND (quarantined_at IS NOT NULL OR next_attempt_at > '-infinity' OR last_error IS NOT NULL);

/* What 1.0's functions and views read goes, and comes back as views below. */
DROP VIEW obx.status;
DROP VIEW obx.leased_events;
DROP VIEW obx.quarantine;
DROP VIEW obx.publish_latency_summary;
DROP FUNCTION obx.replay(text, timestamptz, timestamptz);
ALTER EXTENSION obx DROP TABLE obx.outbox_events;
ALTER EXTENSION obx DROP TABLE obx.leases;
DROP TABLE obx.leases;
/* skipped_events was LIKE outbox_events: it keeps its columns as they were. */
DROP TABLE obx.outbox_events;

/* ---------------------------------------------------------------------
 * The steps' SQL, shared by every runtime: what is unpublished, what is
 * leased, and the rotation.
 * --------------------------------------------------------------------- */

/*
 * The records that can name an event _unpublished considers, as of the
 * tick (floor, tick): those of batches that held an event at or above the
 * floor, and those of every claim after the tick.
 */
CREATE FUNCTION obx._published_ids(floor bigint, tick bigint)
RETURNS SETOF uuid
LANGUAGE sql STABLE
AS $$
	SELECT u.id
	  FROM obx.records r, unnest(r.ids) AS u(id)
	 WHERE r.max_seq >= _published_ids.floor OR r.lease_id > _published_ids.tick
$$;

/*
 * The events neither published nor held in obx.event_states, as of the
 * tick (floor, snap, tick) of the latest claim, in two parts: those at or
 * above the floor (_unpublished_from, read in seq order on the seq index),
 * and the late committers below it (_unpublished_late: transactions that
 * were running or not yet started when snap was taken, on the xid index).
 * Each part is one SELECT, inlined into the claim, which reads each in seq
 * order up to the batch size: the planner merges the partitions' index
 * scans and stops early, which it does not do across a UNION ALL.
 * _unpublished is both, for the rest.
 */
CREATE FUNCTION obx._unpublished_from(floor bigint, tick bigint)
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

CREATE FUNCTION obx._unpublished_late(floor bigint, snap pg_snapshot, tick bigint)
RETURNS SETOF obx.events
LANGUAGE sql STABLE
AS $$
	/* seq + 0: the xid index, never the seq index below the floor (all history). */
	SELECT e.*
	  FROM obx.events e
	 WHERE e.xid >= pg_snapshot_xmax(_unpublished_late.snap)::text::bigint
	   AND e.seq + 0 < _unpublished_late.floor
	   AND e.id NOT IN (SELECT p FROM obx._published_ids(_unpublished_late.floor,
														  _unpublished_late.tick) p)
	   AND e.id NOT IN (SELECT s.id FROM obx.event_states s)
	UNION ALL
	SELECT e.*
	  FROM obx.events e
	 WHERE e.xid = ANY (ARRAY(SELECT x::text::bigint
								FROM pg_snapshot_xip(_unpublished_late.snap) x))
	   AND e.seq + 0 < _unpublished_late.floor
	   AND e.id NOT IN (SELECT p FROM obx._published_ids(_unpublished_late.floor,
														  _unpublished_late.tick) p)
	   AND e.id NOT IN (SELECT s.id FROM obx.event_states s)
$$;

CREATE FUNCTION obx._unpublished(floor bigint, snap pg_snapshot, tick bigint)
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
 * keeps no claim: another cluster's transaction ids mean nothing here),
 * the tick before everything: every event and every record is read.
 */
CREATE FUNCTION obx._tick()
RETURNS TABLE (floor bigint, snap pg_snapshot, tick bigint)	/* a set: inlined */
LANGUAGE sql STABLE
AS $$
	SELECT * FROM (
		SELECT c.floor, c.snap, c.lease_id FROM obx.claims c ORDER BY c.lease_id DESC LIMIT 1) t
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
CREATE FUNCTION obx._live_leases(floor bigint, tick bigint)
RETURNS SETOF obx.claims
LANGUAGE sql STABLE
AS $$
	SELECT c.*
	  FROM obx.claims c
	 WHERE (c.max_seq >= _live_leases.floor OR c.lease_id > _live_leases.tick)
	   AND c.ids IS NOT NULL
	   AND NOT EXISTS (SELECT 1 FROM obx.records r WHERE r.lease_id = c.lease_id)
	   AND greatest(c.until, (SELECT max(n.until) FROM obx.renewals n
							   WHERE n.lease_id = c.lease_id)) >= now()
$$;

/*
 * The same two sets as of the latest tick, as views for the status views:
 * a view reads its tables as its owner, and a function called from a view
 * would need EXECUTE and SELECT granted to every reader.  They are not
 * written twice by hand: a view's text is the functions' with the latest
 * tick joined in, and test/sql/operations.sql checks that both give the
 * same rows.
 */
CREATE VIEW obx._latest_tick AS
SELECT t.floor, t.snap, t.tick FROM (
	SELECT * FROM (
		SELECT c.floor, c.snap, c.lease_id AS tick FROM obx.claims c
		 ORDER BY c.lease_id DESC LIMIT 1) x
	UNION ALL
	SELECT 0, '1:1:', 0
	ORDER BY 3 DESC
	LIMIT 1) t;

CREATE VIEW obx._unpublished_events AS
WITH t AS MATERIALIZED (SELECT * FROM obx._latest_tick),
	 published AS MATERIALIZED (
		SELECT u.id FROM t, obx.records r, unnest(r.ids) AS u(id)
		 WHERE r.max_seq >= t.floor OR r.lease_id > t.tick),
	 held AS MATERIALIZED (SELECT s.id FROM obx.event_states s)
SELECT e.*
  FROM obx.events e, t
 WHERE e.seq >= t.floor
   AND e.id NOT IN (SELECT id FROM published)
   AND e.id NOT IN (SELECT id FROM held)
UNION ALL
SELECT e.*
  FROM obx.events e, t
 WHERE e.seq < t.floor
   AND (e.xid >= pg_snapshot_xmax(t.snap)::text::bigint
		OR e.xid = ANY (ARRAY(SELECT x::text::bigint FROM pg_snapshot_xip(t.snap) x)))
   AND e.id NOT IN (SELECT id FROM published)
   AND e.id NOT IN (SELECT id FROM held);

CREATE VIEW obx._live_claims AS
SELECT c.*
  FROM obx.claims c, obx._latest_tick t
 WHERE (c.max_seq >= t.floor OR c.lease_id > t.tick)
   AND c.ids IS NOT NULL
   AND NOT EXISTS (SELECT 1 FROM obx.records r WHERE r.lease_id = c.lease_id)
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
 * it was done, in all four tables at once, without waiting for the lock:
 * a claim or a report that holds a partition makes it try again later.
 * The current generation is rotated away after half of obx.retention,
 * once the partition it moves to is empty, under the claim lock, so that
 * a claim's lease ids and the events it can see change generation
 * together.  retention_s 0 keeps every event: no rotation.
 */
CREATE FUNCTION obx._rotate(retention_s float8)
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
	IF retention_s <= 0 THEN
		RETURN NULL;
	END IF;
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

/* ---------------------------------------------------------------------
 * What users read: obx.outbox_events as a view, the status views.
 * --------------------------------------------------------------------- */

/*
 * Every retained event, as 1.0's table showed it: published once a record
 * names it (or, for an event with a state, once the state says so);
 * partition and offset from its first record since its latest replay (a
 * stale worker's late report of a second copy does not move them);
 * errors and attempts from obx.event_states.  Skipped events are in obx.skipped_events instead.
 * Reading where one event landed is an index lookup; reading them all
 * joins every record.
 */
CREATE VIEW obx.outbox_events AS
SELECT e.id, e.seq, e.aggregate_id, e.topic, e.event_key, e.event_type,
	   e.headers, e.payload, e.occurred_at,
	   CASE WHEN s.id IS NULL THEN r.published_at ELSE s.published_at END AS published_at,
	   coalesce(s.attempts, (r.published_at IS NOT NULL)::integer) AS attempts,
	   coalesce(s.failures, 0) AS failures,
	   coalesce(s.next_attempt_at, '-infinity') AS next_attempt_at,
	   s.quarantined_at, s.last_error, s.last_error_class, s.last_error_at,
	   CASE WHEN s.id IS NULL OR s.published_at IS NOT NULL THEN r.kafka_partition END
		 AS kafka_partition,
	   CASE WHEN s.id IS NULL OR s.published_at IS NOT NULL THEN r.kafka_offset END
		 AS kafka_offset
  FROM obx.events e
  LEFT JOIN obx.event_states s ON s.id = e.id
  LEFT JOIN LATERAL (
	SELECT x.published_at[i] AS published_at, x.partitions[i] AS kafka_partition,
		   x.offsets[i] AS kafka_offset
	  FROM obx.records x, array_position(x.ids, e.id) AS i
	 WHERE x.ids @> ARRAY[e.id]
	   AND x.recorded_at >= coalesce(s.replayed_at, '-infinity')
	 ORDER BY x.recorded_at
	 LIMIT 1) r ON true
 WHERE s.skipped_at IS NULL
UNION ALL
/* Held events whose generation was truncated: their state keeps them. */
SELECT s.id, s.seq, s.aggregate_id, s.topic, s.event_key, s.event_type,
	   s.headers, s.payload, s.occurred_at, s.published_at, s.attempts, s.failures,
	   s.next_attempt_at, s.quarantined_at, s.last_error, s.last_error_class,
	   s.last_error_at, NULL, NULL
  FROM obx.event_states s
 WHERE s.skipped_at IS NULL
   AND NOT EXISTS (SELECT 1 FROM obx.events e WHERE e.id = s.id);

/*
 * Per-topic health: the numbers to alert on.  One pass over each table,
 * grouped by topic: the retained events (counted), the unpublished ones as
 * of the latest tick (obx._unpublished_events), the states, the live
 * leases and the records.
 */
CREATE VIEW obx.status AS
WITH leased AS (
	SELECT DISTINCT x.id FROM obx._live_claims l, unnest(l.ids) AS x(id)
),
ev AS (
	SELECT e.topic, count(*) AS n FROM obx.events e GROUP BY e.topic
),
un AS (
	SELECT u.topic,
		   count(*) FILTER (WHERE l.id IS NULL) AS pending,
		   count(*) FILTER (WHERE l.id IS NOT NULL) AS leased,
		   count(*) AS n,
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
		   count(*) FILTER (WHERE s.published_at IS NULL
							AND EXISTS (SELECT 1 FROM obx.events e WHERE e.id = s.id)) AS unpublished_retained,
		   min(s.occurred_at) FILTER (WHERE s.published_at IS NULL AND s.skipped_at IS NULL) AS oldest,
		   (array_agg(s.last_error ORDER BY s.last_error_at DESC)
			  FILTER (WHERE s.last_error IS NOT NULL))[1] AS last_error,
		   max(s.last_error_at) AS last_error_at,
		   max(s.published_at) AS last_published_at
	  FROM obx.event_states s LEFT JOIN leased l ON l.id = s.id
	 GROUP BY s.topic
),
pub AS (
	SELECT e.topic, max(x.t) AS last_published_at
	  FROM obx.records r, unnest(r.ids, r.published_at) AS x(id, t), obx.events e
	 WHERE e.id = x.id
	 GROUP BY e.topic
),
topics AS (
	SELECT topic FROM ev UNION SELECT topic FROM st
)
SELECT t.topic,
	   coalesce(un.pending, 0) + coalesce(st.pending, 0) AS pending,
	   coalesce(un.leased, 0) + coalesce(st.leased, 0) AS leased,
	   coalesce(ev.n, 0) - coalesce(un.n, 0) - coalesce(st.unpublished_retained, 0) AS published,
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
  LEFT JOIN ev ON ev.topic = t.topic
  LEFT JOIN un ON un.topic = t.topic
  LEFT JOIN st ON st.topic = t.topic
  LEFT JOIN pub ON pub.topic = t.topic;

/* The live leases, with 1.0's columns: one row per batch in flight. */
CREATE VIEW obx.leases AS
SELECT l.lease_id, l.owner,
	   greatest(l.until, (SELECT max(n.until) FROM obx.renewals n
						   WHERE n.lease_id = l.lease_id)) AS until,
	   l.claimed_at, l.ids, l.topics, l.keys
  FROM obx._live_claims l;

/* One row per leased event, for people and tests. */
CREATE VIEW obx.leased_events AS
SELECT u.id, u.topic, u.event_key, l.lease_id, l.owner AS lease_owner,
	   greatest(l.until, (SELECT max(n.until) FROM obx.renewals n
						   WHERE n.lease_id = l.lease_id)) AS lease_until,
	   l.claimed_at
  FROM obx._live_claims l,
	   unnest(l.ids, l.topics, l.keys) AS u(id, topic, event_key);

CREATE VIEW obx.quarantine AS
SELECT s.id, s.topic, s.event_key, s.event_type, s.attempts,
	   s.last_error_class, s.last_error, s.quarantined_at, s.occurred_at
  FROM obx.event_states s
 WHERE s.quarantined_at IS NOT NULL AND s.published_at IS NULL AND s.skipped_at IS NULL;

/*
 * Median and 99th percentile of the publish latency per topic over the
 * last minute, from the records of that minute.
 */
CREATE VIEW obx.publish_latency_summary AS
SELECT e.topic,
	   count(*) AS events,
	   percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM x.t - e.occurred_at)) AS p50,
	   percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM x.t - e.occurred_at)) AS p99,
	   interval '1 minute' AS window_length
  FROM obx.records r,
	   unnest(r.ids, r.published_at) AS x(id, t),
	   obx.events e
 WHERE r.recorded_at > now() - interval '1 minute'
   AND x.t > now() - interval '1 minute'
   AND e.id = x.id
 GROUP BY e.topic;

/* ---------------------------------------------------------------------
 * The operator functions, on obx.event_states.
 * --------------------------------------------------------------------- */

/* Copy events into obx.event_states (a no-op for those already there). */
CREATE FUNCTION obx._hold(ids uuid[])
RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
	INSERT INTO obx.event_states (id, seq, aggregate_id, topic, event_key, event_type,
								  headers, payload, occurred_at)
	SELECT e.id, e.seq, e.aggregate_id, e.topic, e.event_key, e.event_type,
		   e.headers, e.payload, e.occurred_at
	  FROM obx.events e WHERE e.id = ANY (ids)
	ON CONFLICT (id) DO NOTHING
$$;

CREATE OR REPLACE FUNCTION obx.retry(event_id uuid)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	n integer;
BEGIN
	UPDATE obx.event_states s
	   SET quarantined_at = NULL, attempts = 0, failures = 0, next_attempt_at = '-infinity'
	 WHERE s.id = retry.event_id
	   AND s.published_at IS NULL AND s.skipped_at IS NULL
	   AND (s.quarantined_at IS NOT NULL OR s.next_attempt_at > now());
	GET DIAGNOSTICS n = ROW_COUNT;
	IF n > 0 THEN
		PERFORM obx._wake_at_commit();
	END IF;
	RETURN n > 0;
END
$$;

CREATE OR REPLACE FUNCTION obx.retry_quarantined(topic text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	n bigint;
BEGIN
	UPDATE obx.event_states s
	   SET quarantined_at = NULL, attempts = 0, failures = 0, next_attempt_at = '-infinity'
	 WHERE s.published_at IS NULL AND s.skipped_at IS NULL
	   AND s.quarantined_at IS NOT NULL
	   AND (retry_quarantined.topic IS NULL OR s.topic = retry_quarantined.topic);
	GET DIAGNOSTICS n = ROW_COUNT;
	IF n > 0 THEN
		PERFORM obx._wake_at_commit();
	END IF;
	RETURN n;
END
$$;

/*
 * skip: give up on a quarantined event.  Its state stays (skipped), so it
 * is never claimed again; a copy goes to obx.skipped_events with the reason.
 */
CREATE OR REPLACE FUNCTION obx.skip(event_id uuid, reason text)
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
		UPDATE obx.event_states s
		   SET skipped_at = now()
		 WHERE s.id = skip.event_id
		   AND s.published_at IS NULL AND s.skipped_at IS NULL
		   AND s.quarantined_at IS NOT NULL
		RETURNING s.*
	)
	INSERT INTO obx.skipped_events
		(id, seq, aggregate_id, topic, event_key, event_type, headers, payload,
		 occurred_at, published_at, attempts, failures, next_attempt_at,
		 quarantined_at, last_error, last_error_class, last_error_at,
		 kafka_partition, kafka_offset, skipped_at, skipped_by, skip_reason)
	SELECT g.id, g.seq, g.aggregate_id, g.topic, g.event_key, g.event_type, g.headers,
		   g.payload, g.occurred_at, NULL, g.attempts, g.failures, g.next_attempt_at,
		   g.quarantined_at, g.last_error, g.last_error_class, g.last_error_at,
		   NULL, NULL, now(), session_user, skip.reason
	  FROM gone g;
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
CREATE OR REPLACE FUNCTION obx.replay(event_ids uuid[])
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	ids uuid[];
	n bigint;
BEGIN
	SELECT coalesce(array_agg(o.id), '{}') INTO ids
	  FROM obx.outbox_events o
	 WHERE o.id = ANY (replay.event_ids) AND o.published_at IS NOT NULL;
	PERFORM obx._hold(ids);
	UPDATE obx.event_states s
	   SET published_at = NULL, replayed_at = now(), quarantined_at = NULL,
		   attempts = 0, failures = 0, next_attempt_at = '-infinity'
	 WHERE s.id = ANY (ids);
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

/* ---------------------------------------------------------------------
 * Privileges, comments, pg_dump
 * --------------------------------------------------------------------- */

REVOKE ALL ON obx.generations, obx.events, obx.claims, obx.renewals, obx.records,
	obx.event_states, obx.outbox_events, obx.status, obx.leased_events,
	obx.quarantine, obx.publish_latency_summary, obx.leases, obx._latest_tick,
	obx._unpublished_events, obx._live_claims FROM PUBLIC;
REVOKE ALL ON FUNCTION obx._published_ids(bigint, bigint),
	obx._unpublished(bigint, pg_snapshot, bigint), obx._unpublished_from(bigint, bigint),
	obx._unpublished_late(bigint, pg_snapshot, bigint), obx._tick(),
	obx._live_leases(bigint, bigint),
	obx._rotate(float8), obx._hold(uuid[]),
	obx.replay(text, timestamptz, timestamptz) FROM PUBLIC;

COMMENT ON TABLE obx.events IS
	'Every event enqueued, inserted once and never updated; old generations are truncated after obx.retention';
COMMENT ON COLUMN obx.events.seq IS
	'Enqueue order; events of one topic and key are published in this order.  Bits 40 and up: the generation';
COMMENT ON TABLE obx.claims IS
	'Batches claimed by relay workers, one row each, never updated; each row is also a tick the next claim starts from';
COMMENT ON TABLE obx.records IS
	'What came back of each batch: the events Kafka acknowledged, their partitions, offsets and times';
COMMENT ON TABLE obx.event_states IS
	'Events failing, quarantined, skipped or replayed, each with a copy of the event';
COMMENT ON TABLE obx.generations IS
	'Generations of the outbox: when each started and when all its events were published';
COMMENT ON VIEW obx.outbox_events IS
	'Every retained event as obx 1.0 showed it: published_at IS NULL while it waits for Kafka';
COMMENT ON VIEW obx.status IS
	'Per topic: pending, leased, published (still retained), quarantined, age of the oldest unpublished event, last error, and why no relay publishes them (problem)';
COMMENT ON VIEW obx.leases IS
	'Batches claimed by relay workers whose lease has not run out: one row per batch, its events in parallel arrays';
COMMENT ON VIEW obx.leased_events IS
	'Events leased to a relay worker whose lease has not run out';
COMMENT ON VIEW obx.quarantine IS
	'Events the relay gave up on, with their errors; obx.retry(id) sends one again';
COMMENT ON VIEW obx.publish_latency_summary IS
	'Per topic, median and 99th percentile of enqueue to Kafka acknowledgement, in seconds, over the events published in the last minute';
COMMENT ON FUNCTION obx.replay(text, timestamptz, timestamptz) IS
	'Publish again the events of a topic that occurred in [since, until); returns how many';

SELECT pg_catalog.pg_extension_config_dump('obx.events_0', '');
SELECT pg_catalog.pg_extension_config_dump('obx.events_1', '');
SELECT pg_catalog.pg_extension_config_dump('obx.events_2', '');
SELECT pg_catalog.pg_extension_config_dump('obx.records_0', '');
SELECT pg_catalog.pg_extension_config_dump('obx.records_1', '');
SELECT pg_catalog.pg_extension_config_dump('obx.records_2', '');
SELECT pg_catalog.pg_extension_config_dump('obx.event_states', '');
SELECT pg_catalog.pg_extension_config_dump('obx.generations', '');
SELECT pg_catalog.pg_extension_config_dump('obx.lease_seq', '');
