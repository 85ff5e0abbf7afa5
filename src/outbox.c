/*-------------------------------------------------------------------------
 *
 * outbox.c
 *	  Every statement the relay runs against obx.outbox_events: claiming a
 *	  batch under a lease, recording what Kafka said, renewing a lease and
 *	  purging old rows.
 *
 * Each exported function is one short transaction of its own, started and
 * committed here; none is ever open while the worker waits on Kafka.
 * Statements are prepared once per worker and kept (SPI_keepplan).
 *
 * The claim is where per-key order is decided.  A key is blocked while a
 * lease holds one of its events, or while one of its unpublished events is
 * backing off, or quarantined (when obx.quarantine_blocks_key is on); an
 * event is claimable when it is unpublished, not quarantined, due,
 * and its key is not blocked.  Claims are serialized by a
 * transaction-level advisory lock, so a claim always sees the leases of
 * the claims before it, and a claim takes the earliest claimable events in
 * seq order, up to obx.batch_size of them or until their payloads pass
 * OBX_BATCH_BYTES.  Together this means the events of a key a worker
 * holds are always a prefix of that key's unpublished events, and no two
 * workers ever hold events of the same key.  No cursor ("ids after the last one
 * seen") is kept, so an event whose transaction commits late is found by
 * the next claim like any other.
 *
 * A lease is one row of obx.leases per batch (the events' ids, topics and
 * keys), not a write to each claimed event: an event is written once on
 * its way to Kafka, when the record step marks it published (or failed).
 * An expired lease keeps blocking its keys until a claim deletes it, in a
 * statement of its own before its snapshot, so that a stalled worker
 * coming back finds its lease gone (its renewal and its record step check
 * for it) whenever another claim may have taken its events over.  Each
 * worker's claims do that at most every OBX_EXPIRE_INTERVAL_MS: leases
 * expire only when a worker stalls or dies, and the statement scans every
 * lease, live and dead, which on a busy relay cost a scan per claim of a
 * table churning hundreds of rows a second.
 *
 * The blocked keys come from the leases (at most two batches
 * per worker) and from outbox_events_active_idx, which holds only the
 * unpublished events that have failed (usually none; after an outage, the
 * events that failed until they are published).  They are hashed once per
 * claim, so a claim costs the batch it takes plus the events it skips,
 * never a probe per event.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/transam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "pgstat.h"
#include "postmaster/interrupt.h"
#include "replication/syncrep.h"
#include "storage/latch.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "obx.h"

/* Advisory lock key serializing claims: ("obx" in ASCII, 1). */
#define OBX_CLAIM_LOCK_CLASS  0x6f6278
#define OBX_CLAIM_LOCK_OBJECT 1

#define OBX_PURGE_BATCH 1000

/* How often a worker's claims delete expired leases (see above). */
#define OBX_EXPIRE_INTERVAL_MS 1000

/* Failed events of one batch logged one by one; the rest are counted. */
#define OBX_LOGGED_FAILURES 10

static SPIPlanPtr claim_start_plan = NULL;
static SPIPlanPtr expire_plan = NULL;
static TimestampTz next_expire = 0; /* this worker's next deletion of expired leases */
static SPIPlanPtr claim_plan = NULL;
static SPIPlanPtr lease_plan = NULL;
static SPIPlanPtr delivered_plan = NULL;
static SPIPlanPtr delivered_end_plan = NULL;
static SPIPlanPtr failed_plan = NULL;
static SPIPlanPtr held_plan = NULL;
static SPIPlanPtr end_lease_plan = NULL;
static SPIPlanPtr renew_plan = NULL;

static const char *expire_sql =
	"DELETE FROM obx.leases l WHERE l.until < pg_catalog.now()";

static const char *claim_sql =
	"WITH blocked AS MATERIALIZED ("
	"  SELECT k.topic, k.event_key"
	"    FROM obx.leases l,"
	"         ROWS FROM (pg_catalog.unnest(l.topics), pg_catalog.unnest(l.keys))"
	"           AS k(topic, event_key)"
	"  UNION"
	"  SELECT b.topic, b.event_key"
	"    FROM obx.outbox_events b"
	"   WHERE b.published_at IS NULL"
	"     AND (b.next_attempt_at > '-infinity' OR b.quarantined_at IS NOT NULL)"
	"     AND (b.next_attempt_at > pg_catalog.now()"
	"          OR (b.quarantined_at IS NOT NULL AND $1))"
	")"
	"SELECT e.seq, e.id, e.topic, e.event_key, e.payload,"
	"       e.event_type, e.attempts,"
	"       CASE WHEN e.headers IS NOT NULL THEN"
	"         (SELECT pg_catalog.array_agg(ARRAY[h.key, h.value])"
	"            FROM pg_catalog.jsonb_each_text(e.headers) AS h) END AS headers,"
	"       e.xmin"
	"  FROM obx.outbox_events e"
	" WHERE e.published_at IS NULL"
	"   AND e.quarantined_at IS NULL"
	"   AND e.next_attempt_at <= pg_catalog.now()"
	"   AND (e.topic, e.event_key) NOT IN (SELECT topic, event_key FROM blocked)"
	" ORDER BY e.seq"
	" LIMIT $2";

/* The lease of a claimed batch: its events' ids, topics and keys. */
static const char *lease_sql =
	"INSERT INTO obx.leases (lease_id, owner, until, ids, topics, keys)"
	" VALUES ($1, $2, pg_catalog.now() + pg_catalog.make_interval(secs => $3), $4, $5, $6)";

