/*-------------------------------------------------------------------------
 *
 * consumer_sql.c
 *	  SQL-callable functions of the consumer side that must know who calls
 *	  them: obx.subscribe, obx.unsubscribe, obx.mark_processed, and the
 *	  steps of a worker outside the database on the messages obx.land
 *	  landed (obx.claim_landed, obx.start_landed, obx.complete_landed,
 *	  obx.fail_landed).
 *
 * A subscription, and a consumer name's dedupe history, belong to a role
 * (obx.consumer_owners).  Their tables are written only by obx's own
 * SECURITY DEFINER functions, but a SECURITY DEFINER function sees its
 * owner as current_user, not its caller.  So each of these is a plain C
 * function, running as its caller: it calls the SECURITY DEFINER function
 * obx._<name> with the caller's role as first argument, through fmgr
 * (obx_call_inner, call_inner.c), so that no EXECUTE privilege on
 * obx._<name> is needed (and none is granted: nobody can call it with
 * another role).  pg_cron's cron.schedule records its caller in the same
 * spirit.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "fmgr.h"
#include "miscadmin.h"

#include "obx.h"
#include "call_inner.h"

PG_FUNCTION_INFO_V1(obx_subscribe);
PG_FUNCTION_INFO_V1(obx_unsubscribe);
PG_FUNCTION_INFO_V1(obx_mark_processed);
PG_FUNCTION_INFO_V1(obx_claim_landed);
PG_FUNCTION_INFO_V1(obx_start_landed);
PG_FUNCTION_INFO_V1(obx_complete_landed);
PG_FUNCTION_INFO_V1(obx_fail_landed);

/* Call obx.<inner>(the caller's role, the caller's own arguments). */
static Datum
call_with_caller(FunctionCallInfo fcinfo, const char *inner)
{
	return obx_call_inner(fcinfo, inner, OIDOID, ObjectIdGetDatum(GetUserId()));
}

/* obx.subscribe(consumer_name, topics, handler, options) */
Datum
obx_subscribe(PG_FUNCTION_ARGS)
{
	return call_with_caller(fcinfo, "_subscribe");
}

/* obx.unsubscribe(consumer_name) */
Datum
obx_unsubscribe(PG_FUNCTION_ARGS)
{
	return call_with_caller(fcinfo, "_unsubscribe");
}

/* obx.mark_processed(consumer_name, event_id) */
Datum
obx_mark_processed(PG_FUNCTION_ARGS)
{
	return call_with_caller(fcinfo, "_mark_processed");
}

/* obx.claim_landed(consumer_name) */
Datum
obx_claim_landed(PG_FUNCTION_ARGS)
{
	return call_with_caller(fcinfo, "_claim_landed");
}

/* obx.start_landed(consumer_name, landed_id) */
Datum
obx_start_landed(PG_FUNCTION_ARGS)
{
	return call_with_caller(fcinfo, "_start_landed");
}

/* obx.complete_landed(consumer_name, landed_id) */
Datum
obx_complete_landed(PG_FUNCTION_ARGS)
{
	return call_with_caller(fcinfo, "_complete_landed");
}

/* obx.fail_landed(consumer_name, landed_id, error, max_attempts, retry_after) */
Datum
obx_fail_landed(PG_FUNCTION_ARGS)
{
	return call_with_caller(fcinfo, "_fail_landed");
}
