/*-------------------------------------------------------------------------
 *
 * inbox.c
 *	  The statements the consumer worker runs on Kafka messages: the one
 *	  transaction per batch of messages; a message applied alone, whose
 *	  subtransaction marks the event processed and calls the subscription's
 *	  handler, or quarantines the message as a dead letter; the progress
 *	  rows; retries and watermarks.
 *
 * A batch of messages is one transaction (obx_inbox_batch_begin,
 * obx_inbox_batch_commit).  Most of its messages are applied in groups
 * (inbox_group.c); a message a group cannot take is applied alone, in a
 * subtransaction of its own (obx_inbox_apply):
 *	  1. the event, built from the message (inbound.c); a message without an
 *		 event id or a JSON payload is malformed and becomes a dead letter;
 *	  2. the mark in obx.processed_events, as obx.mark_processed records
 *		 it (mark_sql); an existing mark means a duplicate, and
 *		 the handler is not called (a duplicate within the batch included:
 *		 the mark of an earlier message is already in the transaction);
 *	  3. the handler, as the subscription's owner (handler.c), unless the
 *		 message's group already met its error (ObxInboxFailure): then that
 *		 error is the handler's, without a second call.
 * A handler error rolls the message's subtransaction back, mark and
 * effects included.  Of a transient class (is_transient), the message is
 * retried, unless the handler has failed on it as many times as the
 * subscription's max_attempts allows (attempts_spent); any other handler
 * error, and that last one, is a dead letter, recorded with the mark in a
 * second subtransaction.  An error in obx's own statements rolls
 * the message's subtransaction back and is transient too.
 *
 * What each message that was not rolled back did is counted per partition
 * in memory; obx_inbox_batch_commit writes one row per partition to
 * obx.consumer_partitions, then commits.  The caller stores the Kafka
 * offsets only after that commit.  A batch of one message is the
 * transaction per message of obx.consumer_batch_size = 1.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "pgstat.h"
#include "storage/proc.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "obx.h"
#include "log_repeat.h"
#include "inbox.h"
#include "worker.h"
#include "handler.h"
#include "inbound.h"
#include "progress.h"

static SPIPlanPtr mark_plan = NULL;
static SPIPlanPtr dead_letter_plan = NULL;

/*
 * The open batch: its memory context (the caller's, which outlives every
 * subtransaction), and the outcome of the message being applied.
 * apply_cxt holds one message's allocations and is reset for the next.
 */
static struct
{
	MemoryContext cxt;
	const ObxSubscription *sub;
	ObxOutcome pending;
	MemoryContext apply_cxt;
	int subxids; /* the last batch's, see obx_inbox_batch_subxids */
	bool subxids_overflowed;
} batch;

/*
 * What obx.mark_processed does, without its two function calls and its
 * owner check: the worker (obx.worker_role, granted INSERT here) acts for
 * the subscription, whose owner obx.subscribe checked.  ON CONFLICT DO
 * NOTHING waits for a concurrent insert of the same pair; a row inserted
 * means the event is new.
 */
static const char *mark_sql =
	"INSERT INTO obx.processed_events (consumer_name, event_id)"
	" VALUES ($1, $2) ON CONFLICT DO NOTHING";

static const char *dead_letter_sql =
	"INSERT INTO obx.dead_letters"
	"   (consumer_name, event_id, topic, kafka_partition, kafka_offset,"
	"    event_key, event_type, headers, payload, raw_payload, kafka_timestamp,"
	"    error_class, error_sqlstate, error_message)"
	" VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)"
	" ON CONFLICT (consumer_name, topic, kafka_partition, kafka_offset) DO NOTHING";

