/*-------------------------------------------------------------------------
 *
 * claim.c
 *	  The claim: leasing a batch of publishable events of obx.events
 *	  to a relay worker, in one short transaction, and making sure what it
 *	  took is durable before anything of it is produced.
 *
 * The claim is where per-key order is decided.  A key is blocked while a
 * live lease holds one of its events, or while one of its events is backing
 * off, or quarantined (when obx.quarantine_blocks_key is on); an event is
 * claimable when it is unpublished, not quarantined, due, and its key is
 * not blocked.  Claims are serialized by a transaction-level advisory lock,
 * so a claim always sees the leases of the claims before it, and a claim
 * takes the earliest claimable events in seq order, up to obx.batch_size
 * of them or until their payloads pass OBX_BATCH_BYTES.  Together this
 * means the events of a key a worker holds are always a prefix of that
 * key's unpublished events, and no two workers ever hold events of the
 * same key.
 *
 * Nothing is written into an event: the outbox is a log (docs/internals.md,
 * "The outbox log").  A claim appends one row to obx.claims: its lease (the
 * events' ids, topics and keys, until when) and its tick: its snapshot and
 * its floor, the lowest seq it found unpublished.  The next claim reads the
 * unpublished events from that tick (obx._unpublished): from the floor on,
 * in seq order, plus the events of transactions the snapshot did not see
 * (late committers, whatever their seq); or, from this worker's own
 * complete tick with its batches all delivered, only what that tick did
 * not see (OBX_SQL_CLAIM_SINCE, docs/internals.md says why that is all
 * there is).  A lease ends when its record is appended (outbox.c) or when
 * it runs out: an expired lease is simply no longer live for the next
 * claim.  The lease id is drawn under the claim lock, so claims after a
 * tick have higher ids than the tick's; that is how the claim bounds the
 * records and leases it reads.
 *
 * The claim's plan is generic (planning it costs more than running it),
 * built with enable_seqscan off: whatever the tick's values, each part
 * must walk its index (seq from the floor, xid from the
 * horizon), never the table, whose retained events it does not need.
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
#include "utils/datum.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "obx.h"
#include "compat.h"
#include "log_repeat.h"
#include "status.h"
#include "turns.h"
#include "worker.h"
#include "outbox.h"
#include "protocol.h"

/* A floor past every seq: every event the tick's snapshot saw is published. */
#define OBX_FLOOR_NONE PG_INT64_MAX

static SPIPlanPtr tick_plan = NULL;
static SPIPlanPtr claim_plan = NULL;
static SPIPlanPtr since_plan = NULL;
static SPIPlanPtr lease_plan = NULL;

/*
 * The lease id of this worker's latest claim row if that claim was
 * complete (it held back no event it saw: OBX_SQL_CLAIM_SINCE), else 0.
 * Forgotten when a batch of this worker's comes back with an event not
 * delivered (obx_claim_forget): that event may not be done.
 */
static int64 complete_tick = 0;

/* The tick a claim starts from, and the one it leaves. */
typedef struct ClaimTick
{
	Datum floor;
	Datum snap; /* pg_snapshot, in the step's memory */
	Datum tick;
} ClaimTick;

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
	bool held; /* an event of the batch came from obx.event_states */
} ClaimLease;

/* Set when a wait for the synchronous standby was interrupted. */
static volatile sig_atomic_t sync_wait_interrupted = false;

