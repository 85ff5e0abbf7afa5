/*-------------------------------------------------------------------------
 *
 * handler.c
 *	  Every call of a subscription's handler: the consumer worker's (one
 *	  per message, from inbox.c) and obx.replay_dead_letter's (through the
 *	  SQL-callable obx._replay_handler here).  Each runs as the
 *	  subscription's owner, security-restricted, inside a GUC nest level,
 *	  under the subscription's handler_timeout_ms (obx_call_handler).
 *
 *	  A handler that will not stop after its timeout ends its consumer
 *	  worker; the worker's slot in shared memory (ObxHandlerSlot) tells the
 *	  successor which message that was, so that it is dead-lettered without
 *	  calling the handler again.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "storage/latch.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/regproc.h"
#include "utils/timeout.h"
#include "utils/timestamp.h"

#include "obx.h"
#include "compat.h"
#include "handler.h"
#include "worker.h"

/*
 * A handler runs at most this long unless its subscription says otherwise
 * (options.handler_timeout_ms).
 */
#define OBX_HANDLER_TIMEOUT_MS 30000

/*
 * A consumer worker whose handler is still running this many cancels (one
 * a second) after its timeout ends itself (see handler_timeout_fired).
 */
#define OBX_HANDLER_GRACE_CANCELS   5
#define OBX_HANDLER_CANCEL_EVERY_MS 1000

/* The timer that stops a handler, registered once per process. */
static TimeoutId handler_timeout_id = MAX_TIMEOUTS;
static volatile sig_atomic_t handler_timer_fired = false;
static volatile sig_atomic_t handler_cancels = 0;

/* This consumer worker's slot in shared memory; NULL outside one (a replay). */
static ObxHandlerSlot *my_handler_slot = NULL;

/* Whether the last handler call ended by its timeout. */
static bool handler_timeout_hit = false;

/*
 * The consumer name whose handler runs now (obx_handler_invoke), NULL
 * between calls: what obx.land lands for (land.c).  Only this file sets it.
 */
static const char *calling_consumer = NULL;

/*
 * obx_handler_timeout
 *		options.handler_timeout_ms as obx.subscribe accepts it: a whole
 *		number of milliseconds, 0 for none.  NULL, or anything else, gives
 *		the default: a handler is never left unbounded by mistake.
 */
int
obx_handler_timeout(const char *option)
{
	return obx_option_int(option, 0, INT_MAX, OBX_HANDLER_TIMEOUT_MS);
}

/*
 * Timer callback (signal context): cancel what runs, as pg_cancel_backend
 * would.  It fires again every second until the handler has stopped, so a
 * handler that catches query_canceled is cancelled again.  In a consumer
 * worker, a handler that goes on regardless ends the worker (FATAL, and
 * the launcher starts it again) rather than hold every subscription the
 * worker serves; see obx_inbox_attach.
 */
static void
handler_timeout_fired(void)
{
	handler_timer_fired = true;
	if (my_handler_slot != NULL && ++handler_cancels > OBX_HANDLER_GRACE_CANCELS)
		ProcDiePending = true;
	InterruptPending = true;
	QueryCancelPending = true;
	SetLatch(MyLatch);
	obx_timeout_repeat(handler_timeout_id, OBX_HANDLER_CANCEL_EVERY_MS);
}

static void
arm_timer(int timeout_ms)
{
	if (handler_timeout_id == MAX_TIMEOUTS)
		handler_timeout_id = RegisterTimeout(USER_TIMEOUT, handler_timeout_fired);
	handler_timer_fired = false;
	handler_timeout_hit = false;
	handler_cancels = 0;
	if (timeout_ms > 0)
		obx_enable_timeout_every(handler_timeout_id,
								 TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
															 timeout_ms),
								 OBX_HANDLER_CANCEL_EVERY_MS);
}

/* After a call that returned: a cancel the timer sent since is not for us. */
static void
disarm_timer(void)
{
	disable_timeout(handler_timeout_id, false);
	if (handler_timer_fired)
	{
		QueryCancelPending = false;
		handler_timer_fired = false;
	}
}

