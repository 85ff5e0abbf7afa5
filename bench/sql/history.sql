-- history.sql: the history benchmark's procedures (bench/history.sh): the
-- fill of published history and the timing of one read.  Loaded by
-- bench/history.sh into the database bench/run made (after setup.sql);
-- loading it again replaces them.

/*
 * bench.fill_history: n more events of published history (n a multiple of
 * 1,000), laid out as the relay leaves them, chunk events per transaction:
 *   - obx.events: seq from obx.event_seq (taken with setval, so that later
 *     enqueues continue above), in the current generation; xid a past
 *     transaction's of its own (the fill first commits one empty
 *     transaction per event of the chunk, synchronous_commit off, and
 *     gives their ids to the events in seq order: every one below the
 *     snapshots taken after the fill, and as many distinct values as
 *     production's one event per transaction has, which the planner's
 *     estimates on the xid index depend on); the
 *     era of this install; 10,000 keys (aggregate_id = event_key), topics
 *     bench.history.0 to .3 in turn; occurred_at spread evenly over the 3
 *     days before the last 10 minutes; ids UUIDv7 of occurred_at, as
 *     obx.enqueue makes them (src/api/enqueue.c); payloads of about 200
 *     bytes of JSON text (bench.make_payload's fields and a sales channel);
 *   - per 1,000 events in seq order, one batch: a claim (lease_id from
 *     obx.lease_seq, owner worker 0, claimed 5 ms after its last event,
 *     leased for 60 s, snap the chunk's snapshot, floor its lowest seq,
 *     max_seq, ids, topics, keys) and its record (the same lease_id, ids,
 *     partition = a hash of the key modulo 4, offset = seq within the
 *     generation, published and recorded 6 ms after the claim, min_seq,
 *     max_seq);
 *   - if the table obx.published_counts exists: one row per batch and
 *     topic, (generation = lease_id >> 40, topic, events, publish time);
 *   - then one tick (a claim with no batch, as a relay's claim that found
 *     nothing appends when the floor moved): floor above every event, snap
 *     taken after the last chunk committed, so that every filled event
 *     counts as published.
 * Assumes no relay runs (obx.workers = 0) and nothing else enqueues.
 * CALL it outside a transaction block: it commits each chunk.
 */
CREATE OR REPLACE PROCEDURE bench.fill_history(n bigint, chunk integer DEFAULT 1000000)
LANGUAGE plpgsql AS $$
DECLARE
	per_batch constant integer := 1000;
	span constant interval := interval '3 days';
	t_end constant timestamptz := now() - interval '10 minutes';
	step interval;
	counts boolean := to_regclass('obx.published_counts') IS NOT NULL;
	done bigint := 0;
	c bigint;
	s0 bigint;
	l0 bigint;
	x bigint;
	j bigint;
