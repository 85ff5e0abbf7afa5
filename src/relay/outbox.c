/*-------------------------------------------------------------------------
 *
 * outbox.c
 *	  The relay's statements on the batches it claimed: recording what Kafka
 *	  said about a batch (published, or failed: backing off, quarantined),
 *	  renewing and releasing its lease, releasing the leases of a dead
 *	  predecessor, keeping the outbox's planner statistics fresh, checking
 *	  that no logical subscription writes into obx's tables; and the
 *	  claim lock that claims and these steps share.  The
 *	  claim is in claim.c, the purges in housekeeping.c.
 *
 * Each exported function but obx_claim_lock (a statement of the caller's
 * step) is one short transaction of its own, started and committed here;
 * none is ever open while the worker waits on Kafka.
 * Statements are prepared once per worker and kept (SPI_keepplan).
 *
 * Nothing is written into an event (docs/internals.md, "The outbox log").
 * A batch's record is one row appended to obx.records: the events Kafka
 * acknowledged, where and when; it also ends the batch's lease, whatever
 * it holds.  Only a failed event is written, into obx.event_states (a copy
 * of it the first time), and only while the batch's lease is still live:
 * a worker whose lease ran out, and whose events another claim may have
 * taken, must not undo that claim.  That check and the renewal take the
 * claim lock, so that a claim and they agree on whether a lease is live.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "pgstat.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "obx.h"
#include "latency.h"
#include "turns.h"
#include "worker.h"
#include "outbox.h"
#include "protocol.h"

/* Failed events of one batch logged one by one; the rest are counted. */
#define OBX_LOGGED_FAILURES 10

static SPIPlanPtr record_plan = NULL;
static SPIPlanPtr held_published_plan = NULL;
static SPIPlanPtr hold_plan = NULL;
static SPIPlanPtr failed_plan = NULL;
static SPIPlanPtr live_plan = NULL;
static SPIPlanPtr renew_plan = NULL;
static SPIPlanPtr claim_lock_plan = NULL;

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
 * The record's statements keep PostgreSQL's choice of plan: the update of
 * held events, for one, is planned from the number of events it marks.
 */
static void
record_prepare_plans(void)
{
	Oid record_types[8] = {UUIDARRAYOID, INT4ARRAYOID, INT8ARRAYOID,
						   TIMESTAMPTZARRAYOID, INT8OID, INT8OID, INT8OID, TEXTARRAYOID};
	Oid held_types[2] = {UUIDARRAYOID, TIMESTAMPTZARRAYOID};
	Oid hold_types[1] = {UUIDARRAYOID};
	Oid failed_types[7] = {UUIDARRAYOID, INT4OID, FLOAT8OID, FLOAT8OID,
						   TEXTARRAYOID, TEXTARRAYOID, BOOLARRAYOID};
	Oid lease_types[1] = {INT8OID};
	Oid renew_types[2] = {INT8OID, FLOAT8OID};

	if (renew_plan != NULL)
		return;
	record_plan = obx_prepare_kept_generic(OBX_SQL_RECORD, 8, record_types);
	held_published_plan = obx_prepare_kept(OBX_SQL_HELD_PUBLISHED, 2, held_types);
	hold_plan = obx_prepare_kept(OBX_SQL_HOLD, 1, hold_types);
	failed_plan = obx_prepare_kept(OBX_SQL_FAILED, 7, failed_types);
	live_plan = obx_prepare_kept(OBX_SQL_LIVE, 1, lease_types);
	renew_plan = obx_prepare_kept_generic(OBX_SQL_RENEW, 2, renew_types);
}

/*
 * obx_claim_lock
 *		Take the claim lock, held until the current step commits: claims
 *		(claim.c), and the steps here that must agree with them on whether
 *		a lease is live, run one at a time.
 */
void
obx_claim_lock(void)
{
	Oid types[2] = {INT4OID, INT4OID};
	Datum args[2] = {Int32GetDatum(OBX_CLAIM_LOCK_CLASS),
					 Int32GetDatum(OBX_CLAIM_LOCK_OBJECT)};
	int rc;

	if (claim_lock_plan == NULL)
		claim_lock_plan = obx_prepare_kept_generic(OBX_SQL_CLAIM_LOCK, 2, types);
	rc = SPI_execute_plan(claim_lock_plan, args, NULL, false, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "obx could not take the claim lock: %s", SPI_result_code_string(rc));
}