/* This file's statements, prepared once per process and kept (SPI_keepplan). */
static void
inbox_prepare_plans(void)
{
	if (mark_plan != NULL)
		return;
	{
		Oid types[] = {TEXTOID, TEXTOID};

		mark_plan = obx_prepare_kept(mark_sql, 2, types);
	}
	{
		Oid types[] = {TEXTOID, TEXTOID, TEXTOID, INT4OID, INT8OID, TEXTOID,
					   TEXTOID, JSONBOID, JSONBOID, BYTEAOID, TIMESTAMPTZOID,
					   TEXTOID, TEXTOID, TEXTOID};

		dead_letter_plan = obx_prepare_kept(dead_letter_sql, 14, types);
	}
}

/*
 * What the message did, for its partition's row in obx.consumer_partitions:
 * counted once its subtransaction is released (fold_outcome).
 */
static void
record_progress(const ObxInbound *msg, const ObxInboundEvent *ev,
				ObxInboxResult result, const char *error_class,
				const char *error)
{
	batch.pending.result = result;
	batch.pending.event_id = ev->event_id;
	batch.pending.error_class = error_class;
	batch.pending.error = error;
}

/* The message in obx.dead_letters, once per offset, with its error. */
static void
record_dead_letter(const ObxInbound *msg, const ObxInboundEvent *ev,
				   const char *error_class, const char *sqlstate,
				   const char *error)
{
	Datum values[14];
	char nulls[14];
	int rc;

	memset(nulls, ' ', sizeof(nulls));
	values[0] = CStringGetTextDatum(msg->sub->name);
	values[1] = obx_text_or_null(ev->event_id, &nulls[1]);
	values[2] = CStringGetTextDatum(msg->topic);
	values[3] = Int32GetDatum(msg->partition);
	values[4] = Int64GetDatum(msg->offset);
	values[5] = obx_text_or_null(ev->key, &nulls[5]);
	values[6] = obx_text_or_null(ev->event_type, &nulls[6]);
	values[7] = ev->headers;
	values[8] = ev->is_json ? ev->payload : (Datum) 0;
	nulls[8] = ev->is_json ? ' ' : 'n';
	if (!ev->is_json && msg->value != NULL)
	{
		bytea *raw = palloc(VARHDRSZ + msg->value_len);

		SET_VARSIZE(raw, VARHDRSZ + msg->value_len);
		memcpy(VARDATA(raw), msg->value, msg->value_len);
		values[9] = PointerGetDatum(raw);
	}
	else
		nulls[9] = 'n';
	values[10] = TimestampTzGetDatum(msg->timestamp);
	nulls[10] = msg->timestamp == 0 ? 'n' : ' ';
	values[11] = CStringGetTextDatum(error_class);
	values[12] = obx_text_or_null(sqlstate, &nulls[12]);
	values[13] = CStringGetTextDatum(error);
	rc = SPI_execute_plan(dead_letter_plan, values, nulls, false, 0);
	if (rc != SPI_OK_INSERT)
		elog(ERROR, "obx could not record a dead letter: %s",
			 SPI_result_code_string(rc));
}

/* Mark the event processed (mark_sql): false when it is a duplicate. */
static bool
mark_processed(const ObxInbound *msg, const ObxInboundEvent *ev)
{
	Datum values[2];
	int rc;

	values[0] = CStringGetTextDatum(msg->sub->name);
	values[1] = CStringGetTextDatum(ev->event_id);
	rc = SPI_execute_plan(mark_plan, values, NULL, false, 0);
	if (rc != SPI_OK_INSERT)
		elog(ERROR, "obx could not mark an event processed: %s",
			 SPI_result_code_string(rc));
	return SPI_processed == 1;
}

/*
 * One message being applied: its event, and the error of its handler, if
 * it failed.  in_handler says that an error raised now is the handler's.
 */
typedef struct Attempt
{
	const ObxInbound *msg;
	const ObxInboxFailure *known; /* the handler's error met in a group */
	ObxInboundEvent ev;
	bool in_handler;
	ErrorData *handler_error;
	bool timed_out; /* handler_error is the end of a timeout */
	bool gave_up;   /* handler_error is transient, after the last attempt */
} Attempt;

