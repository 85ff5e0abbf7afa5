-- setup.sql: the benchmark database's objects besides obx itself.
-- Run once by bench/run in a fresh database.

CREATE EXTENSION obx;

CREATE SCHEMA bench;

/*
 * The "plain INSERT" side of the enqueue benchmark, and the outbox a
 * hand-written relay would poll: obx 1.0's outbox table (its columns,
 * defaults, primary key, pending index and storage parameters), fed by a
 * sequence of its own (CACHE 1, like obx.event_seq), and no obx anywhere.
 * The drain benchmark's UPDATE baseline, 1.0's publish path, is a copy.
 */
CREATE SEQUENCE bench.plain_seq CACHE 1;
CREATE TABLE bench.plain_outbox (
	id					uuid		PRIMARY KEY,
	seq					bigint		NOT NULL DEFAULT nextval('bench.plain_seq'),
	aggregate_id		text		NOT NULL,
	topic				text		NOT NULL,
	event_key			text		NOT NULL,
	event_type			text,
	headers				jsonb,
	payload				jsonb,
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
CREATE INDEX plain_outbox_pending_idx ON bench.plain_outbox (seq) WHERE published_at IS NULL;

/*
 * LIKE copies no storage parameters (fillfactor, autovacuum): this copies
 * bench.plain_outbox's to a table made LIKE it.
 */
CREATE PROCEDURE bench.copy_storage_parameters(target regclass)
LANGUAGE plpgsql AS $$
DECLARE
	opts text;
BEGIN
	SELECT array_to_string(reloptions, ', ') INTO opts
	  FROM pg_class WHERE oid = 'bench.plain_outbox'::regclass;
	IF opts IS NOT NULL THEN
		EXECUTE format('ALTER TABLE %s SET (%s)', target, opts);
	END IF;
END
$$;

/*
 * bench.make_payload: the drain benchmark's event payload, about 180 bytes
 * of JSON text, for event number i of key number k.
 */
CREATE FUNCTION bench.make_payload(i bigint, k int) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
	SELECT jsonb_build_object(
		'eventType', 'OrderPlaced', 'schemaVersion', 1,
		'orderId', 'ord_' || lpad(i::text, 9, '0'),
		'customerId', 'cus_' || lpad(k::text, 5, '0'),
		'totalMinor', (i * 7919) % 100000, 'currency', 'USD',
		'lines', 3, 'note', repeat('x', 14))
$$;

/* Timed runs' results: a name, seconds, events (bench.save_result). */
CREATE TABLE bench.result (name text PRIMARY KEY, seconds float8, events bigint);

/* Saves a timed run's result: the seconds since started and its events. */
CREATE PROCEDURE bench.save_result(name text, started timestamptz, events bigint)
LANGUAGE sql AS $$
	INSERT INTO bench.result
	VALUES (name, extract(epoch FROM clock_timestamp() - started), events)
	ON CONFLICT (name) DO UPDATE SET seconds = EXCLUDED.seconds, events = EXCLUDED.events;
$$;

/*
 * The UPDATE baseline of the drain benchmark: mark every row of
 * bench.update_baseline published the way the relay marks delivered
 * events (src/relay/outbox.c, delivered_sql): one UPDATE ... FROM unnest(ids) of
 * batch_size rows taken in seq order from the pending index, one commit per
 * batch.  No claim, no lease, no Kafka: the database's own ceiling for
 * this work.  Leaves the elapsed seconds in bench.result.
 */
CREATE PROCEDURE bench.mark_published_baseline(batch_size int)
LANGUAGE plpgsql AS $$
DECLARE
	ids uuid[];
	total bigint := 0;
	started timestamptz := clock_timestamp();
BEGIN
	LOOP
		SELECT array_agg(id ORDER BY seq) INTO ids
		  FROM (SELECT id, seq FROM bench.update_baseline
				 WHERE published_at IS NULL ORDER BY seq LIMIT batch_size) s;
		EXIT WHEN ids IS NULL;
		UPDATE bench.update_baseline e
		   SET published_at = now(), kafka_partition = d.p, kafka_offset = d.o
		  FROM unnest(ids, array_fill(0, ARRAY[cardinality(ids)]),
					  ARRAY(SELECT generate_series(total, total + cardinality(ids) - 1)))
			   AS d(id, p, o)
		 WHERE e.id = d.id AND e.published_at IS NULL;
		total := total + cardinality(ids);
		COMMIT;
	END LOOP;
	CALL bench.save_result('update_baseline', started, total);
END
$$;

/*
 * The drain benchmark's ceiling of an insert-only relay: the least any
 * relay that reads its batches from obx.events in one session costs the
 * database.  Each batch: batch_size events read in seq order from where
 * the last one ended (the first from first_seq), their payloads as text
 * (what goes to Kafka), and one row in a table of its own that records
 * them (ids, partitions, offsets, times, as obx.records does), one commit
 * per batch.  No lease, no per-key order, no check of what is published,
 * failing or in flight, no Kafka: what lies between this and obx is what
 * obx's guarantees and its producer cost.  Leaves the elapsed seconds in
 * bench.result.
 */
CREATE TABLE bench.ceiling_records (
	max_seq				bigint		NOT NULL,
	ids					uuid[]		NOT NULL,
	partitions			integer[]	NOT NULL,
	offsets				bigint[]	NOT NULL,
	published_at		timestamptz[] NOT NULL
);

CREATE PROCEDURE bench.insert_only_ceiling(batch_size int, first_seq bigint)
LANGUAGE plpgsql AS $$
DECLARE
	ids uuid[];
	last_seq bigint := first_seq - 1;
	bytes bigint;
	total bigint := 0;
	started timestamptz := clock_timestamp();
BEGIN
	TRUNCATE bench.ceiling_records;
	COMMIT;
	LOOP
		SELECT array_agg(id ORDER BY seq), max(seq), sum(octet_length(payload::text))
		  INTO ids, last_seq, bytes
		  FROM (SELECT id, seq, payload FROM obx.events
				 WHERE seq > last_seq ORDER BY seq LIMIT batch_size) s;
		EXIT WHEN ids IS NULL;
		INSERT INTO bench.ceiling_records
		VALUES (last_seq, ids, array_fill(0, ARRAY[cardinality(ids)]),
				ARRAY(SELECT generate_series(total, total + cardinality(ids) - 1)),
				array_fill(now(), ARRAY[cardinality(ids)]));
		total := total + cardinality(ids);
		COMMIT;
	END LOOP;
	CALL bench.save_result('insert_only_ceiling', started, total);
END
$$;

/*
 * The consumer benchmark (bench/consumer.sh): the effect a handler writes,
 * one row per message, with when it was written.  The in-database
 * consumer's handler fills every column; the baselines (pgbench, no Kafka)
 * only event_id, order_id and topic.  xid is the handler's transaction,
 * whose commit time (track_commit_timestamp) ends a message's apply
 * latency.
 */
CREATE TABLE bench.consumer_effects (
	event_id			text		NOT NULL,
	order_id			text,
	topic				text		NOT NULL,
	kafka_timestamp		timestamptz,
	applied_at			timestamptz NOT NULL DEFAULT clock_timestamp(),
	xid					xid8,
	backend_pid			integer		NOT NULL DEFAULT pg_backend_pid()
);

CREATE FUNCTION bench.apply_order(e obx.inbound_event) RETURNS void
LANGUAGE sql AS $$
	INSERT INTO bench.consumer_effects (event_id, order_id, topic, kafka_timestamp, xid)
	VALUES (e.event_id, e.payload->>'orderId', e.topic, e.kafka_timestamp, pg_current_xact_id())
$$;

/*
 * Debezium's outbox (bench/debezium.sh): the columns its outbox
 * EventRouter reads by default, and n, the order of the inserts, which
 * the harness uses to tell a run's rows from the warm-up's (EventRouter
 * ignores it).
 */
CREATE TABLE bench.dbz_outbox (
	id					uuid		PRIMARY KEY,
	aggregatetype		text		NOT NULL,
	aggregateid			text		NOT NULL,
	type				text		NOT NULL,
	payload				jsonb,
	n					bigserial
);

/*
 * The application's business table beside Debezium (bench/debezium.sh):
 * each transaction of either side inserts an order row with its event.
 */
CREATE TABLE bench.orders (
	id					bigint		GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	order_id			text		NOT NULL,
	customer_id			text		NOT NULL,
	total_minor			integer		NOT NULL,
	currency			text		NOT NULL,
	placed_at			timestamptz	NOT NULL DEFAULT now()
);
