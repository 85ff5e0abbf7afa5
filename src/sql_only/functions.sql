/*
 * src/sql_only/functions.sql: the SQL-only install's versions of the
 * functions that the extension implements in C.
 *
 * tools/gen-sql-only builds obx-sql-only.sql from the extension's own
 * scripts (obx--1.0.sql, then every upgrade script in order), replacing
 * each "CREATE FUNCTION obx.<name>(...) ... LANGUAGE C" statement with the
 * block below that starts "-- replaces obx.<name>", at the same place, and
 * each line "-- @<snippet>" with the block that starts
 * "-- snippet <snippet>" (indented like the line).  Every table, view,
 * grant and SQL function comes from the extension's scripts, so the two
 * installs differ only in these functions; the pg_regress suite runs
 * against both with the same expected output (test/sql-only-check), which
 * is what keeps the checks here and in src/api/ alike.
 *
 * The checks read obx.topics and obx.max_payload_size as the C ones do,
 * from settings; without the library these are placeholders that a
 * session can change (docs/operations.md, "Managed PostgreSQL").
 */

-- snippet check_topic
IF v_topic = '' THEN
	RAISE EXCEPTION 'obx topic name must not be empty' USING ERRCODE = '22023';
END IF;
IF octet_length(v_topic) > 249 THEN
	RAISE EXCEPTION 'obx topic name is too long' USING ERRCODE = '22023',
		DETAIL = format('Kafka topic names have at most 249 characters; this one has %s.',
						octet_length(v_topic));
END IF;
IF v_topic IN ('.', '..') THEN
	RAISE EXCEPTION 'invalid obx topic name "%"', v_topic USING ERRCODE = '22023';
END IF;
IF v_topic COLLATE "C" !~ '^[a-zA-Z0-9._-]+$' THEN
	RAISE EXCEPTION 'invalid obx topic name "%"', v_topic USING ERRCODE = '22023',
		DETAIL = 'Kafka topic names may contain only ASCII letters, digits, ".", "_" and "-".';
END IF;
/* obx.topics: comma-separated; "x*" matches by prefix; blanks ignored. */
v_setting := coalesce(current_setting('obx.topics', true), '*');
v_allowed := false;
FOREACH v_entry IN ARRAY string_to_array(v_setting, ',') LOOP
	v_entry := btrim(v_entry, E' \t');
	IF v_entry = '' THEN
		CONTINUE;
	END IF;
	IF right(v_entry, 1) = '*' THEN
		v_allowed := starts_with(v_topic, left(v_entry, -1));
	ELSE
		v_allowed := v_topic = v_entry;
	END IF;
	EXIT WHEN v_allowed;
END LOOP;
IF NOT v_allowed THEN
	RAISE EXCEPTION 'obx topic "%" is not allowed', v_topic USING ERRCODE = '22023',
		DETAIL = format('obx.topics is "%s".', v_setting),
		HINT = 'Add the topic, or a prefix ending in *, to obx.topics.';
END IF;
/* obx.max_payload_size, for the event checks: bytes, or with a unit. */
v_setting := coalesce(nullif(current_setting('obx.max_payload_size', true), ''), '900000');
v_max := CASE WHEN v_setting ~ '^\s*[0-9]{1,10}\s*(B|kB|MB|GB)?\s*$'
			  THEN substring(v_setting FROM '[0-9]+')::bigint *
				   CASE substring(v_setting FROM '(B|kB|MB|GB)')
						WHEN 'kB' THEN 1024 WHEN 'MB' THEN 1048576
						WHEN 'GB' THEN 1073741824 ELSE 1 END END;
IF v_max IS NULL OR v_max NOT BETWEEN 1 AND 100000000 THEN
	RAISE EXCEPTION 'invalid value for parameter "obx.max_payload_size": "%"', v_setting
		USING ERRCODE = '22023',
		HINT = 'Valid units are "B", "kB", "MB" and "GB"; the value is 1 to 100000000 bytes.';
END IF;

-- snippet check_event
/* The key, the payload (none for a tombstone), aggregate id, type, headers. */
IF v_key = '' THEN
	RAISE EXCEPTION 'obx event key must not be empty' USING ERRCODE = '22023',
		HINT = 'Use the aggregate''s id, e.g. the order id, so its events keep their order.';
END IF;
IF octet_length(v_key) > 1024 THEN
	RAISE EXCEPTION 'obx event key is too long' USING ERRCODE = '54000',
		DETAIL = format('Keys have at most 1024 bytes; this one has %s.', octet_length(v_key));