/*
 * Delivered events: published, with where they landed and when the worker
 * received Kafka's acknowledgement.  No lease check: a delivery is a fact,
 * whoever reports it (a stale worker's late report included; the event is
 * then simply not sent again).
 */
#define DELIVERED_UPDATE                                                    \
	"UPDATE obx.outbox_events e"                                            \
	"   SET published_at = d.t, kafka_partition = d.p, kafka_offset = d.o," \
	"       attempts = e.attempts + 1, quarantined_at = NULL"               \
	"  FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.uuid[]),"           \
	"                  pg_catalog.unnest($2::pg_catalog.int4[]),"           \
	"                  pg_catalog.unnest($3::pg_catalog.int8[]),"           \
	"                  pg_catalog.unnest($4::pg_catalog.timestamptz[]))"    \
	"       AS d(id, p, o, t)"                                              \
	" WHERE e.id = d.id AND e.published_at IS NULL"

static const char *delivered_sql = DELIVERED_UPDATE;

/*
 * The same, ending the batch's lease in the same statement: a batch with
 * no failed event is recorded by one statement.
 */
static const char *delivered_end_sql =
	"WITH ended AS (DELETE FROM obx.leases l WHERE l.lease_id = $5) " DELIVERED_UPDATE;

/* Whether the batch's lease still exists; locks it until the record commits. */
static const char *held_sql =
	"SELECT 1 FROM obx.leases l WHERE l.lease_id = $1 FOR UPDATE";

static const char *end_lease_sql =
	"DELETE FROM obx.leases l WHERE l.lease_id = $1";

/*
 * A failed event backs off exponentially from obx.backoff_min to
 * obx.backoff_max.  It is quarantined when its error is permanent, or
 * unclassified and it has failed that way obx.max_attempts times (failures
 * counts only those: transient errors never quarantine, however long an
 * outage lasts).  A quarantined event has no backoff, so with
 * obx.quarantine_blocks_key off its key moves on at once.  Run only while
 * the batch's lease still exists (held_sql), so a worker whose lease
 * expired cannot undo a newer claim.  attempts is the attempts that ended,
 * this one included after the update: the n-th failure waits
 * obx.backoff_min * 2^(n-1).  An attempt that timed out ($7: librdkafka
 * gave up after obx.delivery_timeout, as when every broker is down) has
 * waited already and is due again at once: while the brokers are away its
 * event then waits inside librdkafka, which sends it as soon as a broker
 * answers, instead of in a backoff that outlasts the outage.
 */
static const char *failed_sql =
	"WITH f AS ("
	"  SELECT d.id, d.cls, d.msg, d.timed_out,"
	"         e.failures + (d.cls <> 'transient')::pg_catalog.int4 AS failures,"
	"         (d.cls = 'permanent'"
	"          OR (d.cls = 'other' AND e.failures + 1 >= $2)) AS quarantine"
	"    FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.uuid[]),"
	"                    pg_catalog.unnest($5::pg_catalog.text[]),"
	"                    pg_catalog.unnest($6::pg_catalog.text[]),"
	"                    pg_catalog.unnest($7::pg_catalog.bool[])) AS d(id, cls, msg, timed_out)"
	"    JOIN obx.outbox_events e ON e.id = d.id"
	")"
	"UPDATE obx.outbox_events e"
	"   SET last_error = f.msg, last_error_class = f.cls, last_error_at = pg_catalog.now(),"
	"       failures = f.failures, attempts = e.attempts + 1,"
	"       quarantined_at = CASE WHEN f.quarantine THEN pg_catalog.now() END,"
	"       next_attempt_at = CASE WHEN f.quarantine THEN '-infinity'"
	"           WHEN f.timed_out THEN pg_catalog.now()"
	"           ELSE pg_catalog.now() + pg_catalog.make_interval(secs =>"
	"               least($4::pg_catalog.float8,"
	"                     $3::pg_catalog.float8 * pg_catalog.power(2, least(e.attempts, 40))) / 1000)"
	"           END"
	"  FROM f"
	" WHERE e.id = f.id AND e.published_at IS NULL"
	" RETURNING e.id::pg_catalog.text, e.topic, e.quarantined_at IS NOT NULL, e.next_attempt_at";

static const char *renew_sql =
	"UPDATE obx.leases l"
	"   SET until = pg_catalog.now() + pg_catalog.make_interval(secs => $2)"
	" WHERE l.lease_id = $1";

