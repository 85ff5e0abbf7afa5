/*-------------------------------------------------------------------------
 *
 * protocol.h
 *	  The relay's protocol with the database: every statement of the claim,
 *	  the record, the release and the renewal, and the check that the
 *	  database is no logical replica of obx's tables, defined once and run
 *	  by both runtimes, the in-database relay (src/relay/claim.c, outbox.c,
 *	  through SPI) and obx-relay (src/daemon/, through libpq); the consumers
 *	  of both read that check too (src/base/worker.c, src/daemon/consume.c).
 *	  Plain C, no PostgreSQL header: the daemon includes it too.
 *
 * The claim lock serializes claims, and the steps that must agree with
 * them on whether a lease is live: pg_advisory_xact_lock in a step, or
 * pg_advisory_lock around a step's transaction in obx-relay (whose claim
 * takes its snapshot after the lock).  Either kind excludes the other.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OBX_PROTOCOL_H
#define OBX_PROTOCOL_H

/*
 * The claim lock's advisory lock key: ("obx" in ASCII, 1).  obx._rotate
 * (obx--1.1--1.2.sql) takes it too, as 7299704.
 */
#define OBX_CLAIM_LOCK_CLASS  0x6f6278
#define OBX_CLAIM_LOCK_OBJECT 1

/*
 * The rule for a file that holds secrets (obx.kafka_properties_file,
 * obx-relay's settings file with a password), as PostgreSQL's for its key
 * files: owned by the user the process runs as (euid) and u=rw (0600) or
 * less, or owned by root and u=rw,g=r (0640) or less.  Needs <sys/stat.h>.
 */
#define OBX_SECRET_FILE_OK(uid, mode, euid)                      \
	(((uid) == (euid) && ((mode) & (S_IRWXG | S_IRWXO)) == 0) || \
	 ((uid) == 0 && ((mode) & (S_IWGRP | S_IXGRP | S_IRWXO)) == 0))

/*
 * A lease's owner (obx.claims.owner): the in-database relay workers are
 * numbered from 0 to OBX_MAX_WORKERS - 1 (src/base/obx.h; obx.c asserts
 * that they stay below this), and each releases the live leases of its
 * number when it starts, since they are a dead predecessor's.  obx-relay's
 * relay_id starts here, so that no worker ever releases a daemon's leases.
 */
#define OBX_FIRST_DAEMON_OWNER 32

/*
 * What a claim reads first, once it holds the claim lock (obx_claim_lock):
 * the tick it starts from (the latest claim's floor, snapshot and id), and
 * its own lease id, drawn under the lock.  The tick's id is the latest
 * claim's whatever its era; a lease id that is not above it means
 * obx.lease_seq is behind the claims, which happens only where they were
 * copied in (logical replication): the claim stops there, with
 * OBX_LEASE_SEQ_BEHIND.
 */
#define OBX_SQL_TICK \
	"SELECT t.floor, t.snap, t.tick, pg_catalog.nextval('obx.lease_seq') FROM obx._tick() t"
#define OBX_LEASE_SEQ_BEHIND                                                                             \
	"obx.lease_seq is behind the claims copied into this database: a claim drew lease %lld, the latest " \
	"claim is %lld"
#define OBX_LEASE_SEQ_BEHIND_HINT                                                                       \
	"Before a subscriber of obx's tables publishes, setval its obx.event_seq and obx.lease_seq to the " \
	"publisher's last_value (docs/operations.md, Logical replication)."

/*
 * The keys obx.event_states holds back, for both claims: those of the
 * events backing off or, when $1 (obx.quarantine_blocks_key), quarantined.
 * Ends inside the CTE blocked.
 */
#define OBX_SQL_CLAIM_STATES_BLOCK                             \
	"  SELECT s.topic, s.event_key"                            \
	"    FROM obx.event_states s"                              \
	"   WHERE s.published_at IS NULL AND s.skipped_at IS NULL" \
	"     AND (s.next_attempt_at > pg_catalog.now()"           \
	"          OR (s.quarantined_at IS NOT NULL AND $1))"