END IF;
v_payload_len := 0;
IF v_payload IS NOT NULL THEN
	IF jsonb_typeof(v_payload) <> 'object' THEN
		RAISE EXCEPTION 'obx event payload must be a JSON object' USING ERRCODE = '22023',
			HINT = 'Wrap the data in an object with explicit fields, e.g. {"eventType": ..., "orderId": ...}.';
	END IF;
	v_payload_len := octet_length(v_payload::text);
	IF v_payload_len > v_max THEN
		RAISE EXCEPTION 'obx event payload is too large' USING ERRCODE = '54000',
			DETAIL = format('The payload has %s bytes of JSON; obx.max_payload_size is %s.',
							v_payload_len, v_max);
	END IF;
END IF;
IF v_aggregate_id = '' THEN
	RAISE EXCEPTION 'obx aggregate id must not be empty' USING ERRCODE = '22023',
		HINT = 'Pass NULL to use the event key.';
END IF;
IF v_event_type = '' THEN
	RAISE EXCEPTION 'obx event type must not be empty' USING ERRCODE = '22023',
		HINT = 'Pass NULL when the event has no type.';
END IF;
IF v_headers IS NOT NULL THEN
	IF jsonb_typeof(v_headers) <> 'object' THEN
		RAISE EXCEPTION 'obx event headers must be a JSON object of strings' USING ERRCODE = '22023';
	END IF;
	FOR v_entry, v_value IN SELECT h.key, h.value FROM jsonb_each(v_headers) h LOOP
		IF v_entry = '' THEN
			RAISE EXCEPTION 'obx event header names must not be empty' USING ERRCODE = '22023';
		END IF;
		IF v_entry IN ('event_id', 'event_type') THEN
			RAISE EXCEPTION 'obx event header "%" is reserved', v_entry USING ERRCODE = '22023',
				DETAIL = 'obx sets event_id and event_type itself; pass the type as event_type.';
		END IF;
		IF jsonb_typeof(v_value) <> 'string' THEN
			RAISE EXCEPTION 'obx event header "%" must be a string', v_entry USING ERRCODE = '22023';
		END IF;
	END LOOP;
	IF v_payload_len + octet_length(v_headers::text) > v_max THEN
		RAISE EXCEPTION 'obx event headers are too large' USING ERRCODE = '54000',
			DETAIL = format('The headers have %s bytes of JSON and the payload %s; together they may have at most obx.max_payload_size = %s.',
							octet_length(v_headers::text), v_payload_len, v_max);
	END IF;
END IF;
-- @trace_headers

-- snippet trace_headers
/*
 * The W3C trace context: the headers' own traceparent and tracestate, or
 * else obx.traceparent and obx.tracestate, validated (src/api/trace.c).
 */
v_parent := v_headers ->> 'traceparent';
v_state := v_headers ->> 'tracestate';
IF jsonb_typeof(v_headers -> 'traceparent') IS DISTINCT FROM 'string' THEN
	v_parent := NULL;
END IF;
IF jsonb_typeof(v_headers -> 'tracestate') IS DISTINCT FROM 'string' THEN
	v_state := NULL;
END IF;
v_source := 'the event headers';
IF v_parent IS NULL AND v_state IS NULL THEN
	v_parent := nullif(current_setting('obx.traceparent', true), '');
	v_state := nullif(current_setting('obx.tracestate', true), '');
	v_source := NULL;
END IF;
IF v_parent IS NOT NULL THEN
	v_why := CASE
		WHEN length(v_parent) < 55
			THEN format('It has %s characters; version 00 has 55.', length(v_parent))
		WHEN v_parent COLLATE "C" !~ '^[0-9a-f]{2}-'
			THEN 'The version is not two lower-case hex digits followed by "-".'
		WHEN left(v_parent, 2) = 'ff' THEN 'Version ff is invalid.'
		WHEN left(v_parent, 2) = '00' AND length(v_parent) <> 55
			THEN format('It has %s characters; version 00 has 55.', length(v_parent))
		WHEN length(v_parent) > 55 AND substr(v_parent, 56, 1) <> '-'
			THEN 'Fields after the flags must follow a "-".'
		WHEN substr(v_parent, 4, 33) COLLATE "C" !~ '^[0-9a-f]{32}-$'
			THEN 'The trace id is not 32 lower-case hex digits followed by "-".'
		WHEN substr(v_parent, 4, 32) = repeat('0', 32) THEN 'The trace id is all zeros.'
		WHEN substr(v_parent, 37, 17) COLLATE "C" !~ '^[0-9a-f]{16}-$'
			THEN 'The parent id is not 16 lower-case hex digits followed by "-".'
		WHEN substr(v_parent, 37, 16) = repeat('0', 16) THEN 'The parent id is all zeros.'
		WHEN substr(v_parent, 54, 2) COLLATE "C" !~ '^[0-9a-f]{2}$'
			THEN 'The flags are not two lower-case hex digits.'
		END;
	IF v_why IS NOT NULL THEN
		RAISE EXCEPTION 'invalid traceparent "%" in %', v_parent,
			coalesce(v_source, 'obx.traceparent') USING ERRCODE = '22023', DETAIL = v_why,
			HINT = 'A W3C traceparent looks like 00-<32 hex digits trace id>-<16 hex digits parent id>-<2 hex digits flags>, in lower case.';
	END IF;