static void
prepare_plans(void)
{
	if (claim_plan != NULL)
		return;

	{
		Oid types[2] = {INT4OID, INT4OID};

		/* The lease id is drawn first, then the claim lock is taken. */
		claim_start_plan = obx_prepare_kept("SELECT pg_catalog.nextval('obx.lease_seq'),"
											" pg_catalog.pg_advisory_xact_lock($1, $2)",
											2, types);
	}
	expire_plan = obx_prepare_kept(expire_sql, 0, NULL);
	{
		Oid types[2] = {BOOLOID, INT4OID};
		Oid lease_types[6] = {INT8OID, INT4OID, FLOAT8OID, UUIDARRAYOID,
							  TEXTARRAYOID, TEXTARRAYOID};

		/*
		 * The claim gets a generic plan.  Planning it costs about as much
		 * as running it on a small batch (0.2 to 0.4 ms), and its plan is
		 * the same whatever the parameters: blocked keys hashed, the
		 * pending index walked in seq order up to the batch size.  The
		 * plan is still rebuilt when the outbox's statistics change.  The
		 * other statements keep PostgreSQL's choice: the record's join,
		 * for one, is planned from the number of events it marks.
		 */
		claim_plan = obx_prepare_kept_generic(claim_sql, 2, types);
		lease_plan = obx_prepare_kept(lease_sql, 6, lease_types);
	}
	{
		Oid types[4] = {UUIDARRAYOID, INT4ARRAYOID, INT8ARRAYOID,
						TIMESTAMPTZARRAYOID};

		delivered_plan = obx_prepare_kept(delivered_sql, 4, types);
	}
	{
		Oid types[5] = {UUIDARRAYOID, INT4ARRAYOID, INT8ARRAYOID,
						TIMESTAMPTZARRAYOID, INT8OID};

		delivered_end_plan = obx_prepare_kept(delivered_end_sql, 5, types);
	}
	{
		Oid types[7] = {UUIDARRAYOID, INT4OID, FLOAT8OID, FLOAT8OID,
						TEXTARRAYOID, TEXTARRAYOID, BOOLARRAYOID};

		failed_plan = obx_prepare_kept(failed_sql, 7, types);
	}
	{
		Oid types[1] = {INT8OID};

		held_plan = obx_prepare_kept(held_sql, 1, types);
		end_lease_plan = obx_prepare_kept(end_lease_sql, 1, types);
	}
	{
		Oid types[2] = {INT8OID, FLOAT8OID};

		renew_plan = obx_prepare_kept(renew_sql, 2, types);
	}
}

static char *
copy_value(HeapTuple tup, TupleDesc desc, int col)
{
	bool isnull;
	Datum d = SPI_getbinval(tup, desc, col, &isnull);

	if (isnull)
		return NULL;
	return TextDatumGetCString(d);
}

/*
 * The caller's headers arrive as a two-dimensional text array of
 * name/value pairs (NULL when the event has none).
 */
static void
copy_headers(ObxEvent *ev, HeapTuple tup, TupleDesc desc, int col)
{
	bool isnull;
	Datum d = SPI_getbinval(tup, desc, col, &isnull);
	Datum *elems;
	int nelems;
	int i;

	ev->nheaders = 0;
	if (isnull)
		return;
	deconstruct_array(DatumGetArrayTypeP(d), TEXTOID, -1, false, TYPALIGN_INT,
					  &elems, NULL, &nelems);
	ev->nheaders = nelems / 2;
	ev->header_names = palloc(sizeof(char *) * ev->nheaders);
	ev->header_values = palloc(sizeof(char *) * ev->nheaders);
	for (i = 0; i < ev->nheaders; i++)
	{
		ev->header_names[i] = TextDatumGetCString(elems[2 * i]);
		ev->header_values[i] = TextDatumGetCString(elems[2 * i + 1]);
	}
}

/* Set when a wait for the synchronous standby was interrupted. */
static volatile sig_atomic_t sync_wait_interrupted = false;

/*
 * SIGINT (pg_cancel_backend) and SIGTERM (shutdown) while a worker waits
 * for the synchronous standby.  SyncRepWaitForLSN ends its wait on a
 * cancel, but not on the relay's own shutdown flag, so a shutdown cancels
 * the wait too.
 */
static void
interrupt_sync_wait(SIGNAL_ARGS)
{
	int save_errno = errno;

	if (postgres_signal_arg == SIGTERM)
		ShutdownRequestPending = true;
	sync_wait_interrupted = true;
	QueryCancelPending = true;
	InterruptPending = true;
	SetLatch(MyLatch);
	errno = save_errno;
}

/*
 * wait_for_sync_standby
 *		Wait, holding no transaction, until the synchronous standby has
 *		flushed the WAL up to upto; returns whether it did.
 *
 * A shutdown request or a cancel (pg_cancel_backend) ends the wait, and
 * then the standby's flush is not known: false, and the caller publishes
 * nothing of the claim.  A change of synchronous_standby_names that leaves
 * no synchronous standby also ends it: true.
 */
static bool
wait_for_sync_standby(XLogRecPtr upto)
{
	pqsigfunc old_int;
	pqsigfunc old_term;

	sync_wait_interrupted = false;
	old_int = pqsignal(SIGINT, interrupt_sync_wait);
	old_term = pqsignal(SIGTERM, interrupt_sync_wait);
	/* A shutdown or cancel that came before the handlers counts too. */
	if (ShutdownRequestPending || QueryCancelPending)
		sync_wait_interrupted = true;
	else
		SyncRepWaitForLSN(upto, true);
	pqsignal(SIGINT, old_int);
	pqsignal(SIGTERM, old_term);
	/* The cancel was ours; SyncRepWaitForLSN consumed it, or it came too late. */
	if (sync_wait_interrupted)
		QueryCancelPending = false;
	CHECK_FOR_INTERRUPTS();
	return !sync_wait_interrupted;
}

/* End a batch's lease, inside the caller's step. */
static void
end_lease(int64 lease_id)
{
	Datum lease_arg[1] = {Int64GetDatum(lease_id)};
	int rc;

	rc = SPI_execute_plan(end_lease_plan, lease_arg, NULL, false, 0);
	if (rc != SPI_OK_DELETE)
		elog(ERROR, "obx could not end a lease: %s", SPI_result_code_string(rc));
}

/*
 * release_claim
 *		End the lease of a claimed batch without publishing any of it.
 */