/*
 * The keys the full claim holds back: those of the live leases as of the
 * tick ($3, $5), then obx.event_states's.
 */
#define OBX_SQL_CLAIM_BLOCKED                                                     \
	"WITH blocked AS MATERIALIZED ("                                              \
	"  SELECT k.topic, k.event_key"                                               \
	"    FROM obx._live_leases($3, $5) l,"                                        \
	"         ROWS FROM (pg_catalog.unnest(l.topics), pg_catalog.unnest(l.keys))" \
	"           AS k(topic, event_key)"                                           \
	"  UNION ALL" OBX_SQL_CLAIM_STATES_BLOCK

/* The columns of a claimed row, read from the union c of the parts. */
#define OBX_SQL_CLAIM_COLUMNS                                                       \
	"(SELECT c.seq, c.id, c.topic, c.event_key, c.payload,"                         \
	"        c.event_type, c.attempts,"                                             \
	"        CASE WHEN c.headers IS NOT NULL THEN"                                  \
	"          (SELECT pg_catalog.array_agg(ARRAY[h.key, h.value])"                 \
	"             FROM pg_catalog.jsonb_each_text(c.headers) AS h) END AS headers," \
	"        c.xid, c.occurred_at, NULL::pg_catalog.int8 AS floor,"                 \
	"        NULL::pg_catalog.pg_snapshot AS snap, c.held"                          \
	"   FROM"

/*
 * The last part, the events of obx.event_states that are due (retries,
 * replays) and not held back, then the batch's limit and the start of
 * the tick row, whose floor, snapshot and completeness each claim adds.
 */
#define OBX_SQL_CLAIM_DUE                                                                  \
	"        (SELECT s.seq, s.id, s.topic, s.event_key, s.payload, s.event_type,"          \
	"                s.attempts, s.headers, NULL::pg_catalog.int8, s.occurred_at, true"    \
	"           FROM obx.event_states s"                                                   \
	"          WHERE s.published_at IS NULL AND s.skipped_at IS NULL"                      \
	"            AND s.quarantined_at IS NULL"                                             \
	"            AND s.next_attempt_at <= pg_catalog.now()"                                \
	"            AND (s.topic, s.event_key) NOT IN (SELECT topic, event_key FROM blocked)" \
	"          ORDER BY s.seq LIMIT $2)) c"                                                \
	"  ORDER BY c.seq LIMIT $2)"                                                           \
	" UNION ALL"                                                                           \
	" SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,"

/*
 * The claim, one statement under one snapshot ($1: obx.quarantine_blocks_key,
 * $2: obx.batch_size, $3-$5: the tick it starts from, $6: a floor past
 * every seq).  Its rows are the claimable events in seq order, each with
 * its payload as stored and its inserting transaction (NULL for an event
 * claimed from obx.event_states: it failed, or was published, before; and
 * for one of another era, copied in: its commit here was durable before a
 * relay could claim it), and whether it was claimed from obx.event_states
 * (held).  A last row, with a NULL seq and no event,
 * carries the new tick: the lowest unpublished seq (the events claimed now
 * included: they are not published yet, and so are the events of the keys
 * held back) and the snapshot itself; nothing claimable gives that row
 * alone.  Every part comes in seq order (NULLS LAST puts the tick's row
 * at the end), so that the planner merges the parts: it sorted them, and
 * again the join that gave every row the tick, copying a backlog's batch,
 * payloads and all, twice per claim (docs/benchmarks.md).
 * Each part is read in seq order up to the batch size, but for the late
 * committers: they are few, and found on the xid index, which an ORDER BY
 * seq ... LIMIT would trade for a walk of the seq index below the floor
 * (sorted on their own).
 * They are read once, for the claim and for the floor alike (late): a
 * second reading started every partition's scans again on every claim,
 * which is most of what a claim costs at a steady rate
 * (docs/benchmarks.md).  So is the first unpublished event at or above
 * the floor (head), where the new floor starts and the claim reads from:
 * what lies before it is published or held, and reading from the old
 * floor stepped over the batches recorded since the last claim.  From
 * head on, the batch is obx._unpublished_from(head, $5) spelled out (a
 * function whose argument is a subquery is not inlined): only records
 * whose max_seq reaches head can name an event there (a record's max_seq
 * is its batch's highest seq), so it hashes those alone, not the ids of
 * the batches recorded between the floor and head, which in a backlog
 * are a whole batch or more (docs/benchmarks.md).  u.seq >= $3 keeps the
 * generic plan on the seq index in seq order.  The keys
 * held back (blocked) may repeat: NOT IN needs no distinct rows, and
 * making them distinct cost a backlog's claims a hash of thousands of keys
 * each.
 */
