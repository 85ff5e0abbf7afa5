/*-------------------------------------------------------------------------
 *
 * compat.c
 *	  The bodies behind compat.h's names, where one server release needs
 *	  more than a macro.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "funcapi.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "utils/memutils.h"
#include "utils/tuplestore.h"

#include "compat.h"

#if PG_VERSION_NUM >= 150000
static shmem_request_hook_type prev_shmem_request_hook = NULL;
static void (*shmem_request_fn)(void) = NULL;

static void
shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	shmem_request_fn();
}
#endif

/*
 * obx_request_shmem
 *		Have fn ask for obx's shared memory when this server takes such
 *		requests.  Called once, from _PG_init while preloading.
 */
void
obx_request_shmem(void (*fn)(void))
{
#if PG_VERSION_NUM >= 150000
	shmem_request_fn = fn;
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = shmem_request;
#else
	fn();
#endif
}

#if PG_VERSION_NUM < 150000
/*
 * obx_init_materialized_srf
 *		14's stand-in for InitMaterializedSRF: check that the caller takes
 *		a materialized set and give it a tuplestore and row type, from
 *		the caller's expected row type or the function's own.
 */
void
obx_init_materialized_srf(FunctionCallInfo fcinfo, bool use_expected_desc)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	MemoryContext old;
	TupleDesc desc;

	if (rsinfo == NULL || !IsA(rsinfo, ReturnSetInfo) ||
		(rsinfo->allowedModes & SFRM_Materialize) == 0 ||
		(use_expected_desc && rsinfo->expectedDesc == NULL))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("set-valued function called in context that cannot accept a set")));
	old = MemoryContextSwitchTo(rsinfo->econtext->ecxt_per_query_memory);
	if (use_expected_desc)
		desc = CreateTupleDescCopy(rsinfo->expectedDesc);
	else if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	rsinfo->returnMode = SFRM_Materialize;
	rsinfo->setResult = tuplestore_begin_heap(true, false, work_mem);
	rsinfo->setDesc = desc;
	MemoryContextSwitchTo(old);
}
#endif