static void
release_claim(ObxBatch *batch)
{
	MemoryContext caller = obx_step_begin("obx: releasing a claim");

	(void) set_config_option("synchronous_commit", "off", PGC_SUSET,
							 PGC_S_SESSION, GUC_ACTION_LOCAL, true, 0, false);
	end_lease(batch->lease_id);
	obx_step_end(caller);
	ereport(LOG,
			(errmsg_plural("obx relay stopped waiting for the synchronous standby and released %d claimed event unpublished",
						   "obx relay stopped waiting for the synchronous standby and released %d claimed events unpublished",
						   batch->nevents, batch->nevents),
			 errdetail("Events are published only once the synchronous standby has them; they are claimed again.")));
	batch->nevents = 0;
	obx_note_change();
}

/*
 * One row of the claim into ev (strings in the caller's context) and the
 * lease's arrays (in the step's); returns its payload's size.  Notes the
 * commit position of its transaction when the asynchronous commits are
 * not settled (see obx_outbox_claim).
 */
static int64
claim_copy_event(ObxEvent *ev, HeapTuple tup, TupleDesc desc,
				 MemoryContext caller, Datum *id, Datum *topic, Datum *key,
				 bool settled, TransactionId *last_xmin, XLogRecPtr *flush_upto)
{
	MemoryContext step_cxt = MemoryContextSwitchTo(caller);
	bool isnull;
	TransactionId xmin;

	memcpy(&ev->id, DatumGetUUIDP(SPI_getbinval(tup, desc, 2, &isnull)),
		   sizeof(pg_uuid_t));
	strlcpy(ev->id_text,
			DatumGetCString(DirectFunctionCall1(uuid_out, UUIDPGetDatum(&ev->id))),
			sizeof(ev->id_text));
	ev->topic = copy_value(tup, desc, 3);
	ev->key = copy_value(tup, desc, 4);
	{
		Datum stored = SPI_getbinval(tup, desc, 5, &isnull);
		Jsonb *payload = DatumGetJsonbP(stored);
		StringInfoData text;

		/* What payload::text gives; the detoasted copy is freed at once. */
		initStringInfo(&text);
		(void) JsonbToCString(&text, &payload->root, VARSIZE(payload));
		if ((Pointer) payload != DatumGetPointer(stored))
			pfree(payload);
		ev->payload_len = text.len;
		ev->payload = text.data;
		/* The buffer grew by doubling: keep no more than the text. */
		if (text.maxlen > text.len + text.len / 4 + 1024)
		{
			ev->payload = pnstrdup(text.data, text.len);
			pfree(text.data);
		}
	}
	ev->event_type = copy_value(tup, desc, 6);
	ev->attempts = DatumGetInt32(SPI_getbinval(tup, desc, 7, &isnull)) + 1;
	copy_headers(ev, tup, desc, 8);
	ev->outcome = OBX_OUTCOME_UNSENT;
	MemoryContextSwitchTo(step_cxt);

	*id = UUIDPGetDatum(&ev->id);
	*topic = CStringGetTextDatum(ev->topic);
	*key = CStringGetTextDatum(ev->key);

	/* A backlog comes from few transactions: look each one up once. */
	xmin = DatumGetTransactionId(SPI_getbinval(tup, desc, 9, &isnull));
	if (!settled && xmin != *last_xmin)
	{
		XLogRecPtr commit_lsn = TransactionIdGetCommitLSN(xmin);

		if (commit_lsn > *flush_upto)
			*flush_upto = commit_lsn;
		*last_xmin = xmin;
	}
	return ev->payload_len;
}

/*
 * obx_outbox_claim
 *		Lease up to obx.batch_size publishable events to this worker, fewer
 *		when their payloads pass OBX_BATCH_BYTES.
 *
 * Fills batch (allocated in the caller's memory context) in seq order and
 * returns whether anything was claimed.  The claim is committed, and the
 * WAL flushed past the claimed events' commits, before this returns.
 */