#define OBX_SQL_CLAIM                                                                      \
	OBX_SQL_CLAIM_BLOCKED                                                                  \
	"), late AS MATERIALIZED ("                                                            \
	"  SELECT u.* FROM obx._unpublished_late($3, $4, $5) u"                                \
	"), head AS MATERIALIZED ("                                                            \
	"  SELECT u.seq FROM obx._unpublished_from($3, $5) u ORDER BY u.seq LIMIT 1"           \
	")" OBX_SQL_CLAIM_COLUMNS                                                              \
	"       ((SELECT u.seq, u.id, u.topic, u.event_key, u.payload, u.event_type,"          \
	"                0 AS attempts, u.headers,"                                            \
	"                CASE WHEN u.era = obx._era() THEN u.xid END AS xid, u.occurred_at,"   \
	"                false AS held"                                                        \
	"           FROM obx.events u"                                                         \
	"          WHERE u.seq >= $3 AND u.seq >= (SELECT head.seq FROM head)"                 \
	"            AND u.id NOT IN (SELECT p FROM obx._published_ids("                       \
	"                               (SELECT head.seq FROM head), $5) p)"                   \
	"            AND u.id NOT IN (SELECT s.id FROM obx.event_states s)"                    \
	"            AND (u.topic, u.event_key) NOT IN (SELECT topic, event_key FROM blocked)" \
	"          ORDER BY u.seq LIMIT $2)"                                                   \
	"        UNION ALL"                                                                    \
	"        (SELECT l.seq, l.id, l.topic, l.event_key, l.payload, l.event_type,"          \
	"                0, l.headers, l.xid, l.occurred_at, false"                            \
	"           FROM late l"                                                               \
	"          WHERE (l.topic, l.event_key) NOT IN (SELECT topic, event_key FROM blocked)" \
	"          ORDER BY l.seq)"                                                            \
	"        UNION ALL" OBX_SQL_CLAIM_DUE                                                  \
	"        coalesce(least((SELECT head.seq FROM head),"                                  \
	"                       (SELECT pg_catalog.min(l.seq) FROM late l)),"                  \
	"                 $6),"                                                                \
	"        pg_catalog.pg_current_snapshot(), NOT EXISTS (SELECT 1 FROM blocked)"         \
	" ORDER BY 1"

/*
 * The claim since a complete tick: one whose claim took every event not
 * done that its snapshot saw (nothing held back, the batch not full), taken
 * by this worker, whose batches since have all been delivered.  Every
 * event that snapshot saw is then done, and what is left is what it did
 * not see: the events of the transactions it did not see committed
 * ($4's xmax and after, and those running), which the xid index finds
 * without the walk from the floor, the records or obx._published_ids.  No
 * claim came since (the tick is the latest), so none of them is in a
 * batch, recorded or in obx.event_states (whose rows are all of claimed
 * events: failed, or quarantined and then skipped, retried or replayed).
 * Keys are held back as in OBX_SQL_CLAIM, but none for a lease: none is
 * live (docs/internals.md says why), and reading them started the scans of
 * nine partitions on every claim (docs/benchmarks.md).  Only the first
 * batch of the unseen and one more are read (a large transaction committed
 * after the tick would otherwise be copied and sorted whole, payloads and
 * all), in seq order but not on the seq index (seq + 0), which would walk
 * every event retained before reaching them.  The new floor is the first
 * of them, taken or not.  In the tick row, OBX_CLAIM_COMPLETE_COL says
 * whether none was held back; one more than a batch makes the batch full,
 * so the claim is not complete either.  Used by both relays (relay/claim.c,
 * daemon/claim.c); the same arguments as OBX_SQL_CLAIM, $3 and $5 unread.
 */
