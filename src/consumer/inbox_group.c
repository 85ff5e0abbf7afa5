/*-------------------------------------------------------------------------
 *
 * inbox_group.c
 *	  Applying a run of a batch's messages in one subtransaction: one
 *	  statement marks all their events processed, then the subscription's
 *	  handler is called on each new event, through one prepared call.
 *
 * The per-message path (inbox.c, obx_inbox_apply) pays, for every message,
 * a subtransaction, a mark statement and, for a LANGUAGE sql handler, the
 * parsing and planning of the handler's body: PostgreSQL keeps a SQL
 * function's plans only within the subtransaction of its first call.  A
 * group pays for them once.  It keeps only what succeeds as a whole:
 *	  - it stops before a malformed message and before a message whose
 *		handler ended a worker (obx_handler_is_victim): those go through
 *		obx_inbox_apply, which dead-letters them;
 *	  - when a handler raises, the group's subtransaction is rolled back, the
 *		messages before the failed one are applied again as a group, and the
 *		failed one is left to obx_inbox_apply with its handler's error
 *		(ObxInboxFailure): retried or dead-lettered exactly as if it had
 *		failed alone, without a second call of its handler;
 *	  - when obx's own statement fails, nothing of the group remains, and
 *		its first message is left to obx_inbox_apply.
 * The messages are applied in the order they came, each handler call in a
 * GUC nest level of its own as in the per-message path, and each sees the
 * effects of the messages before it, as within any batch.
 *
 * The marks: one INSERT ... ON CONFLICT DO NOTHING of the group's event
 * ids, in byte order (two workers marking the same ids take them in the
 * same order), returning those it inserted.  The first message of the
 * group with such an id is new and its handler is called; any other is a
 * duplicate: marked before the group, or by an earlier message of it.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"

#include "inbox.h"
#include "inbound.h"
#include "handler.h"
#include "worker.h"

static SPIPlanPtr group_mark_plan = NULL;

static const char *group_mark_sql =
	"INSERT INTO obx.processed_events (consumer_name, event_id)"
	" SELECT $1, i FROM pg_catalog.unnest($2) i ORDER BY i COLLATE pg_catalog.\"C\""
	" ON CONFLICT DO NOTHING RETURNING event_id";

/*
 * group_cxt: the group's events, kept across its attempts; attempt_cxt: the
 * prepared handler call (and a SQL handler's plans), one attempt's; call_cxt:
 * what one handler call leaves, reset after it.
 */
static MemoryContext group_cxt = NULL;
static MemoryContext attempt_cxt = NULL;
static MemoryContext call_cxt = NULL;

/* A message of the group. */
typedef struct Member
{
	const ObxInbound *msg;
	ObxInboundEvent ev;
	bool fresh; /* this attempt marked its event: its handler is called */
} Member;

/* An event id the group's mark statement inserted. */
typedef struct InsertedId
{
	char id[OBX_MAX_EVENT_ID_LEN + 1];
	bool taken; /* by the first member with it */
} InsertedId;