END IF;
IF v_state IS NOT NULL THEN
	IF v_parent IS NULL THEN
		RAISE EXCEPTION 'tracestate without traceparent in %', coalesce(v_source, 'obx.tracestate')
			USING ERRCODE = '22023', DETAIL = 'A tracestate belongs to the traceparent it came with.';
	END IF;
	IF length(v_state) > 512 THEN
		RAISE EXCEPTION 'invalid tracestate in %', coalesce(v_source, 'obx.tracestate')
			USING ERRCODE = '22023',
			DETAIL = format('It has %s characters; at most 512 are allowed.', length(v_state));
	END IF;
	IF v_state COLLATE "C" !~ '^[ -~]*$' THEN
		RAISE EXCEPTION 'invalid tracestate in %', coalesce(v_source, 'obx.tracestate')
			USING ERRCODE = '22023', DETAIL = 'It may contain only printable ASCII characters.';
	END IF;
END IF;
IF v_source IS NULL AND v_parent IS NOT NULL THEN
	v_headers := coalesce(v_headers, '{}') ||
				 jsonb_strip_nulls(jsonb_build_object('traceparent', v_parent, 'tracestate', v_state));
END IF;

-- snippet new_id
/* A time-ordered UUID (version 7), as src/api/enqueue.c makes it. */
v_bytes := overlay(uuid_send(gen_random_uuid())
				   PLACING substr(int8send((extract(epoch FROM clock_timestamp()) * 1000)::bigint), 3)
				   FROM 1 FOR 6);
v_bytes := set_byte(v_bytes, 6, (get_byte(v_bytes, 6) & 15) | 112);

-- snippet lock_id
/*
 * A given id is locked until the transaction ends, under the advisory
 * lock key ("obx" in ASCII + 1, hashtext of the id), before it is looked
 * up: a call that gives an id another open transaction has enqueued waits
 * for that transaction.  src/api/event_id.c holds its lock only from the
 * look-up to the insert; SQL cannot release a transaction's lock early.
 * First the key ("obx" + 2, 0) in SHARE mode: an obx.enqueue_many of more
 * ids than it locks one by one takes that key alone, exclusively.
 */
PERFORM pg_advisory_xact_lock_shared(7299706, 0);
PERFORM pg_advisory_xact_lock(7299705, hashtext(v_id::text));

-- snippet check_existing
/*
 * An id given twice: a no-op when the event is the same, an error when
 * it differs, was skipped, or is not visible to this transaction.  A held
 * event (obx.event_states) outlives its generation's partition.
 */
SELECT s.skipped_at IS NOT NULL AS skipped, s.topic, s.event_key,
	   coalesce(s.payload::text, '') AS payload, coalesce(s.event_type, '') AS event_type,
	   coalesce(s.headers::text, '') AS headers, s.aggregate_id
  INTO v_old
  FROM obx.event_states s WHERE s.id = v_id;
IF NOT FOUND THEN
	SELECT false AS skipped, e.topic, e.event_key, coalesce(e.payload::text, '') AS payload,
		   coalesce(e.event_type, '') AS event_type, coalesce(e.headers::text, '') AS headers,
		   e.aggregate_id
	  INTO v_old
	  FROM obx.events e WHERE e.id = v_id;
END IF;
IF NOT FOUND THEN
	RAISE EXCEPTION 'obx event id % is already in use', v_id USING ERRCODE = '23505',
		DETAIL = 'The event with this id is not visible to this transaction''s snapshot.';