#define OBX_SQL_CLAIM_SINCE                                                                \
	"WITH blocked AS MATERIALIZED (" OBX_SQL_CLAIM_STATES_BLOCK                            \
	"), unseen AS MATERIALIZED ("                                                          \
	"  SELECT e.* FROM obx.events e"                                                       \
	"   WHERE ((e.xid >= pg_catalog.pg_snapshot_xmax($4)::text::bigint"                    \
	"           AND e.xid < pg_catalog.pg_snapshot_xmax("                                  \
	"                         pg_catalog.pg_current_snapshot())::text::bigint)"            \
	"          OR e.xid = ANY (ARRAY(SELECT x::text::bigint"                               \
	"                                  FROM pg_catalog.pg_snapshot_xip($4) x)))"           \
	"     AND e.era = obx._era()"                                                          \
	"   ORDER BY e.seq + 0 LIMIT $2 + 1"                                                   \
	")" OBX_SQL_CLAIM_COLUMNS                                                              \
	"       ((SELECT u.seq, u.id, u.topic, u.event_key, u.payload, u.event_type,"          \
	"                0 AS attempts, u.headers, u.xid, u.occurred_at, false AS held"        \
	"           FROM unseen u"                                                             \
	"          WHERE (u.topic, u.event_key) NOT IN (SELECT topic, event_key FROM blocked)" \
	"          ORDER BY u.seq)"                                                            \
	"        UNION ALL" OBX_SQL_CLAIM_DUE                                                  \
	"        coalesce((SELECT pg_catalog.min(u.seq) FROM unseen u), $6),"                  \
	"        pg_catalog.pg_current_snapshot(),"                                            \
	"        NOT EXISTS (SELECT 1 FROM unseen u"                                           \
	"                     WHERE (u.topic, u.event_key) IN"                                 \
	"                           (SELECT topic, event_key FROM blocked))"                   \
	" ORDER BY 1"

/* The columns of the claim's rows that hold the new tick (counted from 1). */
#define OBX_CLAIM_FLOOR_COL    11
#define OBX_CLAIM_SNAP_COL     12
/* In the tick row: whether the claim held back no event (see above). */
#define OBX_CLAIM_COMPLETE_COL 13
/* Whether the row's event was claimed from obx.event_states (OBX_SQL_LEASE). */
#define OBX_CLAIM_HELD_COL     13

/*
 * A claim stops taking events once their payloads reach this many bytes
 * (the event that crosses it included), whatever obx.batch_size says: a
 * relay holds up to two batches, payloads included, and librdkafka a copy
 * of them.
 */
#define OBX_BATCH_BYTES (16 * 1024 * 1024)

/*
 * The claim's row: its lease (none for a tick alone) and its tick.  Its
 * max_seq bounds the leases a later claim reads (obx._live_leases: those
 * at or above its floor), which must include every lease whose events are
 * not done.  An event taken from obx.event_states (a retry or a replay) is
 * done for the floor, which may pass it while it is in flight; a lease
 * holding one ($10: a row of the batch says so in OBX_CLAIM_HELD_COL) gets
 * max_seq past every seq, so that it holds its keys and its events until
 * it is recorded or runs out.  The claim says which rows came from
 * obx.event_states: looking the batch's ids up there cost a backlog's
 * claim an index search per event, about 5 % of the relay's CPU in a
 * drain (docs/benchmarks.md).
 */