/*
 * Take the claim lock, then say whether the batch's lease is still live:
 * a claim that starts later sees the same (its now() is no later than
 * this check's clock).
 */
static bool
lease_live(int64 lease_id)
{
	Datum lease_arg[1] = {Int64GetDatum(lease_id)};
	int rc;

	obx_claim_lock();
	rc = SPI_execute_plan(live_plan, lease_arg, NULL, false, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "obx could not check a lease: %s", SPI_result_code_string(rc));
	return SPI_processed == 1;
}

/*
 * Append the batch's record: the n events delivered (none for a release).
 * Each goes into latencies (allocated in the memory context keep, which
 * outlives the step), to be counted once the step has committed.  Those
 * with a state in obx.event_states are marked published there.
 */
static void
record_delivered(ObxBatch *batch, ObxEvent **events, int n,
				 ObxLatencySample *latencies, MemoryContext keep)
{
	Datum *parts = palloc(sizeof(Datum) * Max(n, 1));
	Datum *offsets = palloc(sizeof(Datum) * Max(n, 1));
	Datum *acked = palloc(sizeof(Datum) * Max(n, 1));
	Datum *topics = palloc(sizeof(Datum) * Max(n, 1));
	Datum args[8];
	int i;
	int rc;

	for (i = 0; i < n; i++)
	{
		parts[i] = Int32GetDatum(events[i]->partition);
		offsets[i] = Int64GetDatum(events[i]->offset);
		acked[i] = TimestampTzGetDatum(events[i]->acked_at);
		topics[i] = CStringGetTextDatum(events[i]->topic);
		latencies[i].topic = MemoryContextStrdup(keep, events[i]->topic);
		latencies[i].latency_us = events[i]->acked_at - events[i]->occurred_at;
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
	args[4] = Int64GetDatum(batch->lease_id);
	args[5] = Int64GetDatum(batch->max_seq);
	args[6] = Int64GetDatum(batch->min_seq);
	args[7] = PointerGetDatum(construct_array(topics, n, TEXTOID, -1, false, TYPALIGN_INT));
	rc = SPI_execute_plan(record_plan, args, NULL, false, 0);
	if (rc != SPI_OK_INSERT)
		elog(ERROR, "obx could not record a batch: %s", SPI_result_code_string(rc));
	if (n > 0)
	{
		Datum held_args[2] = {args[0], args[3]};

		rc = SPI_execute_plan(held_published_plan, held_args, NULL, false, 0);
		if (rc != SPI_OK_UPDATE)
			elog(ERROR, "obx could not mark held events published: %s",
				 SPI_result_code_string(rc));
	}
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
	rc = SPI_execute_plan(hold_plan, args, NULL, false, 0);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "obx could not hold failed events: %s", SPI_result_code_string(rc));
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
 * Delivered events go into the batch's record, which also ends its lease;
 * failed ones get their error, a backoff or quarantine in
 * obx.event_states, but only while the batch's lease is still live
 * (otherwise another worker may have them already); events never handed
 * to Kafka (or still in flight when the worker gives up on them) need no
 * write: ending the lease releases them for the next claim.  Returns how
 * many events were delivered.
 */
int
obx_outbox_record(ObxBatch *batch)
{
	MemoryContext caller;
	ObxEvent **delivered;
	ObxEvent **failed;
	ObxLatencySample *latencies;
	int ndelivered = 0;
	int nfailed = 0;
	int i;

	if (batch->nevents == 0)
		return 0;

	delivered = palloc(sizeof(ObxEvent *) * batch->nevents);
	failed = palloc(sizeof(ObxEvent *) * batch->nevents);
	latencies = palloc(sizeof(ObxLatencySample) * batch->nevents);
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
	 * (at least once).  Only the claim must be durable (see make_durable in claim.c).
	 */
	(void) set_config_option("synchronous_commit", "off", PGC_SUSET,
							 PGC_S_SESSION, GUC_ACTION_LOCAL, true, 0, false);
	record_prepare_plans();

	/* Failures first: the record ends the lease they are written under. */
	if (nfailed > 0)
	{
		if (lease_live(batch->lease_id))
			record_failed(batch, failed, nfailed);
		else
			ereport(LOG,
					(errmsg("obx relay lost the lease of %d failed events before recording them",
							nfailed),
					 errdetail("Another worker has taken them over.")));
	}
	record_delivered(batch, delivered, ndelivered, latencies, caller);
	obx_step_end(caller);
	obx_latency_add(latencies, ndelivered);
	return ndelivered;
}

/*
 * obx_outbox_release
 *		End the lease of a batch without recording anything, in a short
 *		transaction of its own: its events go to the next claim as they are.
 */
void
obx_outbox_release(ObxBatch *batch)
{
	MemoryContext caller = obx_step_begin("obx: releasing a claim");

	(void) set_config_option("synchronous_commit", "off", PGC_SUSET,
							 PGC_S_SESSION, GUC_ACTION_LOCAL, true, 0, false);
	record_prepare_plans();
	record_delivered(batch, NULL, 0, NULL, caller);
	obx_step_end(caller);
}

/*
 * obx_outbox_release_orphans
 *		Release the leases held under this worker number.
 *
 * Called when a worker starts: only one process at a time runs a given
 * worker number, so any lease still recorded under it belongs to a
 * predecessor that died (crash, kill, error exit).  Its events are re-sent
 * at once, with the same ids, instead of after obx.lease_timeout.  Each
 * release is a record that names no event; its seq range is one point, so
 * that looking an event up (obx.outbox_events) passes it by.
 */
int64
obx_outbox_release_orphans(int worker)
{
	MemoryContext caller = obx_step_begin("obx: releasing orphaned leases");
	Oid types[1] = {INT4OID};
	Datum args[1] = {Int32GetDatum(worker)};
	int rc;
	int64 released;

	rc = SPI_execute_with_args("WITH orphans AS MATERIALIZED ("
							   "  SELECT l.lease_id, l.max_seq, pg_catalog.cardinality(l.ids) AS n"
							   "    FROM obx._tick() t, obx._live_leases(t.floor, t.tick) l"
							   "   WHERE l.owner = $1),"
							   " gone AS ("
							   "  INSERT INTO obx.records (lease_id, max_seq, min_seq, ids, partitions,"
							   "                           offsets, published_at)"
							   "  SELECT o.lease_id, o.max_seq, o.max_seq, '{}', '{}', '{}', '{}'"
							   "    FROM orphans o)"
							   " SELECT coalesce(pg_catalog.sum(n), 0)::pg_catalog.int8 FROM orphans",
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
 *		ran out (and another claim may have taken them).
 */
int
obx_outbox_renew(ObxBatch *batch)
{
	MemoryContext caller = obx_step_begin("obx: renewing lease");
	Datum args[2];
	int rc;
	int held;

	record_prepare_plans();
	held = 0;
	if (lease_live(batch->lease_id))
	{
		args[0] = Int64GetDatum(batch->lease_id);
		args[1] = Float8GetDatum((double) obx_lease_timeout_s);
		rc = SPI_execute_plan(renew_plan, args, NULL, false, 0);
		if (rc != SPI_OK_INSERT)
			elog(ERROR, "obx could not renew a lease: %s", SPI_result_code_string(rc));
		held = batch->nevents;
	}
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
	rc = SPI_execute("SELECT pg_catalog.bool_or(pg_catalog.pg_stat_get_mod_since_analyze(c.oid)"
					 "       > greatest(c.reltuples, 0) / 10 + 1000)"
					 "  FROM pg_catalog.pg_inherits i"
					 "  JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid"
					 " WHERE i.inhparent = 'obx.events'::pg_catalog.regclass",
					 true, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "obx could not read the outbox's statistics: %s",
			 SPI_result_code_string(rc));
	stale = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0],
									   SPI_tuptable->tupdesc, 1, &isnull));
	if (stale)
	{
		rc = SPI_execute("SELECT obx._analyze_events()", false, 0);
		if (rc != SPI_OK_SELECT)
			elog(ERROR, "obx could not analyze the outbox: %s", SPI_result_code_string(rc));
	}
	obx_step_end(caller);
}