/* The claim is planned for its tick (see above), the rest for any parameters. */
static void
claim_prepare_plans(void)
{
	Oid claim_types[6] = {BOOLOID, INT4OID, INT8OID, PG_SNAPSHOTOID, INT8OID, INT8OID};
	Oid lease_types[10] = {INT8OID, INT4OID, FLOAT8OID, PG_SNAPSHOTOID, INT8OID,
						   INT8OID, UUIDARRAYOID, TEXTARRAYOID, TEXTARRAYOID, BOOLOID};

	if (claim_plan != NULL)
		return;
	tick_plan = obx_prepare_kept_generic(OBX_SQL_TICK, 0, NULL);
	claim_plan = obx_prepare_kept_generic(OBX_SQL_CLAIM, 6, claim_types);
	since_plan = obx_prepare_kept_generic(OBX_SQL_CLAIM_SINCE, 6, claim_types);
	lease_plan = obx_prepare_kept_generic(OBX_SQL_LEASE, 10, lease_types);
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
	Datum xid;

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

	/*
	 * A backlog comes from few transactions: look each one up once.  A
	 * held event was published or failed before, so its commit is durable.
	 */
	xid = SPI_getbinval(tup, desc, 9, &isnull);
	if (!wal->settled && !isnull)
	{
		/* The low 32 bits of the 64-bit id (obx.events.xid). */
		TransactionId xmin = (TransactionId) (uint64) DatumGetInt64(xid);

		if (xmin != wal->last_xmin)
		{
			XLogRecPtr commit_lsn = TransactionIdGetCommitLSN(xmin);

			if (commit_lsn > wal->flush_upto)
				wal->flush_upto = commit_lsn;
			wal->last_xmin = xmin;
		}
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
	obx_claim_forget();
	obx_note_change();
}

/*
 * Take the claim lock, then read the tick the claim starts from into tick
 * (copied into the step's memory) and draw the lease id, which it returns.
 */
static int64
claim_start(ClaimTick *tick)
{
	HeapTuple tup;
	TupleDesc desc;
	bool isnull;
	int rc;

	obx_claim_lock();
	rc = SPI_execute_plan(tick_plan, NULL, NULL, false, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "obx could not read the latest tick: %s", SPI_result_code_string(rc));
	tup = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	tick->floor = SPI_getbinval(tup, desc, 1, &isnull);
	tick->snap = datumCopy(SPI_getbinval(tup, desc, 2, &isnull), false, -1);
	tick->tick = SPI_getbinval(tup, desc, 3, &isnull);
	return DatumGetInt64(SPI_getbinval(tup, desc, 4, &isnull));
}

/*
 * Whether obx.lease_seq is behind the latest claim (protocol.h's
 * OBX_SQL_TICK): the claim then takes nothing, and says why in obx.workers
 * and, once a minute at most, in the log.
 */
static bool
lease_seq_behind(int worker, int64 lease_id, int64 latest)
{
	int64 suppressed;
	char *why;

	if (lease_id > latest)
		return false;
	why = psprintf(OBX_LEASE_SEQ_BEHIND, (long long) lease_id, (long long) latest);
	if (obx_log_allowed("claim: lease_seq behind", &suppressed))
		ereport(WARNING,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("obx relay %d claims nothing: %s", worker, why),
				 errhint(OBX_LEASE_SEQ_BEHIND_HINT)));
	obx_status_error(worker, why);
	return true;
}

/*
 * Run the claim under a snapshot of its own, leaving the events it found
 * in SPI_tuptable (SPI_processed counts them: the row after them, the
 * last, carries the new tick), and that tick (floor, snapshot) in next,
 * with whether it held nothing back in *complete.  Since a complete tick,
 * it reads only what that tick did not see (OBX_SQL_CLAIM_SINCE).
 * Returns the count of changes, read before the snapshot is taken; the WAL
 * positions and the asynchronous commits are read after it.
 */
static uint64
claim_select(const ClaimTick *from, bool since, ClaimTick *next, bool *complete,
			 ClaimWal *wal)
{
	Datum args[6];
	uint64 changes;
	Snapshot snapshot;
	HeapTuple last;
	TupleDesc desc;
	bool isnull;
	int rc;

	args[0] = BoolGetDatum(obx_quarantine_blocks_key);
	args[1] = Int32GetDatum(obx_batch_size);
	args[2] = from->floor;
	args[3] = from->snap;
	args[4] = from->tick;
	args[5] = Int64GetDatum(OBX_FLOOR_NONE);
	wal->flush_upto = InvalidXLogRecPtr;
	wal->last_xmin = InvalidTransactionId;

	changes = obx_changes();
	snapshot = RegisterSnapshot(GetTransactionSnapshot());
	wal->visible_upto = GetXLogInsertRecPtr();
	wal->settled = obx_async_commits_settled(&wal->flush_upto);
	rc = SPI_execute_snapshot(since ? since_plan : claim_plan, args, NULL, snapshot,
							  InvalidSnapshot, true, false, 0);
	if (rc != SPI_OK_SELECT || SPI_processed < 1)
		elog(ERROR, "obx claim failed: %s", SPI_result_code_string(rc));
	UnregisterSnapshot(snapshot);

	last = SPI_tuptable->vals[SPI_processed - 1];
	desc = SPI_tuptable->tupdesc;
	(void) SPI_getbinval(last, desc, 1, &isnull);
	if (!isnull)
		elog(ERROR, "obx claim gave no tick row");
	next->floor = SPI_getbinval(last, desc, OBX_CLAIM_FLOOR_COL, &isnull);
	next->snap = datumCopy(SPI_getbinval(last, desc, OBX_CLAIM_SNAP_COL, &isnull), false, -1);
	*complete = DatumGetBool(SPI_getbinval(last, desc, OBX_CLAIM_COMPLETE_COL, &isnull));
	SPI_processed--;
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
	lease->held = false;
	batch->lease_id = lease_id;
	batch->max_seq = 0;
	batch->min_seq = 0;
	batch->in_flight = 0;
	batch->retry_at = 0;
	batch->events = nrows > 0 ? MemoryContextAllocZero(caller, sizeof(ObxEvent) * nrows)
							  : NULL;
	while (n < nrows && bytes < OBX_BATCH_BYTES)
	{
		bool isnull;

		bytes += claim_copy_event(&batch->events[n], SPI_tuptable->vals[n],
								  SPI_tuptable->tupdesc, caller, lease, (int) n,
								  wal);
		/* Rows come in seq order. */
		batch->max_seq = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[n],
													 SPI_tuptable->tupdesc, 1, &isnull));
		if (n == 0)
			batch->min_seq = batch->max_seq;
		if (DatumGetBool(SPI_getbinval(SPI_tuptable->vals[n], SPI_tuptable->tupdesc,
									   OBX_CLAIM_HELD_COL, &isnull)))
			lease->held = true;
		n++;
	}
	batch->nevents = (int) n;
	batch->full = nrows >= (uint64) obx_batch_size || n < nrows;
}