bool
obx_outbox_claim(ObxBatch *batch, int worker, bool force)
{
	MemoryContext caller = obx_step_begin("obx: claiming events");
	Datum lock_args[2] = {Int32GetDatum(OBX_CLAIM_LOCK_CLASS),
						  Int32GetDatum(OBX_CLAIM_LOCK_OBJECT)};
	Datum args[2];
	int rc;
	uint64 n;
	uint64 nrows;
	int64 bytes = 0;
	int64 lease_id;
	bool isnull;
	XLogRecPtr visible_upto;
	XLogRecPtr flush_upto = InvalidXLogRecPtr;
	bool settled;
	uint64 changes;
	bool expired = false;
	TransactionId last_xmin = InvalidTransactionId;
	Snapshot snapshot;
	Datum *ids;
	Datum *topics;
	Datum *keys;

	prepare_plans();

	/*
	 * Publish only what is durable.  A transaction that committed
	 * synchronously became visible after its commit record was flushed; one
	 * that committed asynchronously (synchronous_commit = off) is visible
	 * at once, so the claim flushes the WAL past its commit record before
	 * anything is produced.  Where that record ends comes from
	 * obx_async_commits_settled: obx's functions (obx.enqueue and the
	 * operator functions) report each asynchronous commit of theirs, and
	 * when none is under way once the claim's snapshot is taken, every one
	 * the claim can see ends at or before the reported position.  When one
	 * is under way, the claim falls back to the commit log: for each group
	 * of 32 transactions it keeps the WAL position of the group's latest
	 * asynchronous commit record (PostgreSQL holds hint bits back with it
	 * until that is flushed), so the claim reads each event's inserting
	 * transaction (xmin) and flushes up to the latest such position.  The
	 * relay's own commits are asynchronous and share those groups, which
	 * is why that is only the fallback: it flushed on nearly every claim.
	 * With synchronous standbys the claim instead flushes, and waits for
	 * them, up to the WAL's insert position read right after its snapshot
	 * is taken: every event it sees committed before that, and a commit
	 * with synchronous_commit = local or remote_write is flushed here but
	 * not yet on the standby.  The claim's own commit need not be durable:
	 * a claim lost in a crash only means a re-send with the same ids.  So
	 * it commits asynchronously, and the flush waits until after the
	 * commit, which releases the claim lock.
	 */
	(void) set_config_option("synchronous_commit", "off", PGC_SUSET,
							 PGC_S_SESSION, GUC_ACTION_LOCAL, true, 0, false);

	rc = SPI_execute_plan(claim_start_plan, lock_args, NULL, false, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "obx could not draw a lease id and take the claim lock: %s",
			 SPI_result_code_string(rc));
	lease_id = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
										   SPI_tuptable->tupdesc, 1, &isnull));

	/* The claim this one waited for may have taken everything. */
	if (!force && obx_claim_pointless())
	{
		obx_step_end(caller);
		batch->nevents = 0;
		batch->full = false;
		return false;
	}

	/* A statement of its own: the claim's snapshot must see its effect. */
	if (GetCurrentTimestamp() >= next_expire)
	{
		rc = SPI_execute_plan(expire_plan, NULL, NULL, false, 0);
		if (rc != SPI_OK_DELETE)
			elog(ERROR, "obx could not remove expired leases: %s",
				 SPI_result_code_string(rc));
		expired = SPI_processed > 0;
		next_expire = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
												  OBX_EXPIRE_INTERVAL_MS);
	}

	args[0] = BoolGetDatum(obx_quarantine_blocks_key);
	args[1] = Int32GetDatum(obx_batch_size);

	/*
	 * The count of changes is read before the claim's snapshot is taken,
	 * the WAL position and the asynchronous commits after it.
	 */
	changes = obx_changes();
	snapshot = RegisterSnapshot(GetTransactionSnapshot());
	visible_upto = GetXLogInsertRecPtr();
	settled = obx_async_commits_settled(&flush_upto);
	rc = SPI_execute_snapshot(claim_plan, args, NULL, snapshot, InvalidSnapshot,
							  true, false, 0);
	UnregisterSnapshot(snapshot);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "obx claim failed: %s", SPI_result_code_string(rc));

	/*
	 * The batch: the events in seq order, until their payloads pass the
	 * cap.  The claim returns each payload as stored (jsonb, a TOAST
	 * pointer when it is large), and only the events taken into the batch
	 * are read and turned into text, so what the worker holds is bounded
	 * by the cap plus one payload, not by obx.batch_size times the payload
	 * size.
	 */
	nrows = SPI_processed;
	ids = palloc(sizeof(Datum) * Max(nrows, 1));
	topics = palloc(sizeof(Datum) * Max(nrows, 1));
	keys = palloc(sizeof(Datum) * Max(nrows, 1));
	batch->lease_id = lease_id;
	batch->in_flight = 0;
	batch->retry_at = 0;
	batch->events = nrows > 0 ? MemoryContextAllocZero(caller, sizeof(ObxEvent) * nrows)
							  : NULL;
	n = 0;
	while (n < nrows && bytes < OBX_BATCH_BYTES)
	{
		bytes += claim_copy_event(&batch->events[n], SPI_tuptable->vals[n],
								  SPI_tuptable->tupdesc, caller,
								  &ids[n], &topics[n], &keys[n],
								  settled, &last_xmin, &flush_upto);
		n++;
	}
	batch->nevents = (int) n;
	batch->full = nrows >= (uint64) obx_batch_size || n < nrows;

	if (n > 0)
	{
		Datum lease_args[6];

		lease_args[0] = Int64GetDatum(lease_id);
		lease_args[1] = Int32GetDatum(worker);
		lease_args[2] = Float8GetDatum((double) obx_lease_timeout_s);
		lease_args[3] = PointerGetDatum(construct_array(ids, n, UUIDOID, UUID_LEN,
														false, TYPALIGN_CHAR));
		lease_args[4] = PointerGetDatum(construct_array(topics, n, TEXTOID, -1,
														false, TYPALIGN_INT));
		lease_args[5] = PointerGetDatum(construct_array(keys, n, TEXTOID, -1,
														false, TYPALIGN_INT));
		rc = SPI_execute_plan(lease_plan, lease_args, NULL, false, 0);
		if (rc != SPI_OK_INSERT)
			elog(ERROR, "obx could not lease a batch: %s", SPI_result_code_string(rc));
	}

	/*
	 * Published before the commit releases the claim lock, so that a claim
	 * waiting for it sees it.  Should the commit fail, the worker exits and
	 * its successor's first claim does not skip.
	 */
	if (!batch->full)
		obx_claimed_changes(changes);
	obx_step_end(caller);
	if (expired)
		obx_note_change(); /* their keys are free for the other workers too */
	if (batch->nevents == 0)
		return false;
	if (SyncRepStandbyNames != NULL && SyncRepStandbyNames[0] != '\0')
	{
		XLogFlush(visible_upto);
		if (!wait_for_sync_standby(visible_upto))
		{
			release_claim(batch);
			return false;
		}
	}
	else if (flush_upto > GetFlushRecPtr(NULL))
		XLogFlush(flush_upto);
	return true;
}