END IF;
IF v_old.skipped THEN
	RAISE EXCEPTION 'obx event id % was skipped', v_id USING ERRCODE = '23505',
		DETAIL = 'obx.skip gave up on the event with this id; it is in obx.skipped_events, and the id stays in use for as long as the outbox retains the event.',
		HINT = 'Give a new event its own id, or omit the id to have one generated.';
END IF;
IF ROW(v_old.topic, v_old.event_key, v_old.payload, v_old.event_type, v_old.headers,
	   v_old.aggregate_id)
   IS DISTINCT FROM ROW(v_topic, v_key, coalesce(v_payload::text, ''),
						coalesce(v_event_type, ''), coalesce(v_headers::text, ''),
						coalesce(v_aggregate_id, v_key)) THEN
	RAISE EXCEPTION 'obx event id % already exists with different content', v_id
		USING ERRCODE = '23505',
		DETAIL = 'Enqueueing an existing event id is a no-op only when topic, key, payload, aggregate id, event type and headers are the same.',
		HINT = 'Give a new event its own id, or omit the id to have one generated.';
END IF;

-- snippet check_settled
/*
 * At REPEATABLE READ and SERIALIZABLE the look-up saw this transaction's
 * snapshot only, and missed an id that another transaction inserted into
 * an older generation's partition and committed after the snapshot was
 * taken (the partition this one went to has its own unique index).  That
 * can happen only while an older generation is not yet done (all its
 * events published, no transaction still inserting into it: obx._rotate),
 * or its being done is not visible to the snapshot: then fail, as a
 * unique index fails such a transaction.
 */
IF current_setting('transaction_isolation') <> 'read committed'
   AND (NOT EXISTS (SELECT 1 FROM obx.generations g WHERE g.generation = v_seq >> 40)
		OR EXISTS (SELECT 1 FROM obx.generations g
					WHERE g.generation < v_seq >> 40 AND g.done_at IS NULL)) THEN
	RAISE EXCEPTION 'could not serialize access due to concurrent update' USING ERRCODE = '40001',
		DETAIL = 'An older generation of the outbox may hold an event with a given id that this transaction''s snapshot cannot see.',
		HINT = 'Retry the transaction.';
END IF;

-- snippet enqueue_one
/*
 * obx.enqueue and obx.enqueue_tombstone.  The common case first, in one
 * condition that holds only when every check below would pass (no id or
 * headers given, no trace context, obx.topics "*" or a plain list, and
 * obx.max_payload_size in bytes): then the event goes in at once.  Each
 * PL/pgSQL expression costs its set-up again in every transaction, and an
 * application enqueues one event per transaction.  Anything else, errors
 * included, takes the checks after it.
 */
v_setting := current_setting('obx.max_payload_size', true);
v_max := CASE WHEN v_setting IS NULL OR v_setting = '' THEN 900000
			  WHEN v_setting ~ '^[0-9]{1,9}B?$' THEN rtrim(v_setting, 'B')::bigint END;
v_setting := coalesce(current_setting('obx.topics', true), '*');
IF event_id IS NULL AND headers IS NULL AND event_key <> '' AND octet_length(event_key) <= 1024
   AND octet_length(topic) <= 249 AND topic COLLATE "C" ~ '^[a-zA-Z0-9._-]+$'
   AND topic NOT IN ('.', '..')
   AND (v_setting = '*'
		OR (v_setting ~ '^[ \t]*[A-Za-z0-9._-]+\*?[ \t]*(,[ \t]*[A-Za-z0-9._-]+\*?[ \t]*)*$'
			AND topic LIKE ANY (string_to_array(replace(replace(translate(v_setting, E' \t', ''),
																 '_', '\_'), '*', '%'), ','))))
   AND (aggregate_id IS NULL OR aggregate_id <> '') AND (event_type IS NULL OR event_type <> '')
   AND v_max BETWEEN 1 AND 100000000
   AND (CASE WHEN v_payload IS NULL THEN v_tombstone IS TRUE
			 ELSE jsonb_typeof(v_payload) = 'object' AND octet_length(v_payload::text) <= v_max END)
   AND coalesce(current_setting('obx.traceparent', true), '') = ''
   AND coalesce(current_setting('obx.tracestate', true), '') = '' THEN
	-- @new_id
	v_id := encode(v_bytes, 'hex')::uuid;
	INSERT INTO obx.events (id, aggregate_id, topic, event_key, event_type, headers, payload)
	VALUES (v_id, coalesce(aggregate_id, event_key), topic, event_key, event_type, NULL, v_payload);
	RETURN v_id;
END IF;