/*
 * The error classes retried without moving the offset: serialization
 * failures and deadlocks (class 40), lock and statement timeouts, lost
 * connections (class 08), exhausted resources (class 53), and whatever
 * the subscription lists in options.retry_sqlstates.
 */
static bool
is_transient(const ObxSubscription *sub, int code)
{
	int i;

	if (ERRCODE_TO_CATEGORY(code) == ERRCODE_TRANSACTION_ROLLBACK ||
		ERRCODE_TO_CATEGORY(code) == ERRCODE_CONNECTION_EXCEPTION ||
		ERRCODE_TO_CATEGORY(code) == ERRCODE_INSUFFICIENT_RESOURCES ||
		code == ERRCODE_LOCK_NOT_AVAILABLE ||
		code == ERRCODE_QUERY_CANCELED)
		return true;
	for (i = 0; i < sub->nretry; i++)
		if (code == sub->retry_sqlstates[i])
			return true;
	return false;
}

/*
 * Whether to log a message's trouble of this kind (class and SQLSTATE) for
 * its subscription now: at most once a minute each (obx_log_allowed).
 * *note is "" or says how many lines like it were kept back.
 */
static bool
log_now(const ObxInbound *msg, const char *kind, int sqlstate, const char **note)
{
	int64 suppressed;

	if (!obx_log_allowed(psprintf("consumer|%s|%s|%s", msg->sub->name, kind,
								  sqlstate ? unpack_sql_state(sqlstate) : ""),
						 &suppressed))
		return false;
	*note = suppressed == 0 ? ""
							: psprintf(" (%lld more like it since the last one logged)",
									   (long long) suppressed);
	return true;
}

#define LOG_CONTEXT_FMT           "consumer group \"%s\", topic \"%s\", partition %d, offset %lld, event id %s"
#define LOG_CONTEXT_ARGS(msg, id) (msg)->sub->name, (msg)->topic, (msg)->partition, \
								  (long long) (msg)->offset, (id) ? (id) : "(none)"

/* A malformed message: a duplicate if its event id is known, else a dead letter. */
static ObxInboxResult
apply_malformed(const ObxInbound *msg, const ObxInboundEvent *ev)
{
	const char *note;

	if (ev->event_id != NULL && !mark_processed(msg, ev))
	{
		record_progress(msg, ev, OBX_INBOX_DUPLICATE, NULL, NULL);
		return OBX_INBOX_DUPLICATE;
	}
	record_dead_letter(msg, ev, "malformed", NULL, ev->malformed_why);
	if (log_now(msg, "malformed", 0, &note))
		ereport(WARNING,
				(errmsg("obx consumer quarantined a malformed message: " LOG_CONTEXT_FMT,
						LOG_CONTEXT_ARGS(msg, ev->event_id)),
				 errdetail("Error class malformed: %s%s", ev->malformed_why, note),
				 errhint("See obx.dead_letters; fix the row and call obx.replay_dead_letter.")));
	record_progress(msg, ev, OBX_INBOX_DEAD_LETTER, "malformed", ev->malformed_why);
	return OBX_INBOX_DEAD_LETTER;
}

/* A transient handler error: errbuf says why; the caller rolls back. */
static ObxInboxResult
retry_handler_error(const ObxInbound *msg, const ObxInboundEvent *ev,
					const ErrorData *edata, char *errbuf, size_t errlen)
{
	const char *note;

	snprintf(errbuf, errlen, "handler error %s: %s",
			 unpack_sql_state(edata->sqlerrcode), edata->message);
	if (log_now(msg, "transient", edata->sqlerrcode, &note))
		ereport(LOG,
				(errmsg("obx consumer will retry a message: " LOG_CONTEXT_FMT,
						LOG_CONTEXT_ARGS(msg, ev->event_id)),
				 errdetail("Error class transient: %s%s", errbuf, note)));
	return OBX_INBOX_HANDLER_RETRY;
}

/*
 * Whether the handler has had all the attempts its subscription allows
 * (options.max_attempts) once this one failed: its transient error is
 * then a dead letter.
 */