/*
 * In the handler's PG_CATCH: re-raise its error, unless it is the cancel
 * of the timer, which becomes an error saying so.
 */
pg_noreturn static void rethrow_handler_error(MemoryContext cxt, const char *name,
											  int timeout_ms);

static void
rethrow_handler_error(MemoryContext cxt, const char *name, int timeout_ms)
{
	ErrorData *edata;

	disable_timeout(handler_timeout_id, false);
	if (!handler_timer_fired)
		PG_RE_THROW();
	MemoryContextSwitchTo(cxt);
	edata = CopyErrorData();
	if (edata->sqlerrcode != ERRCODE_QUERY_CANCELED)
		PG_RE_THROW();
	FlushErrorState();
	handler_timeout_hit = true;
	ereport(ERROR,
			(errcode(ERRCODE_QUERY_CANCELED),
			 errmsg("obx handler %s ran longer than its timeout of %d ms and was cancelled",
					name, timeout_ms),
			 errhint("Raise the subscription's option handler_timeout_ms if the handler needs more time.")));
}

/*
 * obx_handler_prepare
 *		Get ready to call consumer's handler (obx_handler_invoke) as the
 *		subscription's owner, for at most timeout_ms (0: no limit).  The
 *		function's lookup is kept in cxt and reused by every call until cxt
 *		is reset: a LANGUAGE sql handler then keeps its plans for as long as
 *		its (sub)transaction lasts, instead of parsing and planning its body
 *		on every call.
 */
void
obx_handler_prepare(ObxHandlerCall *call, const char *consumer, Oid handler,
					Oid owner, int timeout_ms, MemoryContext cxt)
{
	memset(call, 0, sizeof(*call));
	call->consumer = MemoryContextStrdup(cxt, consumer);
	call->handler = handler;
	call->owner = owner;
	call->timeout_ms = timeout_ms;
	call->cxt = cxt;
}

/*
 * On the first call, inside the owner's restricted settings: the privilege
 * check, the function's name for the timeout's error (looked up while
 * nothing failed) and its lookup.
 */
static void
first_call(ObxHandlerCall *call)
{
	if (obx_proc_aclcheck(call->handler, call->owner, ACL_EXECUTE) != ACLCHECK_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("role \"%s\" may not execute the obx handler %s",
						GetUserNameFromId(call->owner, true),
						format_procedure(call->handler))));
	call->name = MemoryContextStrdup(call->cxt, format_procedure(call->handler));
	fmgr_info_cxt(call->handler, &call->flinfo, call->cxt);
	call->ready = true;
}

/*
 * obx_handler_invoke
 *		Call the prepared handler on an obx.inbound_event.
 *
 * The call runs the way PostgreSQL runs index expressions during VACUUM:
 * with the owner as the current user, in a security-restricted operation
 * (no SET ROLE, no temporary objects, no cursors or prepared statements
 * outliving it) and inside a GUC nest level unwound when it returns, with
 * search_path pg_catalog, pg_temp whoever calls it: a handler names its
 * objects with their schema or sets its own search_path in its definition.
 * Every call gets a GUC nest level of its own, so what one call sets is
 * never seen by the next.
 *
 * When the timeout passes, the handler is cancelled and this raises
 * query_canceled saying so.  On any error the caller's (sub)transaction
 * abort restores the user and the settings; the timer is stopped here.
 */