v_topic := topic;
v_key := event_key;
v_aggregate_id := aggregate_id;
v_event_type := event_type;
v_headers := headers;
v_id := event_id;
IF v_topic IS NULL THEN
	RAISE EXCEPTION 'obx event topic must not be null' USING ERRCODE = '22004';
END IF;
IF v_key IS NULL THEN
	RAISE EXCEPTION 'obx event key must not be null' USING ERRCODE = '22004';
END IF;
IF v_payload IS NULL AND v_tombstone IS NOT TRUE THEN
	RAISE EXCEPTION 'obx event payload must not be null' USING ERRCODE = '22004',
		HINT = 'To delete the key from a compacted topic, use obx.enqueue_tombstone.';
END IF;
-- @check_topic
-- @check_event
IF v_id IS NULL THEN
	-- @new_id
	v_id := encode(v_bytes, 'hex')::uuid;
	INSERT INTO obx.events (id, aggregate_id, topic, event_key, event_type, headers, payload)
	VALUES (v_id, coalesce(v_aggregate_id, v_key), v_topic, v_key, v_event_type, v_headers, v_payload);
	RETURN v_id;
END IF;
/* A given id may be in use in any generation's partition, or held. */
-- @lock_id
INSERT INTO obx.events (id, aggregate_id, topic, event_key, event_type, headers, payload)
SELECT v_id, coalesce(v_aggregate_id, v_key), v_topic, v_key, v_event_type, v_headers, v_payload
 WHERE NOT EXISTS (SELECT 1 FROM obx.events e WHERE e.id = v_id)
   AND NOT EXISTS (SELECT 1 FROM obx.event_states s WHERE s.id = v_id)
ON CONFLICT DO NOTHING
RETURNING seq INTO v_seq;
IF NOT FOUND THEN
	-- @check_existing
	RETURN v_id;
END IF;
-- @check_settled
RETURN v_id;

-- snippet enqueue_vars
v_topic text;
v_key text;
v_aggregate_id text;
v_event_type text;
v_headers jsonb;
v_id uuid;
v_payload jsonb;
v_tombstone boolean;
v_setting text;
v_entry text;
v_value jsonb;
v_allowed boolean;
v_max bigint;
v_payload_len bigint;
v_parent text;
v_state text;
v_source text;
v_why text;
v_bytes bytea;
v_old record;
v_seq bigint;

-- replaces obx.enqueue
CREATE FUNCTION obx.enqueue(
	topic text,
	event_key text,
	payload jsonb,
	aggregate_id text DEFAULT NULL,
	event_type text DEFAULT NULL,
	headers jsonb DEFAULT NULL,
	event_id uuid DEFAULT NULL)
RETURNS uuid
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	-- @enqueue_vars
BEGIN
	v_payload := payload;
	-- @enqueue_one
END
$$;

-- replaces obx.enqueue_tombstone
CREATE FUNCTION obx.enqueue_tombstone(
	topic text,
	event_key text,
	aggregate_id text DEFAULT NULL,
	event_type text DEFAULT NULL,
	headers jsonb DEFAULT NULL,
	event_id uuid DEFAULT NULL)
RETURNS uuid
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	-- @enqueue_vars
BEGIN
	v_tombstone := true;
	-- @enqueue_one
END
$$;

-- replaces obx.enqueue_many
CREATE FUNCTION obx.enqueue_many(
	topic text,
	event_keys text[],
	payloads jsonb[],
	aggregate_ids text[] DEFAULT NULL,
	event_types text[] DEFAULT NULL,
	headers jsonb[] DEFAULT NULL,
	event_ids uuid[] DEFAULT NULL)
RETURNS uuid[]
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	v_topic text := topic;
	v_key text;
	v_payload jsonb;
	v_aggregate_id text;
	v_event_type text;
	v_headers jsonb;
	v_id uuid;
	v_setting text;
	v_entry text;
	v_value jsonb;
	v_allowed boolean;
	v_max bigint;
	v_payload_len bigint;
	v_parent text;
	v_state text;
	v_source text;
	v_why text;
	v_bytes bytea;
	v_old record;
	v_seq bigint;
	v_n integer;
	v_len integer;
	v_name text;
	v_arrays text[] := ARRAY['event_keys', 'payloads', 'aggregate_ids', 'event_types',
							 'headers', 'event_ids'];
	v_lengths integer[];
	v_dims integer[];
	v_ids uuid[] := '{}';
	v_all_headers jsonb[] := '{}';
	v_inserted uuid[];