#define OBX_SQL_LEASE                                                                          \
	"INSERT INTO obx.claims (lease_id, owner, until, snap, floor, max_seq, ids, topics, keys)" \
	" VALUES ($1, $2, pg_catalog.now() + pg_catalog.make_interval(secs => $3), $4, $5,"        \
	"         CASE WHEN $10 THEN 9223372036854775807 ELSE $6 END,"                             \
	"         $7, $8, $9)"

#define OBX_SQL_CLAIM_LOCK "SELECT pg_catalog.pg_advisory_xact_lock($1, $2)"

/*
 * The batch's record: the events delivered, where they landed and when the
 * worker received Kafka's acknowledgement.  No lease check: a delivery is
 * a fact, whoever reports it (a stale worker's late report included).  An
 * empty record releases the batch.  $6 and $7 are the claim's highest and
 * lowest seq, by which obx.outbox_events finds the records of an event.
 * $8 is each delivered event's topic: the same statement counts them per
 * topic into obx.published_counts, which obx.status reads instead of the
 * records.
 */
#define OBX_SQL_RECORD                                                                    \
	"WITH r AS (INSERT INTO obx.records"                                                  \
	"             (lease_id, max_seq, min_seq, ids, partitions, offsets, published_at)"   \
	"           VALUES ($5, $6, $7, $1, $2, $3, $4))"                                     \
	" INSERT INTO obx.published_counts (generation, topic, published, last_published_at)" \
	" SELECT $5 >> 40, d.topic, pg_catalog.count(*), pg_catalog.max(d.t)"                 \
	"   FROM ROWS FROM (pg_catalog.unnest($8::pg_catalog.text[]),"                        \
	"                   pg_catalog.unnest($4::pg_catalog.timestamptz[])) AS d(topic, t)"  \
	"  GROUP BY d.topic"

/*
 * Delivered events that have a state (failed, quarantined or replayed
 * before): published now.  For every delivered event, not only those
 * claimed from obx.event_states: a stalled worker's late report of an
 * event quarantined meanwhile publishes it for good (an acknowledgement
 * always wins).  The table holds only the few events that failed.
 */
#define OBX_SQL_HELD_PUBLISHED                                                       \
	"UPDATE obx.event_states s"                                                      \
	"   SET published_at = d.t, attempts = s.attempts + 1, quarantined_at = NULL,"   \
	"       next_attempt_at = '-infinity'"                                           \
	"  FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.uuid[]),"                    \
	"                  pg_catalog.unnest($2::pg_catalog.timestamptz[])) AS d(id, t)" \
	" WHERE s.id = d.id AND s.published_at IS NULL"

/* Whether the batch's lease is still live, under the claim lock. */
#define OBX_SQL_LIVE                                                                               \
	"SELECT 1 FROM obx.claims c"                                                                   \
	" WHERE c.lease_id = $1 AND c.ids IS NOT NULL"                                                 \
	"   AND NOT EXISTS (SELECT 1 FROM obx.records r WHERE r.lease_id = c.lease_id)"                \
	"   AND greatest(c.until,"                                                                     \
	"         (SELECT pg_catalog.max(n.until) FROM obx.renewals n WHERE n.lease_id = c.lease_id))" \
	"       >= pg_catalog.clock_timestamp()"

/* Failed events not held yet: copied into obx.event_states. */
#define OBX_SQL_HOLD "SELECT obx._hold($1)"

/*
 * A failed event backs off exponentially from obx.backoff_min to
 * obx.backoff_max.  It is quarantined when its error is permanent, or
 * unclassified and it has failed that way obx.max_attempts times (failures
 * counts only those: transient errors never quarantine, however long an
 * outage lasts).  A quarantined event has no backoff, so with
 * obx.quarantine_blocks_key off its key moves on at once.  Run only while
 * the batch's lease is still live (live_sql), so a worker whose lease
 * ran out cannot undo a newer claim.  attempts is the attempts that ended,
 * this one included after the update: the n-th failure waits
 * obx.backoff_min * 2^(n-1).  An attempt that timed out ($7: librdkafka
 * gave up after obx.delivery_timeout, as when every broker is down) has
 * waited already and is due again at once: while the brokers are away its
 * event then waits inside librdkafka, which sends it as soon as a broker
 * answers, instead of in a backoff that outlasts the outage.
 */