static Datum
uuid_array(ObxEvent **events, int n)
{
	Datum *elems = palloc(sizeof(Datum) * n);
	int i;

	for (i = 0; i < n; i++)
		elems[i] = UUIDPGetDatum(&events[i]->id);
	return PointerGetDatum(construct_array(elems, n, UUIDOID, UUID_LEN, false,
										   TYPALIGN_CHAR));
}

/*
 * Mark delivered events published; with end_lease, also end the batch's
 * lease (lease_id) in the same statement.
 */
static int
record_delivered(ObxEvent **events, int n, bool end_lease, int64 lease_id)
{
	Datum *parts = palloc(sizeof(Datum) * n);
	Datum *offsets = palloc(sizeof(Datum) * n);
	Datum *acked = palloc(sizeof(Datum) * n);
	Datum args[5];
	int i;
	int rc;

	for (i = 0; i < n; i++)
	{
		parts[i] = Int32GetDatum(events[i]->partition);
		offsets[i] = Int64GetDatum(events[i]->offset);
		acked[i] = TimestampTzGetDatum(events[i]->acked_at);
		elog(DEBUG2, "obx event %s published to topic %s partition %d offset " INT64_FORMAT,
			 events[i]->id_text, events[i]->topic, events[i]->partition,
			 events[i]->offset);
	}
	args[0] = uuid_array(events, n);
	args[1] = PointerGetDatum(construct_array(parts, n, INT4OID, 4, true, TYPALIGN_INT));
	args[2] = PointerGetDatum(construct_array(offsets, n, INT8OID, 8, FLOAT8PASSBYVAL,
											  TYPALIGN_DOUBLE));
	args[3] = PointerGetDatum(construct_array(acked, n, TIMESTAMPTZOID, 8,
											  FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	args[4] = Int64GetDatum(lease_id);
	rc = SPI_execute_plan(end_lease ? delivered_end_plan : delivered_plan, args, NULL,
						  false, 0);
	if (rc != SPI_OK_UPDATE)
		elog(ERROR, "obx could not mark events published: %s",
			 SPI_result_code_string(rc));
	/* Rows this call published; a stale worker's late reports publish none. */
	return (int) SPI_processed;
}

static void
record_failed(ObxBatch *batch, ObxEvent **events, int n)
{
	Datum *classes = palloc(sizeof(Datum) * n);
	Datum *messages = palloc(sizeof(Datum) * n);
	Datum *timed_out = palloc(sizeof(Datum) * n);
	Datum args[7];
	int i;
	int rc;
	uint64 j;

	for (i = 0; i < n; i++)
	{
		ObxEvent *ev = events[i];

		classes[i] = CStringGetTextDatum(obx_error_class_name(ev->error_class));
		messages[i] = CStringGetTextDatum(psprintf("%s: %s%s",
												   obx_kafka_error_name(ev->err),
												   obx_kafka_error_text(ev->err),
												   ev->refused_locally ? " (refused by librdkafka, not sent)" : ""));
		timed_out[i] = BoolGetDatum(obx_kafka_timed_out(ev->err));
		if (i < OBX_LOGGED_FAILURES)
			ereport(WARNING,
					(errcode(ERRCODE_CONNECTION_FAILURE),
					 errmsg("obx could not publish event %s to topic %s",
							ev->id_text, ev->topic),
					 errdetail("error class %s, Kafka error %s: %s, attempt %d",
							   obx_error_class_name(ev->error_class),
							   obx_kafka_error_name(ev->err),
							   obx_kafka_error_text(ev->err), ev->attempts)));
	}
	if (n > OBX_LOGGED_FAILURES)
		ereport(WARNING,
				(errcode(ERRCODE_CONNECTION_FAILURE),
				 errmsg("obx could not publish %d more events of the same batch",
						n - OBX_LOGGED_FAILURES),
				 errdetail("Each one's error is in obx.outbox_events.last_error.")));
	args[0] = uuid_array(events, n);
	args[1] = Int32GetDatum(obx_max_attempts);
	args[2] = Float8GetDatum((double) obx_backoff_min_ms);
	args[3] = Float8GetDatum((double) obx_backoff_max_ms);
	args[4] = PointerGetDatum(construct_array(classes, n, TEXTOID, -1, false, TYPALIGN_INT));
	args[5] = PointerGetDatum(construct_array(messages, n, TEXTOID, -1, false, TYPALIGN_INT));
	args[6] = PointerGetDatum(construct_array(timed_out, n, BOOLOID, 1, true, TYPALIGN_CHAR));
	rc = SPI_execute_plan(failed_plan, args, NULL, false, 0);
	if (rc != SPI_OK_UPDATE_RETURNING)
		elog(ERROR, "obx could not record publish errors: %s",
			 SPI_result_code_string(rc));

	for (j = 0; j < SPI_processed; j++)
	{
		HeapTuple tup = SPI_tuptable->vals[j];
		TupleDesc desc = SPI_tuptable->tupdesc;
		bool isnull;

		if (!DatumGetBool(SPI_getbinval(tup, desc, 3, &isnull)))
		{
			TimestampTz due = DatumGetTimestampTz(SPI_getbinval(tup, desc, 4, &isnull));

			batch->retry_at = Max(batch->retry_at, due);
		}
		else
			ereport(WARNING,
					(errcode(ERRCODE_DATA_EXCEPTION),
					 errmsg("obx quarantined event %s of topic %s",
							SPI_getvalue(tup, desc, 1), SPI_getvalue(tup, desc, 2)),
					 errhint("Fix the cause, then call obx.retry('%s').",
							 SPI_getvalue(tup, desc, 1))));
	}
}

/*
 * obx_outbox_record
 *		Write what Kafka said about a batch, in one short transaction.
 *
 * Delivered events get published_at, partition and offset; failed ones
 * their error, a backoff or quarantine, but only while the batch's lease
 * still exists (otherwise another worker may have them already); events
 * never handed to Kafka (or still in flight when the worker gives up on
 * them) need no write: ending the lease releases them for the next claim.
 * Returns how many events this call marked published.
 */
int
obx_outbox_record(ObxBatch *batch)
{
	int published = 0;
	MemoryContext caller;
	ObxEvent **delivered;
	ObxEvent **failed;
	int ndelivered = 0;
	int nfailed = 0;
	int i;
	int rc;
	Datum lease_arg[1];

	if (batch->nevents == 0)
		return 0;

	delivered = palloc(sizeof(ObxEvent *) * batch->nevents);
	failed = palloc(sizeof(ObxEvent *) * batch->nevents);
	for (i = 0; i < batch->nevents; i++)
	{
		ObxEvent *ev = &batch->events[i];

		switch (ev->outcome)
		{
			case OBX_OUTCOME_DELIVERED:
				delivered[ndelivered++] = ev;
				break;
			case OBX_OUTCOME_FAILED:
				failed[nfailed++] = ev;
				break;
			case OBX_OUTCOME_UNSENT:
			case OBX_OUTCOME_IN_FLIGHT:
				break;
		}
	}

	caller = obx_step_begin("obx: recording deliveries");

	/*
	 * The record needs no flush of its own: if a crash loses it, the
	 * events are still unpublished and are sent again with the same ids
	 * (at least once).  Only the claim must be durable (see relay.c).
	 */
	(void) set_config_option("synchronous_commit", "off", PGC_SUSET,
							 PGC_S_SESSION, GUC_ACTION_LOCAL, true, 0, false);
	prepare_plans();
	lease_arg[0] = Int64GetDatum(batch->lease_id);

	/* The usual batch, every event delivered: one statement. */
	if (nfailed == 0 && ndelivered > 0)
	{
		published = record_delivered(delivered, ndelivered, true, batch->lease_id);
		obx_step_end(caller);
		return published;
	}
	if (ndelivered > 0)
		published = record_delivered(delivered, ndelivered, false, 0);
	if (nfailed > 0)
	{
		rc = SPI_execute_plan(held_plan, lease_arg, NULL, false, 0);
		if (rc != SPI_OK_SELECT)
			elog(ERROR, "obx could not check a lease: %s", SPI_result_code_string(rc));
		if (SPI_processed == 1)
			record_failed(batch, failed, nfailed);
		else
			ereport(LOG,
					(errmsg("obx relay lost the lease of %d failed events before recording them",
							nfailed),
					 errdetail("Another worker has taken them over.")));
	}
	end_lease(batch->lease_id);
	obx_step_end(caller);
	return published;
}

/*
 * obx_outbox_release_orphans
 *		Release the leases held under this worker number.
 *
 * Called when a worker starts: only one process at a time runs a given
 * worker number, so any lease still recorded under it belongs to a
 * predecessor that died (crash, kill, error exit).  Its events are re-sent
 * at once, with the same ids, instead of after obx.lease_timeout.
 */
int64
obx_outbox_release_orphans(int worker)
{
	MemoryContext caller = obx_step_begin("obx: releasing orphaned leases");
	Oid types[1] = {INT4OID};
	Datum args[1] = {Int32GetDatum(worker)};
	int rc;
	int64 released;

	rc = SPI_execute_with_args("WITH gone AS ("
							   "  DELETE FROM obx.leases l WHERE l.owner = $1"
							   "  RETURNING pg_catalog.cardinality(l.ids) AS n)"
							   " SELECT coalesce(pg_catalog.sum(n), 0)::pg_catalog.int8 FROM gone",
							   1, types, args, NULL, false, 0);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "obx could not release orphaned leases: %s",
			 SPI_result_code_string(rc));
	{
		bool isnull;

		released = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
											   SPI_tuptable->tupdesc, 1, &isnull));
	}
	obx_step_end(caller);
	if (released > 0)
		obx_note_change();
	return released;
}

