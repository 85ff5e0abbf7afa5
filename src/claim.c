/*-------------------------------------------------------------------------
 *
 * claim.c
 *	  The claim: leasing a batch of publishable events of obx.outbox_events
 *	  to a relay worker, in one short transaction, and making sure what it
 *	  took is durable before anything of it is produced.
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
 * its way to Kafka, when the record step (outbox.c) marks it published or
 * failed.  An expired lease keeps blocking its keys until a claim deletes
 * it, in a statement of its own before its snapshot, so that a stalled
 * worker coming back finds its lease gone (its renewal and its record step
 * check for it) whenever another claim may have taken its events over.
 * Each worker's claims do that at most every OBX_EXPIRE_INTERVAL_MS: leases
 * expire only when a worker stalls or dies, and the statement scans every
 * lease, live and dead, of a table that churns with every batch.
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
#include "miscadmin.h"
#include "postmaster/interrupt.h"
#include "replication/syncrep.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "obx.h"
#include "compat.h"
#include "turns.h"
#include "worker.h"
#include "outbox.h"

/* Advisory lock key serializing claims: ("obx" in ASCII, 1). */
#define OBX_CLAIM_LOCK_CLASS  0x6f6278
#define OBX_CLAIM_LOCK_OBJECT 1

/* How often a worker's claims delete expired leases (see above). */
#define OBX_EXPIRE_INTERVAL_MS 1000

static SPIPlanPtr claim_start_plan = NULL;
static SPIPlanPtr expire_plan = NULL;
static TimestampTz next_expire = 0; /* this worker's next deletion of expired leases */
static SPIPlanPtr claim_plan = NULL;
static SPIPlanPtr lease_plan = NULL;

/* The lease id is drawn first, then the claim lock is taken. */
static const char *claim_start_sql =
	"SELECT pg_catalog.nextval('obx.lease_seq'),"
	" pg_catalog.pg_advisory_xact_lock($1, $2)";

static const char *expire_sql =
	"DELETE FROM obx.leases l WHERE l.until < pg_catalog.now()";

/*
 * The claimable events in seq order ($1: obx.quarantine_blocks_key, $2:
 * obx.batch_size), each with its payload as stored and its inserting
 * transaction (xmin).
 */
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
	"       e.xmin, e.occurred_at"
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
 * Where the claimed events' commits end in the WAL, and so what must be
 * flushed (and reach the synchronous standbys) before any of them is
 * produced; see make_durable.
 */
typedef struct ClaimWal
{
	XLogRecPtr visible_upto; /* WAL insert position right after the snapshot */
	XLogRecPtr flush_upto;   /* end of the latest asynchronous commit seen */
	bool settled;            /* no asynchronous commit of obx's under way */
	TransactionId last_xmin; /* the last inserting transaction looked up */
} ClaimWal;

/* The lease's arrays, one element per event taken into the batch. */
typedef struct ClaimLease
{
	Datum *ids;
	Datum *topics;
	Datum *keys;
} ClaimLease;

/* Set when a wait for the synchronous standby was interrupted. */
static volatile sig_atomic_t sync_wait_interrupted = false;

/*
 * The claim's plan is generic: it is the same whatever the parameters
 * (blocked keys hashed, the pending index walked in seq order up to the
 * batch size), and is still rebuilt when the outbox's statistics change.
 */