void
obx_handler_invoke(ObxHandlerCall *call, Datum event)
{
	MemoryContext cxt = CurrentMemoryContext;
	const char *save_consumer = calling_consumer;
	Oid save_user;
	int save_sec;
	int save_nestlevel;
	LOCAL_FCINFO(fcinfo, 1);

	GetUserIdAndSecContext(&save_user, &save_sec);
	SetUserIdAndSecContext(call->owner, save_sec | SECURITY_LOCAL_USERID_CHANGE |
											SECURITY_RESTRICTED_OPERATION);
	save_nestlevel = NewGUCNestLevel();
	(void) set_config_option("search_path", "pg_catalog, pg_temp", PGC_SUSET,
							 PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);

	if (!call->ready)
		first_call(call);
	InitFunctionCallInfoData(*fcinfo, &call->flinfo, 1, InvalidOid, NULL, NULL);
	fcinfo->args[0].value = event;
	fcinfo->args[0].isnull = false;

	arm_timer(call->timeout_ms);
	calling_consumer = call->consumer;
	PG_TRY();
	{
		(void) FunctionCallInvoke(fcinfo);
	}
	PG_CATCH();
	{
		calling_consumer = save_consumer;
		rethrow_handler_error(cxt, call->name, call->timeout_ms);
	}
	PG_END_TRY();
	calling_consumer = save_consumer;
	disarm_timer();

	AtEOXact_GUC(false, save_nestlevel);
	SetUserIdAndSecContext(save_user, save_sec);
}

/*
 * obx_call_handler
 *		One call of a handler, prepared for it alone (obx_handler_prepare,
 *		obx_handler_invoke).
 */
void
obx_call_handler(const char *consumer, Oid handler, Oid owner, Datum event,
				 int timeout_ms)
{
	ObxHandlerCall call;

	obx_handler_prepare(&call, consumer, handler, owner, timeout_ms,
						CurrentMemoryContext);
	obx_handler_invoke(&call, event);
}

/*
 * obx_handler_consumer
 *		The consumer name whose handler is running, or NULL when no handler
 *		call of obx's is under way.
 */
const char *
obx_handler_consumer(void)
{
	return calling_consumer;
}

/*
 * obx_inbox_attach
 *		Take consumer worker number worker's slot.  When the previous
 *		worker of that number ended during a handler call (a handler that
 *		would not stop after its timeout, see handler_timeout_fired), keep
 *		that message as the slot's victim: whichever worker gets it next
 *		dead-letters it without calling the handler.
 */
void
obx_inbox_attach(int worker)
{
	ObxHandlerSlot *slot = &obx_shared->handlers[worker];

	if (slot->active)
	{
		slot->victim = slot->current;
		slot->killed = true;
		slot->active = false;
		ereport(LOG,
				(errmsg("obx consumer %d: its previous worker ended while the handler of consumer group \"%s\" ran on topic \"%s\" partition %d offset %lld",
						worker, slot->victim.consumer, slot->victim.topic,
						slot->victim.partition, (long long) slot->victim.offset),
				 errdetail("The message is dead-lettered without calling the handler again.")));
	}
	my_handler_slot = slot;
}

/*
 * obx_handler_enter
 *		Note in the worker's slot that msg's handler is about to run (a
 *		no-op outside a consumer worker).
 */
void
obx_handler_enter(const ObxInbound *msg)
{
	handler_timeout_hit = false;
	if (my_handler_slot == NULL)
		return;
	strlcpy(my_handler_slot->current.consumer, msg->sub->name,
			sizeof(my_handler_slot->current.consumer));
	strlcpy(my_handler_slot->current.topic, msg->topic,
			sizeof(my_handler_slot->current.topic));
	my_handler_slot->current.partition = msg->partition;
	my_handler_slot->current.offset = msg->offset;
	my_handler_slot->active = true;
}

/* obx_handler_leave: the handler call that obx_handler_enter noted ended. */
void
obx_handler_leave(void)
{
	if (my_handler_slot != NULL)
		my_handler_slot->active = false;
}

/*
 * obx_handler_timed_out
 *		Whether the last handler call ended by its timeout (or ended a
 *		worker): its error is then never retried, whatever its SQLSTATE.
 */
bool
obx_handler_timed_out(void)
{
	return handler_timeout_hit;
}

/* The slot whose ended worker was running msg's handler, or NULL. */
static ObxHandlerSlot *
victim_slot(const ObxInbound *msg)
{
	int i;

	for (i = 0; i < OBX_MAX_WORKERS; i++)
	{
		ObxHandlerSlot *slot = &obx_shared->handlers[i];

		if (slot->killed && slot->victim.partition == msg->partition &&
			slot->victim.offset == msg->offset &&
			strcmp(slot->victim.topic, msg->topic) == 0 &&
			strcmp(slot->victim.consumer, msg->sub->name) == 0)
			return slot;
	}
	return NULL;
}