static bool
attempts_spent(const ObxInbound *msg)
{
	return msg->sub->max_attempts > 0 &&
		   msg->handler_failures + 1 >= msg->sub->max_attempts;
}

/*
 * Any other handler error, or a transient one after the last attempt: a
 * dead letter, in the subtransaction of the mark.  A transient error given
 * up on says so in the dead letter's error message.
 */
static ObxInboxResult
dead_letter_handler_error(const ObxInbound *msg, const ObxInboundEvent *ev,
						  const ErrorData *edata, bool gave_up)
{
	char *sqlstate = pstrdup(unpack_sql_state(edata->sqlerrcode));
	char *message = !gave_up ? edata->message
							 : psprintf("%s (attempt %d of max_attempts %d)",
										edata->message, msg->handler_failures + 1,
										msg->sub->max_attempts);
	char *why = psprintf("%s: %s", sqlstate, message);
	const char *note;

	record_dead_letter(msg, ev, "handler", sqlstate, message);
	record_progress(msg, ev, OBX_INBOX_DEAD_LETTER, "handler", why);
	if (log_now(msg, "handler", edata->sqlerrcode, &note))
		ereport(WARNING,
				(errmsg(gave_up ? "obx consumer quarantined a message whose handler failed on every attempt: " LOG_CONTEXT_FMT
								: "obx consumer quarantined a message its handler rejected: " LOG_CONTEXT_FMT,
						LOG_CONTEXT_ARGS(msg, ev->event_id)),
				 errdetail("Error class handler: %s%s", why, note),
				 errhint("See obx.dead_letters; after a fix, call obx.replay_dead_letter.")));
	return OBX_INBOX_DEAD_LETTER;
}

/*
 * Steps 1 to 3 of the file header, in the message's subtransaction.  The
 * handler is called in it directly: its error rolls the subtransaction
 * back, mark included (see in_subtransaction).  A message whose handler
 * ended a worker, or failed in a group (a->known), gets that error without
 * a call: OBX_INBOX_RETRY with a->handler_error set, and the subtransaction
 * is rolled back.
 */
static ObxInboxResult
mark_and_handle(Attempt *a)
{
	const ObxSubscription *sub = a->msg->sub;
	Datum row;

	obx_inbound_build(a->msg, &a->ev);
	if (a->ev.malformed)
		return apply_malformed(a->msg, &a->ev);
	if (!mark_processed(a->msg, &a->ev))
	{
		record_progress(a->msg, &a->ev, OBX_INBOX_DUPLICATE, NULL, NULL);
		return OBX_INBOX_DUPLICATE;
	}
	a->handler_error = obx_handler_ended_a_worker(a->msg);
	a->timed_out = (a->handler_error != NULL);
	if (a->handler_error == NULL && a->known != NULL)
	{
		a->handler_error = a->known->error;
		a->timed_out = a->known->timed_out;
	}
	if (a->handler_error != NULL)
		return OBX_INBOX_RETRY;
	row = obx_inbound_row(a->msg, &a->ev);
	obx_handler_enter(a->msg);
	a->in_handler = true;
	obx_call_handler(sub->name, sub->handler, sub->owner, row,
					 sub->handler_timeout_ms);
	a->in_handler = false;
	obx_handler_leave();
	record_progress(a->msg, &a->ev, OBX_INBOX_PROCESSED, NULL, NULL);
	return OBX_INBOX_PROCESSED;
}

/*
 * After a handler error that is not retried, in a new subtransaction: the
 * mark and the dead letter.  The mark can only be there already if
 * another worker marked the event meanwhile: a duplicate then.
 */
static ObxInboxResult
mark_dead_letter(Attempt *a)
{
	if (!mark_processed(a->msg, &a->ev))
	{
		record_progress(a->msg, &a->ev, OBX_INBOX_DUPLICATE, NULL, NULL);
		return OBX_INBOX_DUPLICATE;
	}
	return dead_letter_handler_error(a->msg, &a->ev, a->handler_error, a->gave_up);
}