static void
claim_prepare_plans(void)
{
	Oid start_types[2] = {INT4OID, INT4OID};
	Oid claim_types[2] = {BOOLOID, INT4OID};
	Oid lease_types[6] = {INT8OID, INT4OID, FLOAT8OID, UUIDARRAYOID,
						  TEXTARRAYOID, TEXTARRAYOID};

	if (claim_plan != NULL)
		return;
	claim_start_plan = obx_prepare_kept(claim_start_sql, 2, start_types);
	expire_plan = obx_prepare_kept(expire_sql, 0, NULL);
	claim_plan = obx_prepare_kept_generic(claim_sql, 2, claim_types);
	lease_plan = obx_prepare_kept(lease_sql, 6, lease_types);
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

/*
 * The payload as payload::text gives it, in the current memory context;
 * the detoasted copy of the stored jsonb is freed at once.  NULL for a
 * tombstone.
 */
static void
copy_payload(ObxEvent *ev, HeapTuple tup, TupleDesc desc, int col)
{
	bool isnull;
	Datum stored = SPI_getbinval(tup, desc, col, &isnull);
	Jsonb *payload;
	StringInfoData text;

	if (isnull)
	{
		/* A tombstone: produced with a null value. */
		ev->payload = NULL;
		ev->payload_len = 0;
		return;
	}
	payload = DatumGetJsonbP(stored);
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

/*
 * One row of the claim into ev (strings in the caller's context) and into
 * element i of the lease's arrays (in the step's); returns its payload's
 * size.  Notes the commit position of its inserting transaction when the
 * asynchronous commits are not settled (see make_durable).
 */
static int64
claim_copy_event(ObxEvent *ev, HeapTuple tup, TupleDesc desc,
				 MemoryContext caller, ClaimLease *lease, int i, ClaimWal *wal)
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
	copy_payload(ev, tup, desc, 5);
	ev->event_type = copy_value(tup, desc, 6);
	ev->attempts = DatumGetInt32(SPI_getbinval(tup, desc, 7, &isnull)) + 1;
	copy_headers(ev, tup, desc, 8);
	ev->occurred_at = DatumGetTimestampTz(SPI_getbinval(tup, desc, 10, &isnull));
	ev->outcome = OBX_OUTCOME_UNSENT;
	MemoryContextSwitchTo(step_cxt);

	lease->ids[i] = UUIDPGetDatum(&ev->id);
	lease->topics[i] = CStringGetTextDatum(ev->topic);
	lease->keys[i] = CStringGetTextDatum(ev->key);

	/* A backlog comes from few transactions: look each one up once. */
	xmin = DatumGetTransactionId(SPI_getbinval(tup, desc, 9, &isnull));
	if (!wal->settled && xmin != wal->last_xmin)
	{
		XLogRecPtr commit_lsn = TransactionIdGetCommitLSN(xmin);

		if (commit_lsn > wal->flush_upto)
			wal->flush_upto = commit_lsn;
		wal->last_xmin = xmin;
	}
	return ev->payload_len;
}

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
	sync_wait_interrupted = false;
	pqsignal(SIGINT, interrupt_sync_wait);
	pqsignal(SIGTERM, interrupt_sync_wait);
	/* A shutdown or cancel that came before the handlers counts too. */
	if (ShutdownRequestPending || QueryCancelPending)
		sync_wait_interrupted = true;
	else
		SyncRepWaitForLSN(upto, true);
	/*
	 * Back to the handlers the worker had: a database worker's cancel
	 * (bgworker.c) and the base's shutdown (obx_worker_start).  They are
	 * named, not saved, since 18's pqsignal no longer returns the old one.
	 */
	pqsignal(SIGINT, StatementCancelHandler);
	pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
	/* The cancel was ours; SyncRepWaitForLSN consumed it, or it came too late. */
	if (sync_wait_interrupted)
		QueryCancelPending = false;
	CHECK_FOR_INTERRUPTS();
	return !sync_wait_interrupted;
}

/*
 * release_claim
 *		End the lease of a claimed batch without publishing any of it.
 */
static void
release_claim(ObxBatch *batch)
{
	obx_outbox_release(batch);
	ereport(LOG,
			(errmsg_plural("obx relay stopped waiting for the synchronous standby and released %d claimed event unpublished",
						   "obx relay stopped waiting for the synchronous standby and released %d claimed events unpublished",
						   batch->nevents, batch->nevents),
			 errdetail("Events are published only once the synchronous standby has them; they are claimed again.")));
	batch->nevents = 0;
	obx_note_change();
}