BEGIN
	IF v_topic IS NULL THEN
		RAISE EXCEPTION 'obx event topic must not be null' USING ERRCODE = '22004';
	END IF;
	IF event_keys IS NULL OR payloads IS NULL THEN
		RAISE EXCEPTION 'obx.enqueue_many''s % must not be null',
			CASE WHEN event_keys IS NULL THEN 'event_keys' ELSE 'payloads' END
			USING ERRCODE = '22004';
	END IF;
	v_dims := ARRAY[array_ndims(event_keys), array_ndims(payloads), array_ndims(aggregate_ids),
					array_ndims(event_types), array_ndims(headers), array_ndims(event_ids)];
	v_lengths := ARRAY[cardinality(event_keys), cardinality(payloads), cardinality(aggregate_ids),
					   cardinality(event_types), cardinality(headers), cardinality(event_ids)];
	FOR i IN 1..6 LOOP
		CONTINUE WHEN v_lengths[i] IS NULL;
		IF v_dims[i] > 1 THEN
			RAISE EXCEPTION 'obx.enqueue_many''s % must be a one-dimensional array', v_arrays[i]
				USING ERRCODE = '2202E';
		END IF;
		IF v_lengths[i] <> v_lengths[1] THEN
			RAISE EXCEPTION 'obx.enqueue_many''s arrays must have the same length'
				USING ERRCODE = '2202E',
				DETAIL = format('event_keys has %s elements and %s %s.', v_lengths[1],
								v_arrays[i], v_lengths[i]);
		END IF;
	END LOOP;
	-- @check_topic
	v_n := v_lengths[1];
	IF v_n = 0 THEN
		RETURN '{}';
	END IF;

	FOR i IN 1..v_n LOOP
		v_key := event_keys[i];
		v_payload := payloads[i];
		v_aggregate_id := aggregate_ids[i];
		v_event_type := event_types[i];
		v_headers := headers[i];
		IF v_key IS NULL THEN
			RAISE EXCEPTION 'obx event key must not be null' USING ERRCODE = '22004';
		END IF;
		IF v_payload IS NULL THEN
			RAISE EXCEPTION 'obx event payload must not be null' USING ERRCODE = '22004';
		END IF;
		-- @check_event
		IF event_ids[i] IS NULL THEN
			-- @new_id
			v_ids := v_ids || encode(v_bytes, 'hex')::uuid;
		ELSE
			v_ids := v_ids || event_ids[i];
		END IF;
		v_all_headers := v_all_headers || v_headers;
	END LOOP;

	IF event_ids IS NULL THEN
		INSERT INTO obx.events (id, aggregate_id, topic, event_key, event_type, headers, payload)
		SELECT e.id, coalesce(e.aggregate_id, e.event_key), v_topic, e.event_key, e.event_type,
			   e.headers, e.payload
		  FROM ROWS FROM (unnest(v_ids), unnest(event_keys), unnest(payloads),
						  unnest(aggregate_ids), unnest(event_types), unnest(v_all_headers))
			   WITH ORDINALITY AS e(id, event_key, payload, aggregate_id, event_type, headers, n)
		 ORDER BY e.n;
		RETURN v_ids;
	END IF;
	/*
	 * The given ids locked as obx.enqueue locks one (lock_id), in one
	 * order, so that two calls cannot deadlock; more than 64 of them by
	 * one key that excludes every other call with given ids, so that a
	 * large array does not fill the lock table.
	 */
	IF (SELECT count(*) FROM unnest(event_ids) AS x WHERE x IS NOT NULL) > 64 THEN
		PERFORM pg_advisory_xact_lock(7299706, 0);
	ELSE
		PERFORM pg_advisory_xact_lock_shared(7299706, 0);
		PERFORM pg_advisory_xact_lock(7299705, h.h)
		   FROM (SELECT DISTINCT hashtext(x::text) AS h FROM unnest(event_ids) AS x
				  WHERE x IS NOT NULL ORDER BY 1) AS h;
	END IF;
	WITH ins AS (
		INSERT INTO obx.events (id, aggregate_id, topic, event_key, event_type, headers, payload)
		SELECT e.id, coalesce(e.aggregate_id, e.event_key), v_topic, e.event_key, e.event_type,
			   e.headers, e.payload
		  FROM ROWS FROM (unnest(v_ids), unnest(event_keys), unnest(payloads),
						  unnest(aggregate_ids), unnest(event_types), unnest(v_all_headers))
			   WITH ORDINALITY AS e(id, event_key, payload, aggregate_id, event_type, headers, n)
		 WHERE NOT EXISTS (SELECT 1 FROM obx.events x WHERE x.id = e.id)
		   AND NOT EXISTS (SELECT 1 FROM obx.event_states s WHERE s.id = e.id)
		 ORDER BY e.n
		ON CONFLICT DO NOTHING
		RETURNING id, seq)
	SELECT coalesce(array_agg(ins.id), '{}'), max(ins.seq) INTO v_inserted, v_seq FROM ins;
	IF v_seq IS NOT NULL THEN
		-- @check_settled
	END IF;
	IF cardinality(v_inserted) < v_n THEN
		/* Ids in use already, or given twice: each must be the same event. */
		FOR i IN 1..v_n LOOP
			v_id := v_ids[i];
			CONTINUE WHEN v_id = ANY (v_inserted)
					 AND (SELECT count(*) FROM unnest(v_ids) x WHERE x = v_id) = 1;
			v_key := event_keys[i];
			v_payload := payloads[i];
			v_aggregate_id := aggregate_ids[i];
			v_event_type := event_types[i];
			v_headers := v_all_headers[i];
			-- @check_existing
		END LOOP;
	END IF;
	RETURN v_ids;
