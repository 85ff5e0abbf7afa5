/*-------------------------------------------------------------------------
 *
 * compat.h
 *	  The one place where obx tests PG_VERSION_NUM.  obx builds against
 *	  PostgreSQL 14 to 18; each server API whose name or signature changed
 *	  within that range gets one obx_ name here, and the modules call
 *	  only that name.  Each entry says which release changed what;
 *	  compat.c holds the few that need a body.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OBX_COMPAT_H
#define OBX_COMPAT_H

#include "postgres.h"

#include "access/xlog.h"
#include "catalog/pg_proc.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/latch.h"
#include "utils/acl.h"
#include "utils/guc.h"
#include "utils/timeout.h"

#if PG_VERSION_NUM < 140000 || PG_VERSION_NUM >= 190000
#error "obx supports PostgreSQL 14 to 18"
#endif

/*
 * 18 replaced the trailing pg_attribute_noreturn() with a leading
 * pg_noreturn; obx writes the leading form everywhere.
 */
#ifndef pg_noreturn
#define pg_noreturn __attribute__((noreturn))
#endif

/*
 * 15 made extensions ask for shared memory from shmem_request_hook; 14
 * takes the request in _PG_init itself, while shared_preload_libraries is
 * being processed.  obx_request_shmem (compat.c) does what this server
 * wants: fn runs from the hook on 15 and later, at once on 14.
 */
extern void obx_request_shmem(void (*fn)(void));

/* 15 renamed EmitWarningsOnPlaceholders. */
#if PG_VERSION_NUM < 150000
#define MarkGUCPrefixReserved(prefix) EmitWarningsOnPlaceholders(prefix)
#endif

/* 15 gave GetFlushRecPtr the timeline it flushed on (obx passes NULL). */
#if PG_VERSION_NUM >= 150000
#define obx_flush_rec_ptr() GetFlushRecPtr(NULL)
#else
#define obx_flush_rec_ptr() GetFlushRecPtr()
#endif

/* 16 folded pg_proc_aclcheck into object_aclcheck. */
#if PG_VERSION_NUM >= 160000
#define obx_proc_aclcheck(proc, role, mode) \
	object_aclcheck(ProcedureRelationId, (proc), (role), (mode))
#else
#define obx_proc_aclcheck(proc, role, mode) pg_proc_aclcheck((proc), (role), (mode))
#endif

/*
 * 17 gave CreateWaitEventSet a resource owner in place of a memory
 * context; obx's sets live as long as the process, owned by neither.
 */
#if PG_VERSION_NUM >= 170000
#define obx_create_wait_event_set(nevents) CreateWaitEventSet(NULL, (nevents))
#else
#define obx_create_wait_event_set(nevents) \
	CreateWaitEventSet(TopMemoryContext, (nevents))
#endif

/*
 * A timeout that fires at fin_time and then every interval_ms until it is
 * disabled.  15 has enable_timeout_every; on 14 the callback re-arms the
 * timeout itself by calling obx_timeout_repeat, a no-op from 15 on.
 * (14's timeout handler takes a timeout enabled from a callback: it
 * schedules the alarm again after the callbacks have run.)
 */
#if PG_VERSION_NUM >= 150000
#define obx_enable_timeout_every(id, fin_time, interval_ms) \
	enable_timeout_every((id), (fin_time), (interval_ms))
#define obx_timeout_repeat(id, interval_ms) ((void) 0)
#else
#define obx_enable_timeout_every(id, fin_time, interval_ms) \
	enable_timeout_at((id), (fin_time))
#define obx_timeout_repeat(id, interval_ms) \
	enable_timeout_after((id), (interval_ms))
#endif

/*
 * A set-returning function that materializes its rows: 15 has
 * InitMaterializedSRF (with MAT_SRF_USE_EXPECTED_DESC to take the
 * caller's row type); 14 gets the same set-up here.
 */
#if PG_VERSION_NUM >= 150000
#define obx_init_materialized_srf(fcinfo, use_expected_desc) \
	InitMaterializedSRF((fcinfo), (use_expected_desc) ? MAT_SRF_USE_EXPECTED_DESC : 0)
#else
extern void obx_init_materialized_srf(FunctionCallInfo fcinfo, bool use_expected_desc);
#endif

#endif /* OBX_COMPAT_H */
