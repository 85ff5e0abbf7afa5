/*-------------------------------------------------------------------------
 *
 * call_inner.c
 *	  Calling obx's SECURITY DEFINER inner functions (obx._<name>) from
 *	  the C functions in front of them, with a leading argument their
 *	  caller cannot choose: the caller's role (obx.subscribe and the other
 *	  functions of consumer_sql.c) or the consumer whose handler runs
 *	  (obx.land, land.c).  The inner function is called through fmgr, so
 *	  no EXECUTE privilege on it is needed, and none is granted.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "nodes/makefuncs.h"
#include "nodes/value.h"
#include "parser/parse_func.h"
#include "utils/lsyscache.h"

#include "call_inner.h"

#define OBX_MAX_INNER_ARGS 8

/*
 * obx_call_inner
 *		Call obx.<inner>(lead, <the caller's own arguments>) and return its
 *		result, null or not (fcinfo->isnull).  lead is of type lead_type.
 *
 * obx.<inner> is looked up by schema-qualified name and argument types,
 * lead_type then the caller's declared ones (nothing depends on
 * search_path), once per call site, and kept in fn_extra.  Called with
 * FunctionCallInvoke, not FunctionCallN: a void SQL function returns NULL.
 */
Datum
obx_call_inner(FunctionCallInfo fcinfo, const char *inner, Oid lead_type, Datum lead)
{
	FmgrInfo *target = (FmgrInfo *) fcinfo->flinfo->fn_extra;
	int nargs = PG_NARGS();
	LOCAL_FCINFO(call, OBX_MAX_INNER_ARGS);
	Datum result;
	int i;

	if (nargs + 1 > OBX_MAX_INNER_ARGS)
		elog(ERROR, "obx.%s takes too many arguments", inner);
	if (target == NULL)
	{
		Oid types[OBX_MAX_INNER_ARGS];
		Oid *argtypes;
		int declared;
		List *name = list_make2(makeString(pstrdup("obx")),
								makeString(pstrdup(inner)));
		Oid fn;

		(void) get_func_signature(fcinfo->flinfo->fn_oid, &argtypes, &declared);
		Assert(declared == nargs);
		types[0] = lead_type;
		memcpy(&types[1], argtypes, sizeof(Oid) * nargs);
		fn = LookupFuncName(name, nargs + 1, types, false);
		target = MemoryContextAllocZero(fcinfo->flinfo->fn_mcxt, sizeof(FmgrInfo));
		fmgr_info_cxt(fn, target, fcinfo->flinfo->fn_mcxt);
		fcinfo->flinfo->fn_extra = target;
	}

	InitFunctionCallInfoData(*call, target, nargs + 1, fcinfo->fncollation,
							 NULL, NULL);
	call->args[0].value = lead;
	call->args[0].isnull = false;
	for (i = 0; i < nargs; i++)
		call->args[i + 1] = fcinfo->args[i];
	result = FunctionCallInvoke(call);
	fcinfo->isnull = call->isnull;
	return result;
}