/*
 * obx_handler_is_victim
 *		Whether a consumer worker ended while msg's handler ran (see
 *		obx_handler_ended_a_worker, which takes the mark).
 */
bool
obx_handler_is_victim(const ObxInbound *msg)
{
	return my_handler_slot != NULL && victim_slot(msg) != NULL;
}

/*
 * obx_handler_ended_a_worker
 *		If a consumer worker ended while msg's handler ran, the error to
 *		dead-letter msg with (query_canceled), else NULL.  The mark is
 *		cleared, so only one worker dead-letters the message.
 */
ErrorData *
obx_handler_ended_a_worker(const ObxInbound *msg)
{
	ObxHandlerSlot *slot;
	ErrorData *edata;

	if (my_handler_slot == NULL || (slot = victim_slot(msg)) == NULL)
		return NULL;
	slot->killed = false;
	edata = palloc0(sizeof(ErrorData));
	edata->elevel = ERROR;
	edata->sqlerrcode = ERRCODE_QUERY_CANCELED;
	edata->message = psprintf("obx handler %s did not stop after its timeout of %d ms, and its consumer worker was restarted",
							  format_procedure(msg->sub->handler),
							  msg->sub->handler_timeout_ms);
	handler_timeout_hit = true;
	return edata;
}

PG_FUNCTION_INFO_V1(obx_replay_handler);

/*
 * obx._replay_handler(dead_letter_id bigint)
 *		Run the subscription's handler on a dead letter not yet replayed,
 *		as the subscription's owner, never as the caller (a superuser
 *		replaying included), with the restrictions and the timeout of the
 *		consumer worker's calls (obx_call_handler).
 *
 * Called by obx.replay_dead_letter, which marks the event processed and
 * the dead letter replayed.  Reads the dead letter and its subscription
 * with the caller's privileges.
 */
Datum
obx_replay_handler(PG_FUNCTION_ARGS)
{
	int64 id = PG_GETARG_INT64(0);
	Oid types[1] = {INT8OID};
	Datum args[1];
	HeapTuple tup;
	TupleDesc desc;
	bool isnull;
	char *timeout;
	Oid handler;
	int rc;

	args[0] = Int64GetDatum(id);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "obx could not connect to SPI");
	rc = SPI_execute_with_args(
		"SELECT obx._handler(s)::pg_catalog.oid, s.owner::pg_catalog.oid,"
		"       s.options->>'handler_timeout_ms',"
		"       ROW(d.event_id, d.event_type, d.topic, d.kafka_partition,"
		"           d.kafka_offset, d.event_key, d.headers, d.payload,"
		"           d.kafka_timestamp)::obx.inbound_event, d.consumer_name"
		"  FROM obx.dead_letters d"
		"  JOIN obx.subscriptions s ON s.consumer_name = d.consumer_name"
		" WHERE d.id = $1 AND d.replayed_at IS NULL",
		1, types, args, NULL, false, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "obx could not read dead letter " INT64_FORMAT ": %s", id,
			 SPI_result_code_string(rc));
	if (SPI_processed != 1)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("no obx dead letter %lld waiting for a replay with a subscription",
						(long long) id)));
	tup = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	timeout = SPI_getvalue(tup, desc, 3);
	handler = DatumGetObjectId(SPI_getbinval(tup, desc, 1, &isnull));
	if (isnull)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_FUNCTION),
				 errmsg("the handler of the subscription of obx dead letter %lld no longer exists",
						(long long) id)));
	obx_call_handler(SPI_getvalue(tup, desc, 5), handler,
					 DatumGetObjectId(SPI_getbinval(tup, desc, 2, &isnull)),
					 SPI_getbinval(tup, desc, 4, &isnull),
					 obx_handler_timeout(timeout));
	SPI_finish();
	PG_RETURN_VOID();
}