/*
 * In in_subtransaction's PG_CATCH: an error in obx's own statements.  The
 * message's subtransaction is rolled back and the message retried; errbuf
 * says why.
 */
static void
retry_after_obx_error(const ObxInbound *msg, char *errbuf, size_t errlen)
{
	ErrorData *edata = CopyErrorData();
	const char *note;

	FlushErrorState();
	RollbackAndReleaseCurrentSubTransaction();
	snprintf(errbuf, errlen, "obx error %s: %s",
			 unpack_sql_state(edata->sqlerrcode), edata->message);
	if (log_now(msg, "obx", edata->sqlerrcode, &note))
		ereport(WARNING,
				(errmsg("obx consumer will retry a message: " LOG_CONTEXT_FMT,
						LOG_CONTEXT_ARGS(msg, NULL)),
				 errdetail("%s%s", errbuf, note)));
	FreeErrorData(edata);
}

/* In a PG_CATCH around the batch's own steps: roll it all back. */
static void
abort_batch(char *errbuf, size_t errlen)
{
	ErrorData *edata;

	MemoryContextSwitchTo(batch.cxt);
	edata = CopyErrorData();
	FlushErrorState();
	AbortCurrentTransaction();
	snprintf(errbuf, errlen, "obx error %s: %s",
			 unpack_sql_state(edata->sqlerrcode), edata->message);
	ereport(WARNING,
			(errmsg("obx consumer rolled back a batch of consumer group \"%s\", its messages will be retried",
					batch.sub->name),
			 errdetail("%s", errbuf)));
	FreeErrorData(edata);
}

/*
 * obx_inbox_batch_begin
 *		Open the transaction of a batch of sub's messages.  Allocations
 *		that must outlive it go to the caller's memory context, which is
 *		current again on return.  False when it could not be opened
 *		(errbuf says why; nothing is open).
 */
bool
obx_inbox_batch_begin(const ObxSubscription *sub, char *errbuf, size_t errlen)
{
	volatile bool ok = true;

	batch.cxt = CurrentMemoryContext;
	batch.sub = sub;
	obx_progress_begin(sub->name);
	batch.subxids = 0;
	batch.subxids_overflowed = false;
	if (batch.apply_cxt == NULL)
		batch.apply_cxt = AllocSetContextCreate(TopMemoryContext, "obx inbox message",
												ALLOCSET_DEFAULT_SIZES);
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PG_TRY();
	{
		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "obx could not connect to SPI");
		PushActiveSnapshot(GetTransactionSnapshot());
		pgstat_report_activity(STATE_RUNNING, "obx: applying Kafka messages");
		inbox_prepare_plans();
	}
	PG_CATCH();
	{
		abort_batch(errbuf, errlen);
		ok = false;
	}
	PG_END_TRY();
	MemoryContextSwitchTo(batch.cxt);
	return ok;
}

/*
 * Run step(a) in a subtransaction: released when it returns a result, rolled
 * back when it returns OBX_INBOX_RETRY or raises.  The handler's error is
 * kept in a->handler_error, for the caller to decide on; any other error is
 * obx's own, transient, and errbuf says why.
 */
static ObxInboxResult
in_subtransaction(ObxInboxResult (*step)(Attempt *), Attempt *a,
				  char *errbuf, size_t errlen)
{
	ResourceOwner owner = CurrentResourceOwner;
	volatile ObxInboxResult result = OBX_INBOX_RETRY;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(batch.apply_cxt);
	PG_TRY();
	{
		result = step(a);
		if (result == OBX_INBOX_RETRY)
			RollbackAndReleaseCurrentSubTransaction();
		else
			ReleaseCurrentSubTransaction();
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(batch.apply_cxt);
		memset(&batch.pending, 0, sizeof(batch.pending));
		if (a->in_handler)
		{
			a->in_handler = false;
			obx_handler_leave();
			a->timed_out = obx_handler_timed_out();
			a->handler_error = CopyErrorData();
			FlushErrorState();
			RollbackAndReleaseCurrentSubTransaction();
		}
		else
			retry_after_obx_error(a->msg, errbuf, errlen);
		result = OBX_INBOX_RETRY;
	}
	PG_END_TRY();
	MemoryContextSwitchTo(batch.apply_cxt);
	CurrentResourceOwner = owner;
	return result;
}