/*
 * obx_outbox_renew
 *		Extend the lease of a batch still in flight; returns how many of
 *		its events are still held: all of them, or none when the lease
 *		expired and another claim removed it (and may have taken them).
 */
int
obx_outbox_renew(ObxBatch *batch)
{
	MemoryContext caller = obx_step_begin("obx: renewing lease");
	Datum args[2];
	int rc;
	int held;

	prepare_plans();
	args[0] = Int64GetDatum(batch->lease_id);
	args[1] = Float8GetDatum((double) obx_lease_timeout_s);
	rc = SPI_execute_plan(renew_plan, args, NULL, false, 0);
	if (rc != SPI_OK_UPDATE)
		elog(ERROR, "obx could not renew a lease: %s", SPI_result_code_string(rc));
	held = SPI_processed == 1 ? batch->nevents : 0;
	obx_step_end(caller);
	return held;
}

/*
 * obx_outbox_analyze
 *		Refresh the planner's statistics of the outbox if they are stale,
 *		in a short transaction of its own.
 *
 * Every relay statement is planned from them.  After a burst (a backlog
 * that built up during an outage, a bulk enqueue, a replay) they still say
 * that next to nothing is unpublished until autovacuum's next visit, and
 * the claim and the record then scan the whole backlog on every batch.
 */
