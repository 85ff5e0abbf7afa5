/*-------------------------------------------------------------------------
 *
 * housekeeping.c
 *	  The purges both kinds of worker run: the outbox's rotation, which
 *	  truncates generations of published events older than obx.retention
 *	  (obx._rotate, obx--1.1--1.2.sql), dedupe rows of obx.processed_events
 *	  older than obx.processed_retention, and dead letters older than
 *	  obx.dead_letter_retention.
 *
 * Worker 0 of the relay, or of the consumer in a database no relay
 * serves, purges every OBX_PURGE_INTERVAL_MS (obx_housekeeping), and again
 * at once while a call still did something.  Each call is one short
 * transaction: one step of the rotation, and at most OBX_PURGE_BATCH rows
 * of each other table, so a large backlog of old rows goes in many small
 * steps.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "obx.h"
#include "launcher.h"
#include "worker.h"
#include "housekeeping.h"
#include "protocol.h"

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
	rc = SPI_execute_with_args(OBX_SQL_PURGE_DEAD_LETTERS, 2, types, args, NULL, false, 1);
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
 * One step of the outbox's rotation (obx._rotate): mark a generation
 * published, truncate one past obx.retention, or start a new one.
 * Returns 1 when it did one of those, so that the next step comes at once.
 */
static int64
rotate_outbox(void)
{
	Oid types[1] = {FLOAT8OID};
	Datum args[1];
	bool isnull;
	Datum done;
	int rc;

	args[0] = Float8GetDatum((double) obx_retention_s);
	rc = SPI_execute_with_args(OBX_SQL_ROTATE, 1, types, args, NULL, false, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "obx outbox rotation failed: %s", SPI_result_code_string(rc));
	done = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	if (isnull)
		return 0;
	ereport(DEBUG1, (errmsg("obx outbox: %s", TextDatumGetCString(done))));
	return 1;
}

/*
 * obx_outbox_purge
 *		Take one step of the outbox's rotation (obx._rotate), delete up to
 *		OBX_PURGE_BATCH dedupe rows older than obx.processed_retention and
 *		as many dead letters older than obx.dead_letter_retention; returns
 *		how many rows went (a rotation step counts one).
 */
int64
obx_outbox_purge(void)
{
	MemoryContext caller;
	int64 purged = 0;

	caller = obx_step_begin("obx: purging old rows");
	/* At every retention: the rotation also sums the counts of published events. */
	purged += rotate_outbox();
	if (obx_processed_retention_s > 0)
		purged += purge_older_than(OBX_SQL_PURGE_DEDUPE, obx_processed_retention_s, "dedupe");
	if (obx_dead_letter_retention_s > 0)
		purged += purge_dead_letters();
	obx_step_end(caller);
	return purged;
}

/*
 * obx_housekeeping
 *		Purge old rows (obx_outbox_purge) every OBX_PURGE_INTERVAL_MS, and
 *		again at once while a purge finds something, if this worker purges.
 */
void
obx_housekeeping(ObxWorker *w)
{
	int64 purged;

	if (!w->purges || GetCurrentTimestamp() < w->next_purge)
		return;
	/* a consumer purges only where no relay does */
	if (w->kind == OBX_WORKER_CONSUMER && obx_relay_dbslot(MyDatabaseId) >= 0)
	{
		w->next_purge = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
													OBX_PURGE_INTERVAL_MS);
		return;
	}
	purged = obx_outbox_purge();
	w->next_purge = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
												purged > 0 ? 0 : OBX_PURGE_INTERVAL_MS);
}