BEGIN
	IF n <= 0 THEN
		RETURN;
	END IF;
	IF n % per_batch <> 0 OR chunk % per_batch <> 0 THEN
		RAISE EXCEPTION 'fill_history: n (%) and chunk (%) must be multiples of %', n, chunk, per_batch;
	END IF;
	step := span / n;
	/* The batches of a chunk are aggregated in memory. */
	PERFORM set_config('work_mem', '512MB', false);
	PERFORM set_config('synchronous_commit', 'off', false);
	CREATE TEMP TABLE IF NOT EXISTS fill_batches (
		lease_id bigint, min_seq bigint, max_seq bigint, ids uuid[], topics text[],
		keys text[], partitions integer[], offsets bigint[], last_at timestamptz);
	WHILE done < n LOOP
		c := least(chunk, n - done);
		s0 := nextval('obx.event_seq');
		PERFORM setval('obx.event_seq', s0 + c - 1);
		l0 := nextval('obx.lease_seq');
		PERFORM setval('obx.lease_seq', l0 + c / per_batch - 1);
		/* The events' transactions: c past xids from x + 1 on. */
		x := pg_current_xact_id()::text::bigint;
		COMMIT;
		FOR j IN 1..c LOOP
			PERFORM pg_current_xact_id();
			COMMIT;
		END LOOP;

		/*
		 * Expressions, not functions (a SQL function that is not inlined
		 * costs more than the row), and the payload as text (cheaper than
		 * jsonb_build_object).
		 */
		TRUNCATE fill_batches;
		WITH e AS (
			INSERT INTO obx.events (id, seq, xid, aggregate_id, topic, event_key, payload, occurred_at)
			SELECT encode(overlay(uuid_send(gen_random_uuid())
								  PLACING substr(int8send(((extract(epoch FROM t) * 1000)::bigint << 16)
														  | (7 << 12)), 1, 7)
								  FROM 1), 'hex')::uuid,
				   s0 + i, x + 1 + i, key, 'bench.history.' || ((s0 + i) % 4), key,
				   ('{"note": "xxxxxxxxxxxxxx", "lines": 3, "channel": "web-checkout", "orderId": "ord_' ||
					lpad((s0 + i)::text, 9, '0') || '", "currency": "USD", "eventType": "OrderPlaced", ' ||
					'"customerId": "' || key || '", "totalMinor": ' || ((s0 + i) * 7919) % 100000 ||
					', "schemaVersion": 1}')::jsonb,
				   t
			  FROM (SELECT i, 'cus_' || lpad(floor(random() * 10000)::int::text, 5, '0') AS key,
						   t_end - span + (done + i) * step AS t
					  FROM generate_series(0, c - 1) i) s
			RETURNING id, seq, topic, event_key, occurred_at)
		INSERT INTO fill_batches
		SELECT l0 + (e.seq - s0) / per_batch, min(e.seq), max(e.seq),
			   array_agg(e.id ORDER BY e.seq), array_agg(e.topic ORDER BY e.seq),
			   array_agg(e.event_key ORDER BY e.seq),
			   array_agg(abs(hashtext(e.event_key)) % 4 ORDER BY e.seq),
			   array_agg(e.seq & ((1::bigint << 40) - 1) ORDER BY e.seq),
			   max(e.occurred_at)
		  FROM e
		 GROUP BY 1;

		INSERT INTO obx.claims (lease_id, owner, until, claimed_at, snap, floor, max_seq, ids, topics, keys)
		SELECT b.lease_id, 0, b.last_at + interval '60.005 s', b.last_at + interval '5 ms',
			   pg_current_snapshot(), b.min_seq, b.max_seq, b.ids, b.topics, b.keys
		  FROM fill_batches b ORDER BY b.lease_id;

		INSERT INTO obx.records (lease_id, recorded_at, max_seq, min_seq, ids, partitions, offsets, published_at)
		SELECT b.lease_id, b.last_at + interval '11 ms', b.max_seq, b.min_seq, b.ids,
			   b.partitions, b.offsets,
			   array_fill(b.last_at + interval '11 ms', ARRAY[cardinality(b.ids)])
		  FROM fill_batches b ORDER BY b.lease_id;

		IF counts THEN
			EXECUTE $q$
				INSERT INTO obx.published_counts (generation, topic, published, last_published_at)
				SELECT b.lease_id >> 40, t.topic, count(*), max(b.last_at + interval '11 ms')
				  FROM fill_batches b, unnest(b.topics) AS t(topic)
				 GROUP BY b.lease_id, t.topic
				 ORDER BY b.lease_id, t.topic$q$;
		END IF;

		done := done + c;
		COMMIT;
	END LOOP;

	/* The tick, in a transaction after the last chunk's. */
	INSERT INTO obx.claims (lease_id, owner, until, claimed_at, snap, floor)
	SELECT nextval('obx.lease_seq'), 0, now(), now(), pg_current_snapshot(),
		   (SELECT last_value + 1 FROM obx.event_seq);
	COMMIT;
END
$$;

/*
 * bench.time_read: run the query q once, every row and every column of
 * it (the rows are aggregated, so the planner plans it as a whole query,
 * not as a cursor, and computes every column); returns the milliseconds
 * it took, planning included, on the server's clock.
 */
CREATE OR REPLACE FUNCTION bench.time_read(q text) RETURNS float8
LANGUAGE plpgsql AS $$
DECLARE
	t0 timestamptz := clock_timestamp();
	n bigint;
BEGIN
	EXECUTE 'SELECT count(r IS NOT NULL) FROM (' || q || ') r' INTO n;
	RETURN extract(epoch FROM clock_timestamp() - t0) * 1000;
END
$$;