void
obx_outbox_analyze(void)
{
	MemoryContext caller = obx_step_begin("obx: analyzing the outbox");
	int rc;
	bool stale;
	bool isnull;

	/*
	 * Only when the statistics are stale: more rows changed since the last
	 * ANALYZE (autovacuum's included) than a tenth of the rows it saw.  An
	 * ANALYZE costs as much as several batches.
	 */
	rc = SPI_execute("SELECT pg_catalog.pg_stat_get_mod_since_analyze(c.oid)"
					 "       > greatest(c.reltuples, 0) / 10 + 1000"
					 "  FROM pg_catalog.pg_class c"
					 " WHERE c.oid = 'obx.outbox_events'::pg_catalog.regclass",
					 true, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "obx could not read the outbox's statistics: %s",
			 SPI_result_code_string(rc));
	stale = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0],
									   SPI_tuptable->tupdesc, 1, &isnull));
	if (stale)
	{
		rc = SPI_execute("ANALYZE obx.outbox_events", false, 0);
		if (rc != SPI_OK_UTILITY)
			elog(ERROR, "obx could not analyze the outbox: %s", SPI_result_code_string(rc));
	}
	obx_step_end(caller);
}

/*
 * Dead letters older than obx.dead_letter_retention: counted from
 * the failure, or from the replay for a replayed one.  One that was never
 * replayed is given up on, and the log says how many.
 */
static int64
purge_dead_letters(void)
{
	Oid types[2] = {FLOAT8OID, INT4OID};
	Datum args[2];
	bool isnull;
	int rc;
	int64 unreplayed;

	args[0] = Float8GetDatum((double) obx_dead_letter_retention_s);
	args[1] = Int32GetDatum(OBX_PURGE_BATCH);
	rc = SPI_execute_with_args(
		"WITH gone AS ("
		" DELETE FROM obx.dead_letters WHERE id IN ("
		"  SELECT d.id FROM obx.dead_letters d"
		"   WHERE COALESCE(d.replayed_at, d.failed_at)"
		"         < pg_catalog.now() - pg_catalog.make_interval(secs => $1)"
		"   ORDER BY d.id LIMIT $2)"
		" RETURNING replayed_at)"
		" SELECT pg_catalog.count(*), pg_catalog.count(*) FILTER (WHERE replayed_at IS NULL)"
		"   FROM gone",
		2, types, args, NULL, false, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "obx dead letter purge failed: %s", SPI_result_code_string(rc));
	unreplayed = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
											 SPI_tuptable->tupdesc, 2, &isnull));
	if (unreplayed > 0)
		ereport(LOG,
				(errmsg("obx purged %lld dead letters that were never replayed",
						(long long) unreplayed),
				 errdetail("They were older than obx.dead_letter_retention.")));
	return DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
									   SPI_tuptable->tupdesc, 1, &isnull));
}

/*
 * Run one purge DELETE whose $1 is a retention in seconds and $2 the batch
 * limit (OBX_PURGE_BATCH); returns how many rows it deleted.
 */
static int64
purge_older_than(const char *sql, int retention_s, const char *what)
{
	Oid types[2] = {FLOAT8OID, INT4OID};
	Datum args[2];
	int rc;

	args[0] = Float8GetDatum((double) retention_s);
	args[1] = Int32GetDatum(OBX_PURGE_BATCH);
	rc = SPI_execute_with_args(sql, 2, types, args, NULL, false, 0);
	if (rc != SPI_OK_DELETE)
		elog(ERROR, "obx %s purge failed: %s", what, SPI_result_code_string(rc));
	return SPI_processed;
}

/*
 * obx_outbox_purge
 *		Delete up to OBX_PURGE_BATCH published events older than
 *		obx.retention, as many dedupe rows older than
 *		obx.processed_retention, and as many dead letters older than
 *		obx.dead_letter_retention; returns how many rows went.
 */
int64
obx_outbox_purge(void)
{
	MemoryContext caller;
	int64 purged = 0;

	if (obx_retention_s == 0 && obx_processed_retention_s == 0 &&
		obx_dead_letter_retention_s == 0)
		return 0;

	caller = obx_step_begin("obx: purging old rows");
	if (obx_retention_s > 0)
		purged += purge_older_than(
			"DELETE FROM obx.outbox_events WHERE id IN ("
			" SELECT id FROM obx.outbox_events"
			"  WHERE published_at < pg_catalog.now() - pg_catalog.make_interval(secs => $1)"
			"  ORDER BY published_at LIMIT $2)",
			obx_retention_s, "outbox");
	if (obx_processed_retention_s > 0)
		purged += purge_older_than(
			"DELETE FROM obx.processed_events WHERE ctid IN ("
			" SELECT ctid FROM obx.processed_events"
			"  WHERE processed_at < pg_catalog.now() - pg_catalog.make_interval(secs => $1)"
			"  ORDER BY processed_at LIMIT $2)",
			obx_processed_retention_s, "dedupe");
	if (obx_dead_letter_retention_s > 0)
		purged += purge_dead_letters();
	obx_step_end(caller);
	return purged;
}