#define OBX_SQL_QUARANTINE_NOW \
	"(d.cls = 'permanent' OR (d.cls = 'other' AND s.failures + 1 >= $2))"
#define OBX_SQL_FAILED                                                                                 \
	"UPDATE obx.event_states s"                                                                        \
	"   SET last_error = d.msg, last_error_class = d.cls, last_error_at = pg_catalog.now(),"           \
	"       failures = s.failures + (d.cls <> 'transient')::pg_catalog.int4,"                          \
	"       attempts = s.attempts + 1,"                                                                \
	"       quarantined_at = CASE WHEN " OBX_SQL_QUARANTINE_NOW " THEN pg_catalog.now() END,"          \
	"       next_attempt_at = CASE WHEN " OBX_SQL_QUARANTINE_NOW " THEN '-infinity'"                   \
	"           WHEN d.timed_out THEN pg_catalog.now()"                                                \
	"           ELSE pg_catalog.now() + pg_catalog.make_interval(secs =>"                              \
	"               least($4::pg_catalog.float8,"                                                      \
	"                     $3::pg_catalog.float8 * pg_catalog.power(2, least(s.attempts, 40))) / 1000)" \
	"           END"                                                                                   \
	"  FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.uuid[]),"                                      \
	"                  pg_catalog.unnest($5::pg_catalog.text[]),"                                      \
	"                  pg_catalog.unnest($6::pg_catalog.text[]),"                                      \
	"                  pg_catalog.unnest($7::pg_catalog.bool[])) AS d(id, cls, msg, timed_out)"        \
	" WHERE s.id = d.id AND s.published_at IS NULL"                                                    \
	" RETURNING s.id::pg_catalog.text, s.topic, s.quarantined_at IS NOT NULL, s.next_attempt_at"

#define OBX_SQL_RENEW                            \
	"INSERT INTO obx.renewals (lease_id, until)" \
	" VALUES ($1, pg_catalog.now() + pg_catalog.make_interval(secs => $2))"

/*
 * One step of the outbox's rotation ($1: obx.retention in seconds): mark a
 * generation published, truncate one past the retention, or start a new
 * one (obx._rotate, obx--1.1--1.2.sql).
 */
#define OBX_SQL_ROTATE "SELECT obx._rotate($1)"

/*
 * The purges of the consumer side's history, both runtimes
 * (src/base/housekeeping.c, src/daemon/outbox.c): $1 a retention in
 * seconds, $2 at most how many rows (OBX_PURGE_BATCH), so that a large
 * backlog goes in many short steps.  Dedupe rows older than the retention;
 * dead letters older than it, counted from the failure or from the replay
 * for a replayed one, and how many of those were never replayed.
 */
#define OBX_PURGE_BATCH 1000

/*
 * A consumer group's partitions' low and high watermarks, for the lag
 * (obx.consumers), both runtimes (src/consumer/consumer_group.c,
 * src/daemon/consume.c), every OBX_WATERMARK_INTERVAL_MS when they moved:
 * $1 the consumer, $2 to $5 arrays of topic, partition, low and high.
 */
#define OBX_WATERMARK_INTERVAL_MS 1000
#define OBX_SQL_WATERMARKS                                                      \
	"INSERT INTO obx.consumer_partitions AS p"                                  \
	"   (consumer_name, topic, kafka_partition, low_watermark, high_watermark," \
	"    watermarks_at)"                                                        \
	" SELECT $1, w.topic, w.part, w.low, w.high, pg_catalog.now()"              \
	"   FROM ROWS FROM (pg_catalog.unnest($2::pg_catalog.text[]),"              \
	"                   pg_catalog.unnest($3::pg_catalog.int4[]),"              \
	"                   pg_catalog.unnest($4::pg_catalog.int8[]),"              \
	"                   pg_catalog.unnest($5::pg_catalog.int8[]))"              \
	"        AS w(topic, part, low, high)"                                      \
	" ON CONFLICT (consumer_name, topic, kafka_partition) DO UPDATE"            \
	"   SET low_watermark = excluded.low_watermark,"                            \
	"       high_watermark = excluded.high_watermark,"                          \
	"       watermarks_at = excluded.watermarks_at"