END
$$;

-- replaces obx._wake_at_commit
/* No worker to wake in the database: the relay outside it polls. */
CREATE FUNCTION obx._wake_at_commit()
RETURNS void
LANGUAGE sql VOLATILE PARALLEL UNSAFE
AS $$ SELECT $$;

-- replaces obx.worker_status
/* No relay worker runs in the database. */
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
LANGUAGE sql VOLATILE
AS $$ SELECT NULL::integer, NULL, NULL::integer, NULL, NULL::bigint, NULL::bigint,
			 NULL::bigint, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
			 NULL, NULL::float8 WHERE false $$;

-- replaces obx._relay_problem
/*
 * No relay runs in the database: obx-relay publishes from outside, and is
 * seen by its claims.  None serves the database when no claim came for a
 * minute while an event that the latest claim's snapshot could not see
 * (committed after it; any event, with no claim at all) has waited over a
 * minute.  The latest claim is one index probe, the events past its
 * snapshot a range of the xid index: what is pending, not the history.
 */
CREATE FUNCTION obx._relay_problem()
RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	c record;	/* obx.claims comes after this function, with 1.1 */
BEGIN
	SELECT l.claimed_at, l.snap, l.era INTO c FROM obx.claims l ORDER BY l.lease_id DESC LIMIT 1;
	IF c.claimed_at > now() - interval '1 minute' THEN
		RETURN NULL;
	END IF;
	IF EXISTS (SELECT 1 FROM obx.events e
				WHERE e.era = obx._era()
				  AND (c.snap IS NULL OR c.era <> obx._era()
					   OR e.xid >= pg_snapshot_xmax(c.snap)::text::bigint)
				  AND e.occurred_at < now() - interval '1 minute') THEN
		RETURN 'no obx-relay claims in this database: '
			   || CASE WHEN c.claimed_at IS NULL THEN 'none ever has'
					   ELSE 'the latest claim was at ' || c.claimed_at END
			   || ', and events have waited over a minute since';
	END IF;
	RETURN NULL;
END
$$;

-- replaces obx._warn_unserved
CREATE FUNCTION obx._warn_unserved()
RETURNS void
LANGUAGE sql VOLATILE
AS $$ SELECT $$;

-- replaces obx.publish_latency_buckets
/* Counted in the relay's shared memory, which this install has none of. */
CREATE FUNCTION obx.publish_latency_buckets(
	OUT topic text,
	OUT le float8,
	OUT count bigint,
	OUT sum float8)
RETURNS SETOF record
LANGUAGE sql VOLATILE
AS $$ SELECT NULL::text, NULL::float8, NULL::bigint, NULL::float8 WHERE false $$;

-- replaces obx.subscription_kafka_properties
CREATE FUNCTION obx.subscription_kafka_properties()
RETURNS SETOF text
LANGUAGE sql IMMUTABLE STRICT
AS $$ SELECT unnest(ARRAY[/* @subscription_properties */]::text[]) $$;

-- replaces obx._kafka_value_problem
/*
 * The sizes a subscription may only lower (src/base/kafka_conf.c), the
 * number read as librdkafka reads it (strtoll in any base: a leading 0x is
 * hex, a leading 0 octal); the rest of the value is librdkafka's to check,
 * where the relay runs.
 */
CREATE FUNCTION obx._kafka_value_problem(name text, value text)
RETURNS text[]
LANGUAGE plpgsql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	v_limit text[];
	v_digits text[];
	v_base integer;
	v_number numeric := 0;
