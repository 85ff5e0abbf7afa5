/*-------------------------------------------------------------------------
 *
 * drop_guard.c
 *	  DROP EXTENSION obx deletes the outbox, the dedupe history and the dead
 *	  letters with it.  In a backend that has obx loaded (every backend of
 *	  a server that preloads it), the drop is refused while events wait
 *	  for Kafka or dead letters wait for a replay, unless
 *	  obx.drop_unpublished is on.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "executor/spi.h"
#include "nodes/parsenodes.h"
#include "tcop/utility.h"

#include "obx.h"
#include "drop_guard.h"

static ProcessUtility_hook_type prev_process_utility = NULL;

/* Both counts in one statement, from obx's own views. */
static const char *waiting_sql =
	"SELECT (SELECT pg_catalog.count(*) FROM obx._unpublished_events)"
	"     + (SELECT pg_catalog.count(*) FROM obx.event_states"
	"         WHERE published_at IS NULL AND skipped_at IS NULL),"
	"       (SELECT pg_catalog.count(*) FROM obx.dead_letters WHERE replayed_at IS NULL)";

/* Whether a DROP EXTENSION names obx. */
static bool
drops_obx(Node *stmt)
{
	DropStmt *drop;
	ListCell *lc;

	if (!IsA(stmt, DropStmt))
		return false;
	drop = (DropStmt *) stmt;
	if (drop->removeType != OBJECT_EXTENSION)
		return false;
	foreach (lc, drop->objects)
		if (strcmp(strVal(lfirst(lc)), "obx") == 0)
			return true;
	return false;
}

/*
 * Refuse the drop while something would be lost: events not published
 * (quarantined ones included) and dead letters not replayed.  Only for
 * the schema this library serves and 1.1's, which has the same tables and
 * view (a database between the package's upgrade and ALTER EXTENSION obx
 * UPDATE); 1.0's, or none (DROP EXTENSION IF EXISTS), is left alone.
 */
static void
check_nothing_waits(void)
{
	int64 events;
	int64 letters;
	bool isnull;
	int rc;

	if (obx_drop_unpublished)
		return;
	SPI_connect();
	rc = SPI_execute("SELECT extversion IN ('1.1', '" OBX_SCHEMA_VERSION "') FROM pg_catalog.pg_extension"
					 " WHERE extname = 'obx'",
					 true, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1 ||
		!DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull)))
	{
		SPI_finish();
		return;
	}
	rc = SPI_execute(waiting_sql, true, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "obx could not count what DROP EXTENSION would delete: %s",
			 SPI_result_code_string(rc));
	events = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	letters = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull));
	SPI_finish();
	if (events == 0 && letters == 0)
		return;
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("cannot drop extension obx: " INT64_FORMAT " events are not published and " INT64_FORMAT
					" dead letters are not replayed",
					events, letters),
			 errdetail("DROP EXTENSION obx deletes the outbox, the dedupe history and the dead letters."),
			 errhint("Wait until obx.status shows nothing pending and replay or delete the dead letters, "
					 "or SET obx.drop_unpublished = on to drop them anyway.")));
}

static void
guard_process_utility(PlannedStmt *pstmt, const char *queryString, bool readOnlyTree,
					  ProcessUtilityContext context, ParamListInfo params,
					  QueryEnvironment *queryEnv, DestReceiver *dest, QueryCompletion *qc)
{
	if (drops_obx(pstmt->utilityStmt))
		check_nothing_waits();
	if (prev_process_utility != NULL)
		prev_process_utility(pstmt, queryString, readOnlyTree, context, params, queryEnv,
							 dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context, params, queryEnv,
								dest, qc);
}

/*
 * obx_drop_guard_install
 *		Put the guard in front of every utility statement of this backend;
 *		called once, when the library is loaded.
 */
void
obx_drop_guard_install(void)
{
	prev_process_utility = ProcessUtility_hook;
	ProcessUtility_hook = guard_process_utility;
}