/* Draw the lease id and take the claim lock, held until the step commits. */
static int64
claim_start(void)
{
	Datum args[2] = {Int32GetDatum(OBX_CLAIM_LOCK_CLASS),
					 Int32GetDatum(OBX_CLAIM_LOCK_OBJECT)};
	bool isnull;
	int rc;

	rc = SPI_execute_plan(claim_start_plan, args, NULL, false, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "obx could not draw a lease id and take the claim lock: %s",
			 SPI_result_code_string(rc));
	return DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
									   SPI_tuptable->tupdesc, 1, &isnull));
}

/*
 * Delete the expired leases, at most every OBX_EXPIRE_INTERVAL_MS: a
 * statement of its own, since the claim's snapshot must see its effect.
 * Returns whether any lease went.
 */
static bool
expire_leases(void)
{
	bool expired;
	int rc;

	if (GetCurrentTimestamp() < next_expire)
		return false;
	rc = SPI_execute_plan(expire_plan, NULL, NULL, false, 0);
	if (rc != SPI_OK_DELETE)
		elog(ERROR, "obx could not remove expired leases: %s",
			 SPI_result_code_string(rc));
	expired = SPI_processed > 0;
	next_expire = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
											  OBX_EXPIRE_INTERVAL_MS);
	return expired;
}

/*
 * Run the claim under a snapshot of its own, leaving its rows in
 * SPI_tuptable.  Returns the count of changes, read before the snapshot is
 * taken; the WAL positions and the asynchronous commits are read after it.
 */
static uint64
claim_select(ClaimWal *wal)
{
	Datum args[2];
	uint64 changes;
	Snapshot snapshot;
	int rc;

	args[0] = BoolGetDatum(obx_quarantine_blocks_key);
	args[1] = Int32GetDatum(obx_batch_size);
	wal->flush_upto = InvalidXLogRecPtr;
	wal->last_xmin = InvalidTransactionId;

	changes = obx_changes();
	snapshot = RegisterSnapshot(GetTransactionSnapshot());
	wal->visible_upto = GetXLogInsertRecPtr();
	wal->settled = obx_async_commits_settled(&wal->flush_upto);
	rc = SPI_execute_snapshot(claim_plan, args, NULL, snapshot, InvalidSnapshot,
							  true, false, 0);
	UnregisterSnapshot(snapshot);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "obx claim failed: %s", SPI_result_code_string(rc));
	return changes;
}

/*
 * Take the claim's rows into batch (allocated in the caller's context), in
 * seq order, until their payloads pass OBX_BATCH_BYTES, and fill the
 * lease's arrays.  The claim returns each payload as stored (a TOAST
 * pointer when it is large) and only the rows taken are read and turned
 * into text, so what the worker holds is bounded by the cap plus one
 * payload, not by obx.batch_size times the payload size.
 */
static void
take_batch(ObxBatch *batch, int64 lease_id, MemoryContext caller,
		   ClaimLease *lease, ClaimWal *wal)
{
	uint64 nrows = SPI_processed;
	uint64 n = 0;
	int64 bytes = 0;

	lease->ids = palloc(sizeof(Datum) * Max(nrows, 1));
	lease->topics = palloc(sizeof(Datum) * Max(nrows, 1));
	lease->keys = palloc(sizeof(Datum) * Max(nrows, 1));
	batch->lease_id = lease_id;
	batch->in_flight = 0;
	batch->retry_at = 0;
	batch->events = nrows > 0 ? MemoryContextAllocZero(caller, sizeof(ObxEvent) * nrows)
							  : NULL;
	while (n < nrows && bytes < OBX_BATCH_BYTES)
	{
		bytes += claim_copy_event(&batch->events[n], SPI_tuptable->vals[n],
								  SPI_tuptable->tupdesc, caller, lease, (int) n,
								  wal);
		n++;
	}
	batch->nevents = (int) n;
	batch->full = nrows >= (uint64) obx_batch_size || n < nrows;
}