BEGIN
	FOREACH v_limit SLICE 1 IN ARRAY ARRAY[/* @subscription_maxima */]::text[][] LOOP
		CONTINUE WHEN v_limit[1] <> name;
		v_digits := regexp_match(value, '^[ \t\n\r\f\v]*([+-]?)(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)');
		EXIT WHEN v_digits IS NULL;
		v_base := CASE WHEN v_digits[2] ~* '^0x' THEN 16 WHEN v_digits[2] ~ '^0' THEN 8 ELSE 10 END;
		FOR i IN CASE v_base WHEN 16 THEN 3 ELSE 1 END .. length(v_digits[2]) LOOP
			v_number := v_number * v_base
						+ strpos('0123456789abcdef', lower(substr(v_digits[2], i, 1))) - 1;
		END LOOP;
		IF (v_digits[1] <> '-' AND v_number > v_limit[2]::numeric)
		   OR v_number > 9223372036854775807 THEN
			RETURN ARRAY[format('Kafka property "%s" of an obx subscription may be at most %s, not %s',
								name, v_limit[2], value),
						 'A subscription may lower the fetch and queue sizes below librdkafka''s defaults, not raise them; '
						 'a superuser raises them for every consumer in obx.kafka_properties.'];
		END IF;
	END LOOP;
	RETURN NULL;
END
$$;

-- replaces obx.subscribe
/*
 * The SQL-only wrappers cannot run as their caller and pass it on (a
 * SECURITY DEFINER function sees its owner), so they name the session's
 * role: SET ROLE's, else the session user.  See docs/operations.md,
 * "Managed PostgreSQL".
 */
CREATE FUNCTION obx.subscribe(consumer_name text, topics text[],
							  handler regprocedure, options jsonb DEFAULT '{}')
RETURNS void
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT obx._subscribe(/* @caller */, consumer_name, topics, handler, options) $$;

-- replaces obx.unsubscribe
CREATE FUNCTION obx.unsubscribe(consumer_name text)
RETURNS boolean
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT obx._unsubscribe(/* @caller */, consumer_name) $$;

-- replaces obx.mark_processed
CREATE FUNCTION obx.mark_processed(consumer_name text, event_id text)
RETURNS boolean
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT obx._mark_processed(/* @caller */, consumer_name, event_id) $$;

-- replaces obx.claim_landed
CREATE FUNCTION obx.claim_landed(consumer_name text)
RETURNS obx.landed
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT obx._claim_landed(/* @caller */, consumer_name) $$;

-- replaces obx.start_landed
CREATE FUNCTION obx.start_landed(consumer_name text, landed_id bigint)
RETURNS integer
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT obx._start_landed(/* @caller */, consumer_name, landed_id) $$;

-- replaces obx.complete_landed
CREATE FUNCTION obx.complete_landed(consumer_name text, landed_id bigint)
RETURNS boolean
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT obx._complete_landed(/* @caller */, consumer_name, landed_id) $$;

-- replaces obx.fail_landed
CREATE FUNCTION obx.fail_landed(consumer_name text, landed_id bigint, error text,
								max_attempts integer, retry_after interval)
RETURNS text
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$ SELECT obx._fail_landed(/* @caller */, consumer_name, landed_id, error,
							  max_attempts, retry_after) $$;

-- replaces obx.land
/* The SQL-only install runs no consumer, so no handler: never inside one. */
CREATE FUNCTION obx.land(e obx.inbound_event)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	RAISE EXCEPTION 'obx.land can only run as the handler of an obx subscription'
		USING ERRCODE = '55000',
		HINT = 'Subscribe with it: SELECT obx.subscribe(''name'', ARRAY[''topic''], ''obx.land(obx.inbound_event)'').';
END
$$;

-- snippet caller
coalesce((SELECT r.oid FROM pg_roles r
		   WHERE r.rolname = current_setting('role') AND current_setting('role') <> 'none'),
		 (SELECT r.oid FROM pg_roles r WHERE r.rolname = session_user))

-- replaces obx._replay_handler
CREATE FUNCTION obx._replay_handler(dead_letter_id bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE STRICT PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	RAISE EXCEPTION 'obx cannot run a handler in the SQL-only install'
		USING ERRCODE = '0A000',
		DETAIL = 'A handler runs as its subscription''s owner, which only obx''s library can arrange.',
		HINT = 'Replay it from a database where obx''s library is loaded.';
END
$$;