/*
 * obx_inbox_apply
 *		Apply one message of the open batch in a subtransaction of its own;
 *		see the file header.  known, if not NULL, is the error its handler
 *		raised in a group (obx_inbox_apply_group): the handler is not called
 *		again.  On OBX_INBOX_RETRY (obx's own error) or
 *		OBX_INBOX_HANDLER_RETRY (a transient handler error, with attempts
 *		left), errbuf says why and the subtransaction was rolled back:
 *		nothing of the message remains.
 */
ObxInboxResult
obx_inbox_apply(const ObxInbound *msg, const ObxInboxFailure *known,
				char *errbuf, size_t errlen)
{
	Attempt a;
	ObxInboxResult result;

	errbuf[0] = '\0';
	memset(&batch.pending, 0, sizeof(batch.pending));
	memset(&a, 0, sizeof(a));
	a.msg = msg;
	a.known = (known != NULL && known->error != NULL) ? known : NULL;
	MemoryContextReset(batch.apply_cxt);
	result = in_subtransaction(mark_and_handle, &a, errbuf, errlen);
	if (a.handler_error != NULL)
	{
		bool transient = !a.timed_out &&
						 is_transient(msg->sub, a.handler_error->sqlerrcode);

		a.gave_up = transient && attempts_spent(msg);
		if (transient && !a.gave_up)
			result = retry_handler_error(msg, &a.ev, a.handler_error, errbuf, errlen);
		else
			result = in_subtransaction(mark_dead_letter, &a, errbuf, errlen);
	}
	MemoryContextSwitchTo(batch.cxt);
	if (!OBX_INBOX_RETRIED(result))
		obx_progress_count(msg, &batch.pending);
	return result;
}

/*
 * obx_inbox_count
 *		Count a message applied outside obx_inbox_apply (a group's, see
 *		inbox_group.c) for its partition's progress row: processed or a
 *		duplicate.
 */
void
obx_inbox_count(const ObxInbound *msg, ObxInboxResult result, const char *event_id)
{
	ObxOutcome outcome = {result, event_id, NULL, NULL};

	obx_progress_count(msg, &outcome);
}

/*
 * obx_inbox_batch_commit
 *		Write one progress row per partition the batch applied and commit.
 *		False when that failed: everything was rolled back, errbuf says
 *		why.
 */
bool
obx_inbox_batch_commit(char *errbuf, size_t errlen)
{
	volatile bool ok = true;

	errbuf[0] = '\0';
	PG_TRY();
	{
		obx_progress_write();
		batch.subxids = MyProc->subxidStatus.count;
		batch.subxids_overflowed = MyProc->subxidStatus.overflowed;
		SPI_finish();
		PopActiveSnapshot();
		CommitTransactionCommand();
	}
	PG_CATCH();
	{
		abort_batch(errbuf, errlen);
		ok = false;
	}
	PG_END_TRY();
	pgstat_report_stat(false);
	pgstat_report_activity(STATE_IDLE, NULL);
	MemoryContextSwitchTo(batch.cxt);
	return ok;
}

/*
 * obx_inbox_batch_subxids
 *		How many subtransaction ids the last committed batch's transaction
 *		took (the groups', the lone messages', and those of handlers with
 *		exception blocks that wrote), as far as the backend's cache of them
 *		counts (PGPROC_MAX_CACHED_SUBXIDS); *overflowed says that there were
 *		more.
 */
int
obx_inbox_batch_subxids(bool *overflowed)
{
	*overflowed = batch.subxids_overflowed;
	return batch.subxids;
}