/* Mark the events of m[0..n) in one statement; set each member's fresh. */
static void
mark_members(Member *m, int n)
{
	Datum *ids = palloc(sizeof(Datum) * n);
	Datum values[2];
	HASHCTL ctl;
	HTAB *inserted;
	uint64 r;
	int rc;
	int i;

	for (i = 0; i < n; i++)
		ids[i] = CStringGetTextDatum(m[i].ev.event_id);
	values[0] = CStringGetTextDatum(m[0].msg->sub->name);
	values[1] = PointerGetDatum(construct_array(ids, n, TEXTOID, -1, false,
												TYPALIGN_INT));
	rc = SPI_execute_plan(group_mark_plan, values, NULL, false, 0);
	if (rc != SPI_OK_INSERT_RETURNING)
		elog(ERROR, "obx could not mark events processed: %s",
			 SPI_result_code_string(rc));

	ctl.keysize = OBX_MAX_EVENT_ID_LEN + 1;
	ctl.entrysize = sizeof(InsertedId);
	ctl.hcxt = CurrentMemoryContext;
	inserted = hash_create("obx group event ids", Max(SPI_processed, 16), &ctl,
						   HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	for (r = 0; r < SPI_processed; r++)
	{
		char *id = SPI_getvalue(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 1);
		InsertedId *e = hash_search(inserted, id, HASH_ENTER, NULL);

		e->taken = false;
	}
	SPI_freetuptable(SPI_tuptable);
	for (i = 0; i < n; i++)
	{
		InsertedId *e = hash_search(inserted, m[i].ev.event_id, HASH_FIND, NULL);

		m[i].fresh = (e != NULL && !e->taken);
		if (m[i].fresh)
			e->taken = true;
	}
}

/* One attempt at a group: its members, its prepared handler call. */
typedef struct GroupAttempt
{
	Member *m;
	int n;
	ObxHandlerCall call;
	int at; /* the member whose handler runs, or -1 */
} GroupAttempt;

/*
 * Mark the attempt's members, then call the handler on each fresh one, in
 * order (run by obx_in_subtransaction; what the calls leave goes to
 * call_cxt, reset after each).
 */
static void
apply_members(void *arg)
{
	GroupAttempt *a = (GroupAttempt *) arg;
	MemoryContext caller = MemoryContextSwitchTo(call_cxt);
	int i;

	mark_members(a->m, a->n);
	MemoryContextReset(call_cxt);
	for (i = 0; i < a->n; i++)
	{
		Datum row;

		if (!a->m[i].fresh)
			continue;
		row = obx_inbound_row(a->m[i].msg, &a->m[i].ev);
		obx_handler_enter(a->m[i].msg);
		a->at = i;
		obx_handler_invoke(&a->call, row);
		a->at = -1;
		obx_handler_leave();
		MemoryContextReset(call_cxt);
	}
	MemoryContextSwitchTo(caller);
}

/*
 * One attempt at m[0..n) in a subtransaction.  Returns n when it was
 * applied (the subtransaction released); the index of the member whose
 * handler raised, with its error in *failure; or -1 when obx's own
 * statement failed.  Rolled back whenever it returns less than n.
 */
static int
try_group(Member *m, int n, ObxInboxFailure *failure)
{
	const ObxSubscription *sub = m[0].msg->sub;
	GroupAttempt a = {.m = m, .n = n, .at = -1};
	ErrorData *edata;

	MemoryContextReset(attempt_cxt);
	obx_handler_prepare(&a.call, sub->name, sub->handler, sub->owner,
						sub->handler_timeout_ms, attempt_cxt);
	/* In group_cxt: the error outlives the attempts after this one. */
	edata = obx_in_subtransaction(apply_members, &a);
	if (edata == NULL)
		return n;
	if (a.at >= 0)
	{
		obx_handler_leave();
		failure->timed_out = obx_handler_timed_out();
		failure->error = edata;
		return a.at;
	}
	elog(DEBUG1, "obx consumer: a group of %d messages of consumer group \"%s\" failed, applied one by one: %s",
		 n, sub->name, edata->message);
	return -1;
}

static void
group_prepare(void)
{
	if (group_cxt == NULL)
	{
		group_cxt = AllocSetContextCreate(TopMemoryContext, "obx inbox group",
										  ALLOCSET_DEFAULT_SIZES);
		attempt_cxt = AllocSetContextCreate(TopMemoryContext, "obx inbox group attempt",
											ALLOCSET_DEFAULT_SIZES);
		call_cxt = AllocSetContextCreate(TopMemoryContext, "obx inbox handler call",
										 ALLOCSET_DEFAULT_SIZES);
	}
	if (group_mark_plan == NULL)
	{
		Oid types[] = {TEXTOID, TEXTARRAYOID};

		group_mark_plan = obx_prepare_kept(group_mark_sql, 2, types);
	}
	MemoryContextReset(group_cxt);
}

/*
 * obx_inbox_apply_group
 *		Apply as many of msgs[0..n), messages of the open batch of one
 *		subscription, as can be applied as one group (see the file header).
 *		Returns how many of the first messages were applied and counted.
 *		When fewer than n, the next message must be applied alone with
 *		obx_inbox_apply, given *failure: its handler's error in the group,
 *		or none.  *failure stays valid until the next call.
 */
int
obx_inbox_apply_group(const ObxInbound **msgs, int n, ObxInboxFailure *failure)
{
	MemoryContext old = CurrentMemoryContext;
	Member *m;
	int limit;
	int i;

	failure->error = NULL;
	failure->timed_out = false;
	group_prepare();
	MemoryContextSwitchTo(group_cxt);
	m = palloc0(sizeof(Member) * Max(n, 1));
	for (limit = 0; limit < n; limit++)
	{
		m[limit].msg = msgs[limit];
		obx_inbound_build(msgs[limit], &m[limit].ev);
		if (m[limit].ev.malformed || obx_handler_is_victim(msgs[limit]))
			break;
	}
	while (limit > 0)
	{
		ObxInboxFailure f = {NULL, false};
		int done = try_group(m, limit, &f);

		if (done == limit)
			break;
		*failure = f;
		limit = Max(done, 0);
	}
	for (i = 0; i < limit; i++)
		obx_inbox_count(msgs[i],
						m[i].fresh ? OBX_INBOX_PROCESSED : OBX_INBOX_DUPLICATE,
						m[i].ev.event_id);
	MemoryContextSwitchTo(old);
	return limit;
}