/*
 * Append the claim's row: the lease of the n events taken, for this
 * worker (none when n is 0: a tick alone), and the tick it leaves.
 */
static void
insert_claim(ObxBatch *batch, int worker, ClaimLease *lease, int n, const ClaimTick *tick)
{
	Datum args[10];
	char nulls[10] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};
	int rc;

	args[0] = Int64GetDatum(batch->lease_id);
	args[1] = Int32GetDatum(worker);
	args[2] = Float8GetDatum(n > 0 ? (double) obx_lease_timeout_s : 0.0);
	args[3] = tick->snap;
	args[4] = tick->floor;
	args[5] = Int64GetDatum(batch->max_seq);
	args[9] = BoolGetDatum(lease->held);
	if (n > 0)
	{
		args[6] = PointerGetDatum(construct_array(lease->ids, n, UUIDOID, UUID_LEN,
												  false, TYPALIGN_CHAR));
		args[7] = PointerGetDatum(construct_array(lease->topics, n, TEXTOID, -1,
												  false, TYPALIGN_INT));
		args[8] = PointerGetDatum(construct_array(lease->keys, n, TEXTOID, -1,
												  false, TYPALIGN_INT));
	}
	else
		nulls[5] = nulls[6] = nulls[7] = nulls[8] = 'n';
	rc = SPI_execute_plan(lease_plan, args, nulls, false, 0);
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
 * obx_claim_forget
 *		A batch of this worker's came back with an event not delivered
 *		(failed, not sent, or released): the next claim reads from the
 *		floor, not only what its tick did not see.
 */
void
obx_claim_forget(void)
{
	complete_tick = 0;
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
 * With none of the worker's batches in flight (landed: every event of
 * them delivered, else obx_claim_forget), a claim from this worker's own
 * complete tick reads only what that tick did not see.
 */
bool
obx_outbox_claim(ObxBatch *batch, int worker, bool force, bool landed)
{
	MemoryContext caller = obx_step_begin("obx: claiming events");
	int64 lease_id;
	uint64 changes;
	ClaimWal wal;
	ClaimLease lease;
	ClaimTick from;
	ClaimTick next;
	bool since;
	bool complete;

	/* Its own commit need not be durable (see make_durable). */
	(void) set_config_option("synchronous_commit", "off", PGC_SUSET,
							 PGC_S_SESSION, GUC_ACTION_LOCAL, true, 0, false);
	/* For its plans, built (and rebuilt) in this step: see above. */
	(void) set_config_option("enable_seqscan", "off", PGC_SUSET,
							 PGC_S_SESSION, GUC_ACTION_LOCAL, true, 0, false);
	claim_prepare_plans();
	lease_id = claim_start(&from);

	/* The claim this one waited for may have taken everything. */
	if (!force && obx_claim_pointless())
	{
		obx_step_end(caller);
		batch->nevents = 0;
		batch->full = false;
		return false;
	}

	if (lease_seq_behind(worker, lease_id, DatumGetInt64(from.tick)))
	{
		obx_step_end(caller);
		batch->nevents = 0;
		batch->full = false;
		return false;
	}
	since = landed && complete_tick != 0 && DatumGetInt64(from.tick) == complete_tick;
	changes = claim_select(&from, since, &next, &complete, &wal);
	take_batch(batch, lease_id, caller, &lease, &wal);
	/* A claim that took nothing leaves a tick only when its floor moved. */
	if (batch->nevents > 0 || DatumGetInt64(next.floor) != DatumGetInt64(from.floor))
	{
		insert_claim(batch, worker, &lease, batch->nevents, &next);
		complete_tick = (complete && !batch->full) ? lease_id : 0;
	}

	/*
	 * Published before the commit releases the claim lock, so that a claim
	 * waiting for it sees it.  Should the commit fail, the worker exits and
	 * its successor's first claim does not skip.
	 */
	if (!batch->full)
		obx_claimed_changes(changes);
	obx_step_end(caller);
	if (batch->nevents == 0)
		return false;
	return make_durable(batch, &wal);
}