/* Insert the lease of the n events taken, for this worker. */
static void
insert_lease(int64 lease_id, int worker, ClaimLease *lease, int n)
{
	Datum args[6];
	int rc;

	args[0] = Int64GetDatum(lease_id);
	args[1] = Int32GetDatum(worker);
	args[2] = Float8GetDatum((double) obx_lease_timeout_s);
	args[3] = PointerGetDatum(construct_array(lease->ids, n, UUIDOID, UUID_LEN,
											  false, TYPALIGN_CHAR));
	args[4] = PointerGetDatum(construct_array(lease->topics, n, TEXTOID, -1,
											  false, TYPALIGN_INT));
	args[5] = PointerGetDatum(construct_array(lease->keys, n, TEXTOID, -1,
											  false, TYPALIGN_INT));
	rc = SPI_execute_plan(lease_plan, args, NULL, false, 0);
	if (rc != SPI_OK_INSERT)
		elog(ERROR, "obx could not lease a batch: %s", SPI_result_code_string(rc));
}

/*
 * make_durable
 *		After the claim committed: flush the WAL past the commits of the
 *		events it took, and with synchronous standbys wait until they have
 *		it too.  False when that wait was cut short; the claim is then
 *		released, and nothing of it may be produced.
 *
 * A synchronous commit is flushed before it is visible; an asynchronous one
 * is not.  When no asynchronous commit of obx's functions was under way
 * once the snapshot was taken, every one the claim can see ends at or
 * before the position obx_async_commits_settled reported; otherwise the
 * commit log's position of each event's inserting transaction was taken
 * (claim_copy_event).  With synchronous standbys the wait goes up to the WAL
 * insert position read after the snapshot, which covers every event seen.
 * The claim's own commit is asynchronous: losing it means a re-send with
 * the same ids.  docs/internals.md has the whole argument.
 */
static bool
make_durable(ObxBatch *batch, const ClaimWal *wal)
{
	if (SyncRepStandbyNames != NULL && SyncRepStandbyNames[0] != '\0')
	{
		XLogFlush(wal->visible_upto);
		if (!wait_for_sync_standby(wal->visible_upto))
		{
			release_claim(batch);
			return false;
		}
	}
	else if (wal->flush_upto > obx_flush_rec_ptr())
		XLogFlush(wal->flush_upto);
	return true;
}

/*
 * obx_outbox_claim
 *		Lease up to obx.batch_size publishable events to this worker, fewer
 *		when their payloads pass OBX_BATCH_BYTES.
 *
 * Fills batch (allocated in the caller's memory context) in seq order and
 * returns whether anything was claimed.  The claim is committed, and the
 * WAL flushed past the claimed events' commits, before this returns.
 * Unless force, a claim that comes right after one that took everything
 * it could, with no change since, claims nothing (obx_claim_pointless).
 */
bool
obx_outbox_claim(ObxBatch *batch, int worker, bool force)
{
	MemoryContext caller = obx_step_begin("obx: claiming events");
	int64 lease_id;
	bool expired;
	uint64 changes;
	ClaimWal wal;
	ClaimLease lease;

	claim_prepare_plans();
	/* Its own commit need not be durable (see make_durable). */
	(void) set_config_option("synchronous_commit", "off", PGC_SUSET,
							 PGC_S_SESSION, GUC_ACTION_LOCAL, true, 0, false);
	lease_id = claim_start();

	/* The claim this one waited for may have taken everything. */
	if (!force && obx_claim_pointless())
	{
		obx_step_end(caller);
		batch->nevents = 0;
		batch->full = false;
		return false;
	}

	expired = expire_leases();
	changes = claim_select(&wal);
	take_batch(batch, lease_id, caller, &lease, &wal);
	if (batch->nevents > 0)
		insert_lease(lease_id, worker, &lease, batch->nevents);

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
	return make_durable(batch, &wal);
}
