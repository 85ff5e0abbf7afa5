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
 * obx._<name> with the caller's role as first argument, through fmgr, so
 * that no EXECUTE privilege on obx._<name> is needed (and none is
 * granted: nobody can call it with another role).  pg_cron's
 * cron.schedule records its caller in the same spirit.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "nodes/value.h"
#include "parser/parse_func.h"

#include "obx.h"

PG_FUNCTION_INFO_V1(obx_subscribe);
PG_FUNCTION_INFO_V1(obx_unsubscribe);
PG_FUNCTION_INFO_V1(obx_mark_processed);
PG_FUNCTION_INFO_V1(obx_claim_landed);
PG_FUNCTION_INFO_V1(obx_start_landed);
PG_FUNCTION_INFO_V1(obx_complete_landed);
PG_FUNCTION_INFO_V1(obx_fail_landed);

#define OBX_MAX_INNER_ARGS 8

/*
 * Call obx.<inner>(caller oid, <the caller's own arguments>) and return
 * its result.  The inner function is looked up by schema-qualified name
 * and argument type oids (nothing depends on search_path) once per call
 * site, and kept in fn_extra.
 */
static Datum
call_with_caller(FunctionCallInfo fcinfo, const char *inner, int nargs,
				 const Oid *argtypes)
{
	FmgrInfo *target = (FmgrInfo *) fcinfo->flinfo->fn_extra;
	LOCAL_FCINFO(call, OBX_MAX_INNER_ARGS);
	Datum result;
	int i;

	Assert(nargs + 1 <= OBX_MAX_INNER_ARGS && nargs == PG_NARGS());
	if (target == NULL)
	{
		Oid types[OBX_MAX_INNER_ARGS];
		List *name = list_make2(makeString(pstrdup("obx")),
								makeString(pstrdup(inner)));
		Oid fn;

		types[0] = OIDOID;
		memcpy(&types[1], argtypes, sizeof(Oid) * nargs);
		fn = LookupFuncName(name, nargs + 1, types, false);
		target = MemoryContextAllocZero(fcinfo->flinfo->fn_mcxt, sizeof(FmgrInfo));
		fmgr_info_cxt(fn, target, fcinfo->flinfo->fn_mcxt);
		fcinfo->flinfo->fn_extra = target;
	}

	InitFunctionCallInfoData(*call, target, nargs + 1, fcinfo->fncollation,
							 NULL, NULL);
	call->args[0].value = ObjectIdGetDatum(GetUserId());
	call->args[0].isnull = false;
	for (i = 0; i < nargs; i++)
		call->args[i + 1] = fcinfo->args[i];
	result = FunctionCallInvoke(call);
	fcinfo->isnull = call->isnull;
	return result;
}

/* obx.subscribe(consumer_name, topics, handler, options) */
Datum
obx_subscribe(PG_FUNCTION_ARGS)
{
	Oid types[] = {TEXTOID, TEXTARRAYOID, REGPROCEDUREOID, JSONBOID};

	return call_with_caller(fcinfo, "_subscribe", lengthof(types), types);
}

/* obx.unsubscribe(consumer_name) */
Datum
obx_unsubscribe(PG_FUNCTION_ARGS)
{
	Oid types[] = {TEXTOID};

	return call_with_caller(fcinfo, "_unsubscribe", lengthof(types), types);
}

/* obx.mark_processed(consumer_name, event_id) */
Datum
obx_mark_processed(PG_FUNCTION_ARGS)
{
	Oid types[] = {TEXTOID, TEXTOID};

	return call_with_caller(fcinfo, "_mark_processed", lengthof(types), types);
}

/* obx.claim_landed(consumer_name) */
Datum
obx_claim_landed(PG_FUNCTION_ARGS)
{
	Oid types[] = {TEXTOID};

	return call_with_caller(fcinfo, "_claim_landed", lengthof(types), types);
}

/* obx.start_landed(consumer_name, landed_id) */
Datum
obx_start_landed(PG_FUNCTION_ARGS)
{
	Oid types[] = {TEXTOID, INT8OID};

	return call_with_caller(fcinfo, "_start_landed", lengthof(types), types);
}

/* obx.complete_landed(consumer_name, landed_id) */
Datum
obx_complete_landed(PG_FUNCTION_ARGS)
{
	Oid types[] = {TEXTOID, INT8OID};

	return call_with_caller(fcinfo, "_complete_landed", lengthof(types), types);
}

/* obx.fail_landed(consumer_name, landed_id, error, max_attempts, retry_after) */
Datum
obx_fail_landed(PG_FUNCTION_ARGS)
{
	Oid types[] = {TEXTOID, INT8OID, TEXTOID, INT4OID, INTERVALOID};

	return call_with_caller(fcinfo, "_fail_landed", lengthof(types), types);
}