#define OBX_SQL_PURGE_DEDUPE                                                         \
	"DELETE FROM obx.processed_events WHERE ctid IN ("                               \
	" SELECT ctid FROM obx.processed_events"                                         \
	"  WHERE processed_at < pg_catalog.now() - pg_catalog.make_interval(secs => $1)" \
	"  ORDER BY processed_at LIMIT $2)"
#define OBX_SQL_PURGE_DEAD_LETTERS                                                        \
	"WITH gone AS ("                                                                      \
	" DELETE FROM obx.dead_letters WHERE id IN ("                                         \
	"  SELECT d.id FROM obx.dead_letters d"                                               \
	"   WHERE COALESCE(d.replayed_at, d.failed_at)"                                       \
	"         < pg_catalog.now() - pg_catalog.make_interval(secs => $1)"                  \
	"   ORDER BY d.id LIMIT $2)"                                                          \
	" RETURNING replayed_at)"                                                             \
	" SELECT pg_catalog.count(*), pg_catalog.count(*) FILTER (WHERE replayed_at IS NULL)" \
	"   FROM gone"

/*
 * Why a relay must not claim in this database, or NULL: a logical
 * replication subscription writes into obx's tables here
 * (obx._replica_problem).  Run when a relay gets ready and then every
 * OBX_REPLICA_CHECK_MS, never per claim; while it says why, a relay claims,
 * records (but for the batches already out), releases and rotates nothing,
 * and a consumer consumes and purges nothing.
 */
#define OBX_SQL_REPLICA_PROBLEM "SELECT obx._replica_problem()"
#define OBX_REPLICA_CHECK_MS    5000

/*
 * The settings every session of a relay runs with, whatever a role or
 * database sets: src/base/worker.c (pin_settings) says why each.  obx-relay
 * sets them in its sessions too; one only a superuser may set
 * (session_replication_role) it checks instead.
 */
#define OBX_PINNED_SETTINGS                                      \
	{                                                            \
		{"search_path", "pg_catalog, pg_temp"},                  \
			{"default_transaction_read_only", "off"},            \
			{"default_transaction_isolation", "read committed"}, \
			{"default_transaction_deferrable", "off"},           \
			{"statement_timeout", "0"},                          \
			{"lock_timeout", "0"},                               \
			{"idle_in_transaction_session_timeout", "0"},        \
			{"idle_session_timeout", "0"},                       \
			{"session_replication_role", "origin"},              \
			{"transform_null_equals", "off"},                    \
			{"standard_conforming_strings", "on"},               \
			{"synchronous_commit", "on"},                        \
			{"jit", "off"},                                      \
			{"max_parallel_workers_per_gather", "0"},            \
	}

/*
 * The TOAST compression of the rows a relay writes: a lease row holds a
 * batch's ids, topics and keys, and a record their partitions, offsets and
 * times, compressed inside the claim lock and the record's transaction;
 * lz4 is much faster than pglz (docs/benchmarks.md, "obx-relay beside
 * the in-database relay").  Only values the relay writes are affected; the
 * server reads either kind.  A server built without lz4 keeps its default.
 */
#define OBX_TOAST_COMPRESSION "lz4"

/* The claim lock around a transaction of obx-relay: see above. */
#define OBX_SQL_CLAIM_LOCK_SESSION   "SELECT pg_catalog.pg_advisory_lock($1, $2)"
#define OBX_SQL_CLAIM_UNLOCK_SESSION "SELECT pg_catalog.pg_advisory_unlock($1, $2)"

#endif /* OBX_PROTOCOL_H */
