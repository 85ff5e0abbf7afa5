/*-------------------------------------------------------------------------
 *
 * inbox.c
 *	  Every statement the consumer worker runs: reading the subscriptions,
 *	  and the one transaction per Kafka message that marks the event
 *	  processed, calls the subscription's handler and records progress, or
 *	  quarantines the message as a dead letter.
 *
 * Per message, in one transaction:
 *	  1. the event id (header event_id, else the payload's eventId or
 *		 event_id) and the payload as jsonb; a message without either is
 *		 malformed and becomes a dead letter;
 *	  2. obx.mark_processed(consumer, event id); false means a duplicate, and
 *		 the handler is not called;
 *	  3. the handler, in a subtransaction, as the subscription's owner;
 *	  4. the partition's row in obx.consumer_partitions.
 * A handler error of a transient class (see is_transient) rolls the whole
 * transaction back, mark included: the caller must not move the offset
 * and retries the message later.  Any other handler error is recorded as
 * a dead letter in the same transaction that marks the event processed.
 * An error in obx's own statements is treated as transient: the message
 * is retried, never lost.
 *
 * The caller stores the Kafka offset only after this transaction has
 * committed (with synchronous_commit on), so a crash between the two
 * re-delivers the message, and step 2 makes it a duplicate.
 *
 * Every handler call, the worker's and obx.replay_dead_letter's (through
 * the SQL-callable obx._replay_handler here), goes through
 * obx_call_handler: as the subscription's owner, security-restricted,
 * inside a GUC nest level, under the subscription's handler_timeout_ms.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/regproc.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timeout.h"
#include "utils/timestamp.h"
#include "utils/typcache.h"

#include "obx.h"

static SPIPlanPtr mark_plan = NULL;
static SPIPlanPtr progress_plan = NULL;
static SPIPlanPtr dead_letter_plan = NULL;
static SPIPlanPtr retry_plan = NULL;
static SPIPlanPtr watermark_plan = NULL;

static const char *progress_sql =
	"INSERT INTO obx.consumer_partitions AS p"
	"   (consumer_name, topic, kafka_partition, next_offset, processed,"
	"    duplicates, dead_lettered, last_event_id, last_processed_at,"
	"    last_error_class, last_error, last_error_at)"
	" VALUES ($1, $2, $3, $4, $5, $6, $7, $8, pg_catalog.now(), $9, $10,"
	"         CASE WHEN $10 IS NOT NULL THEN pg_catalog.now() END)"
	" ON CONFLICT (consumer_name, topic, kafka_partition) DO UPDATE"
	"   SET next_offset = excluded.next_offset,"
	"       processed = p.processed + excluded.processed,"
	"       duplicates = p.duplicates + excluded.duplicates,"
	"       dead_lettered = p.dead_lettered + excluded.dead_lettered,"
	"       last_event_id = coalesce(excluded.last_event_id, p.last_event_id),"
	"       last_processed_at = excluded.last_processed_at,"
	"       last_error_class = coalesce(excluded.last_error_class, p.last_error_class),"
	"       last_error = coalesce(excluded.last_error, p.last_error),"
	"       last_error_at = coalesce(excluded.last_error_at, p.last_error_at)";

static const char *dead_letter_sql =
	"INSERT INTO obx.dead_letters"
	"   (consumer_name, event_id, topic, kafka_partition, kafka_offset,"
	"    event_key, event_type, headers, payload, raw_payload, kafka_timestamp,"
	"    error_class, error_sqlstate, error_message)"
	" VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)"
	" ON CONFLICT (consumer_name, topic, kafka_partition, kafka_offset) DO NOTHING";

static const char *retry_sql =
	"INSERT INTO obx.consumer_partitions AS p"
	"   (consumer_name, topic, kafka_partition, retries,"
	"    last_error_class, last_error, last_error_at)"
	" VALUES ($1, $2, $3, 1, 'transient', $4, pg_catalog.now())"
	" ON CONFLICT (consumer_name, topic, kafka_partition) DO UPDATE"
	"   SET retries = p.retries + 1, last_error_class = 'transient',"
	"       last_error = excluded.last_error, last_error_at = pg_catalog.now()";

static const char *watermark_sql =
	"INSERT INTO obx.consumer_partitions AS p"
	"   (consumer_name, topic, kafka_partition, low_watermark, high_watermark,"
	"    watermarks_at)"
	" SELECT $1, w.topic, w.part, w.low, w.high, pg_catalog.now()"
	"   FROM ROWS FROM (pg_catalog.unnest($2::pg_catalog.text[]),"
	"                   pg_catalog.unnest($3::pg_catalog.int4[]),"
	"                   pg_catalog.unnest($4::pg_catalog.int8[]),"
	"                   pg_catalog.unnest($5::pg_catalog.int8[]))"
	"        AS w(topic, part, low, high)"
	" ON CONFLICT (consumer_name, topic, kafka_partition) DO UPDATE"
	"   SET low_watermark = excluded.low_watermark,"
	"       high_watermark = excluded.high_watermark,"
	"       watermarks_at = excluded.watermarks_at";

/*
 * What the handler gets and what a dead letter records, built from the
 * Kafka message before anything is written.
 */
typedef struct InboundEvent
{
	char *event_id; /* NULL when there is none */
	char *event_type;
	char *key;
	Datum headers; /* jsonb */
	Datum payload; /* jsonb, valid when is_json */
	bool is_json;  /* the value parsed as JSON */
	bool malformed;
	char *malformed_why;
} InboundEvent;

static void
prepare_plans(void)
{
	if (mark_plan != NULL)
		return;
	{
		Oid types[] = {TEXTOID, TEXTOID};

		mark_plan = obx_prepare_kept("SELECT obx.mark_processed($1, $2)", 2, types);
	}
	{
		Oid types[] = {TEXTOID, TEXTOID, INT4OID, INT8OID, INT8OID, INT8OID,
					   INT8OID, TEXTOID, TEXTOID, TEXTOID};

		progress_plan = obx_prepare_kept(progress_sql, 10, types);
	}
	{
		Oid types[] = {TEXTOID, TEXTOID, TEXTOID, INT4OID, INT8OID, TEXTOID,
					   TEXTOID, JSONBOID, JSONBOID, BYTEAOID, TIMESTAMPTZOID,
					   TEXTOID, TEXTOID, TEXTOID};

		dead_letter_plan = obx_prepare_kept(dead_letter_sql, 14, types);
	}
	{
		Oid types[] = {TEXTOID, TEXTOID, INT4OID, TEXTOID};

		retry_plan = obx_prepare_kept(retry_sql, 4, types);
	}
	{
		Oid types[] = {TEXTOID, TEXTARRAYOID, INT4ARRAYOID, INT8ARRAYOID,
					   INT8ARRAYOID};

		watermark_plan = obx_prepare_kept(watermark_sql, 5, types);
	}
}

static char **
text_array(Datum d, int *n)
{
	Datum *elems;
	bool *nulls;
	char **out;
	int i;

	deconstruct_array(DatumGetArrayTypeP(d), TEXTOID, -1, false, TYPALIGN_INT,
					  &elems, &nulls, n);
	out = palloc(sizeof(char *) * Max(*n, 1));
	for (i = 0; i < *n; i++)
		out[i] = nulls[i] ? pstrdup("") : TextDatumGetCString(elems[i]);
	return out;
}

static char *
copy_text(HeapTuple tup, TupleDesc desc, int col)
{
	bool isnull;
	Datum d = SPI_getbinval(tup, desc, col, &isnull);

	return isnull ? NULL : TextDatumGetCString(d);
}

/*
 * options.handler_timeout_ms as obx.subscribe accepts it: a whole number of
 * milliseconds, 0 for none.  Anything else (the row may have been written
 * by hand) falls back to the default: a handler is never left unbounded by
 * mistake, and a bad row does not stop the worker.
 */
static int
parse_timeout(const char *text)
{
	char *end;
	double ms;

	if (text == NULL)
		return OBX_HANDLER_TIMEOUT_MS;
	errno = 0;
	ms = strtod(text, &end);
	if (errno != 0 || end == text || *end != '\0' || !(ms >= 0 && ms <= INT_MAX))
		return OBX_HANDLER_TIMEOUT_MS;
	return (int) ms;
}

/*
 * obx_inbox_subscriptions
 *		Every subscription, in name order, allocated in the caller's
 *		memory context.  A row the workers cannot serve (a bad row written
 *		directly, an owner or handler gone) comes with its problem set and
 *		nothing parsed from its options, so it cannot fail this read.
 */
ObxSubscription *
obx_inbox_subscriptions(int *count)
{
	MemoryContext caller = obx_step_begin("obx: reading subscriptions");
	ObxSubscription *subs;
	int rc;
	uint64 i;

	rc = SPI_execute(
		"SELECT s.consumer_name, s.topics, s.handler::pg_catalog.oid, s.owner::pg_catalog.oid,"
		"       p.oid IS NULL,"
		"       CASE WHEN q.problem IS NULL"
		"            THEN coalesce(s.options->>'start', 'earliest') END,"
		"       CASE WHEN q.problem IS NULL THEN"
		"       ARRAY(SELECT k.key FROM pg_catalog.jsonb_each_text(s.options->'kafka') k ORDER BY k.key) END,"
		"       CASE WHEN q.problem IS NULL THEN"
		"       ARRAY(SELECT k.value FROM pg_catalog.jsonb_each_text(s.options->'kafka') k ORDER BY k.key) END,"
		"       CASE WHEN q.problem IS NULL THEN"
		"       ARRAY(SELECT pg_catalog.jsonb_array_elements_text(s.options->'retry_sqlstates')) END,"
		"       pg_catalog.concat_ws('|', s.topics::pg_catalog.text, s.handler::pg_catalog.oid,"
		"                 s.owner::pg_catalog.oid,"
		"                 s.options::pg_catalog.text, p.oid IS NULL, q.problem),"
		"       q.problem,"
		"       CASE WHEN q.problem IS NULL THEN s.options->>'handler_timeout_ms' END"
		"  FROM obx.subscriptions s"
		"  LEFT JOIN pg_catalog.pg_proc p ON p.oid = s.handler"
		"  CROSS JOIN LATERAL (SELECT obx._subscription_problem(s) AS problem) q"
		" ORDER BY s.consumer_name",
		true, 0);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "obx could not read subscriptions: %s", SPI_result_code_string(rc));

	*count = (int) SPI_processed;
	subs = MemoryContextAllocZero(caller, sizeof(ObxSubscription) * Max(*count, 1));
	for (i = 0; i < SPI_processed; i++)
	{
		HeapTuple tup = SPI_tuptable->vals[i];
		TupleDesc desc = SPI_tuptable->tupdesc;
		ObxSubscription *s = &subs[i];
		MemoryContext spi = MemoryContextSwitchTo(caller);
		bool isnull;
		char **codes;
		int nkafka_values;
		int j;

		s->name = TextDatumGetCString(SPI_getbinval(tup, desc, 1, &isnull));
		s->topics = text_array(SPI_getbinval(tup, desc, 2, &isnull), &s->ntopics);
		s->handler = DatumGetObjectId(SPI_getbinval(tup, desc, 3, &isnull));
		s->owner = DatumGetObjectId(SPI_getbinval(tup, desc, 4, &isnull));
		s->handler_missing = DatumGetBool(SPI_getbinval(tup, desc, 5, &isnull));
		s->signature = TextDatumGetCString(SPI_getbinval(tup, desc, 10, &isnull));
		(void) SPI_getbinval(tup, desc, 11, &isnull);
		if (!isnull)
		{
			s->problem = TextDatumGetCString(SPI_getbinval(tup, desc, 11, &isnull));
			s->start = pstrdup("earliest");
			s->kafka_names = s->kafka_values = palloc0(sizeof(char *));
			s->retry_sqlstates = palloc0(sizeof(int));
			MemoryContextSwitchTo(spi);
			continue;
		}
		s->start = TextDatumGetCString(SPI_getbinval(tup, desc, 6, &isnull));
		s->kafka_names = text_array(SPI_getbinval(tup, desc, 7, &isnull), &s->nkafka);
		s->kafka_values = text_array(SPI_getbinval(tup, desc, 8, &isnull), &nkafka_values);
		codes = text_array(SPI_getbinval(tup, desc, 9, &isnull), &s->nretry);
		s->retry_sqlstates = palloc(sizeof(int) * Max(s->nretry, 1));
		for (j = 0; j < s->nretry; j++)
		{
			const char *c = codes[j];

			if (strlen(c) == 5)
				s->retry_sqlstates[j] = MAKE_SQLSTATE(c[0], c[1], c[2], c[3], c[4]);
		}
		s->handler_timeout_ms = parse_timeout(copy_text(tup, desc, 12));
		MemoryContextSwitchTo(spi);
	}
	obx_step_end(caller);
	return subs;
}

/*
 * Text of a key or header value: itself when it is valid in the database
 * encoding, else "\x" and its bytes in hex, so that binary keys and headers
 * from other producers still reach the handler (and nothing is dropped).
 */
static char *
as_text(const char *data, size_t len)
{
	StringInfoData buf;
	size_t i;

	if (pg_verifymbstr(data, (int) len, true))
		return pnstrdup(data, len);
	initStringInfo(&buf);
	appendStringInfoString(&buf, "\\x");
	for (i = 0; i < len; i++)
		appendStringInfo(&buf, "%02x", (unsigned char) data[i]);
	return buf.data;
}

static const char *
header_value(const ObxInbound *msg, const char *name)
{
	int i;

	/* The last header of that name wins, as in the headers object. */
	for (i = msg->nheaders - 1; i >= 0; i--)
		if (strcmp(msg->header_names[i], name) == 0)
			return msg->header_values[i] == NULL ? NULL
												 : as_text(msg->header_values[i], msg->header_lens[i]);
	return NULL;
}

static char *
jsonb_string_field(Jsonb *jb, const char *field)
{
	JsonbValue key;
	JsonbValue *v;

	if (!JB_ROOT_IS_OBJECT(jb))
		return NULL;
	key.type = jbvString;
	key.val.string.val = (char *) field;
	key.val.string.len = strlen(field);
	v = findJsonbValueFromContainer(&jb->root, JB_FOBJECT, &key);
	if (v == NULL || v->type != jbvString || v->val.string.len == 0)
		return NULL;
	return pnstrdup(v->val.string.val, v->val.string.len);
}

static Datum
headers_jsonb(const ObxInbound *msg)
{
	StringInfoData buf;
	int i;

	initStringInfo(&buf);
	appendStringInfoChar(&buf, '{');
	for (i = 0; i < msg->nheaders; i++)
	{
		if (i > 0)
			appendStringInfoString(&buf, ", ");
		escape_json(&buf, as_text(msg->header_names[i], strlen(msg->header_names[i])));
		appendStringInfoString(&buf, ": ");
		if (msg->header_values[i] == NULL)
			appendStringInfoString(&buf, "null");
		else
			escape_json(&buf, as_text(msg->header_values[i], msg->header_lens[i]));
	}
	appendStringInfoChar(&buf, '}');
	return DirectFunctionCall1(jsonb_in, CStringGetDatum(buf.data));
}

/*
 * Run fn(arg) in a subtransaction.  Returns NULL when it succeeded, else
 * the error, with the subtransaction rolled back and the caller's memory
 * context and resource owner restored.
 */
static ErrorData *
in_subtransaction(void (*fn)(void *), void *arg)
{
	MemoryContext cxt = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	ErrorData *volatile edata = NULL;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(cxt);
	PG_TRY();
	{
		fn(arg);
		ReleaseCurrentSubTransaction();
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
	}
	PG_END_TRY();
	MemoryContextSwitchTo(cxt);
	CurrentResourceOwner = owner;
	return edata;
}

typedef struct ParseArgs
{
	const ObxInbound *msg;
	InboundEvent *ev;
} ParseArgs;

static void
parse_payload(void *arg)
{
	ParseArgs *a = (ParseArgs *) arg;
	char *text = pnstrdup(a->msg->value, a->msg->value_len);

	if (!pg_verifymbstr(a->msg->value, (int) a->msg->value_len, true))
		ereport(ERROR,
				(errcode(ERRCODE_CHARACTER_NOT_IN_REPERTOIRE),
				 errmsg("message value is not valid %s", GetDatabaseEncodingName())));
	a->ev->payload = DirectFunctionCall1(jsonb_in, CStringGetDatum(text));
}

/*
 * Build what the handler gets from the Kafka message.  Never raises for
 * bad input: a message obx cannot turn into an event is marked malformed,
 * with the reason.
 */
static void
build_event(const ObxInbound *msg, InboundEvent *ev)
{
	memset(ev, 0, sizeof(*ev));
	ev->key = msg->key ? as_text(msg->key, msg->key_len) : NULL;
	ev->headers = headers_jsonb(msg);
	ev->event_id = (char *) header_value(msg, "event_id");
	ev->event_type = (char *) header_value(msg, "event_type");
	if (ev->event_id != NULL && ev->event_id[0] == '\0')
		ev->event_id = NULL;

	if (msg->value == NULL)
	{
		ev->malformed = true;
		ev->malformed_why = "message has no value (a tombstone)";
	}
	else
	{
		ParseArgs args = {msg, ev};
		ErrorData *edata = in_subtransaction(parse_payload, &args);

		if (edata != NULL)
		{
			ev->malformed = true;
			ev->malformed_why = psprintf("payload is not JSON: %s", edata->message);
		}
		else
			ev->is_json = true;
	}
	if (!ev->malformed)
	{
		Jsonb *jb = DatumGetJsonbP(ev->payload);

		if (ev->event_id == NULL)
			ev->event_id = jsonb_string_field(jb, "eventId");
		if (ev->event_id == NULL)
			ev->event_id = jsonb_string_field(jb, "event_id");
		if (ev->event_type == NULL)
			ev->event_type = jsonb_string_field(jb, "eventType");
	}
	if (ev->event_id != NULL && strlen(ev->event_id) > OBX_MAX_EVENT_ID_LEN)
	{
		/*
		 * It could never be marked processed (the dedupe index refuses it):
		 * retrying would block the partition forever.
		 */
		ev->malformed = true;
		ev->malformed_why = psprintf("event id is not valid: %zu bytes, at most %d allowed",
									 strlen(ev->event_id), OBX_MAX_EVENT_ID_LEN);
		ev->event_id = NULL;
	}
	else if (!ev->malformed && ev->event_id == NULL)
	{
		ev->malformed = true;
		ev->malformed_why = "no event id: no event_id header and no eventId or event_id field in the payload";
	}
}

static Datum
text_or_null(const char *s, char *null)
{
	*null = (s == NULL) ? 'n' : ' ';
	return s == NULL ? (Datum) 0 : CStringGetTextDatum(s);
}

static void
record_progress(const ObxInbound *msg, const InboundEvent *ev,
				ObxInboxResult result, const char *error_class,
				const char *error)
{
	Datum values[10];
	char nulls[10];
	int rc;

	memset(nulls, ' ', sizeof(nulls));
	values[0] = CStringGetTextDatum(msg->sub->name);
	values[1] = CStringGetTextDatum(msg->topic);
	values[2] = Int32GetDatum(msg->partition);
	values[3] = Int64GetDatum(msg->offset + 1);
	values[4] = Int64GetDatum(result == OBX_INBOX_PROCESSED ? 1 : 0);
	values[5] = Int64GetDatum(result == OBX_INBOX_DUPLICATE ? 1 : 0);
	values[6] = Int64GetDatum(result == OBX_INBOX_DEAD_LETTER ? 1 : 0);
	values[7] = text_or_null(ev->event_id, &nulls[7]);
	values[8] = text_or_null(error_class, &nulls[8]);
	values[9] = text_or_null(error, &nulls[9]);
	rc = SPI_execute_plan(progress_plan, values, nulls, false, 0);
	if (rc != SPI_OK_INSERT)
		elog(ERROR, "obx could not record consumer progress: %s",
			 SPI_result_code_string(rc));
}

static void
record_dead_letter(const ObxInbound *msg, const InboundEvent *ev,
				   const char *error_class, const char *sqlstate,
				   const char *error)
{
	Datum values[14];
	char nulls[14];
	int rc;

	memset(nulls, ' ', sizeof(nulls));
	values[0] = CStringGetTextDatum(msg->sub->name);
	values[1] = text_or_null(ev->event_id, &nulls[1]);
	values[2] = CStringGetTextDatum(msg->topic);
	values[3] = Int32GetDatum(msg->partition);
	values[4] = Int64GetDatum(msg->offset);
	values[5] = text_or_null(ev->key, &nulls[5]);
	values[6] = text_or_null(ev->event_type, &nulls[6]);
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
	values[12] = text_or_null(sqlstate, &nulls[12]);
	values[13] = CStringGetTextDatum(error);
	rc = SPI_execute_plan(dead_letter_plan, values, nulls, false, 0);
	if (rc != SPI_OK_INSERT)
		elog(ERROR, "obx could not record a dead letter: %s",
			 SPI_result_code_string(rc));
}

static bool
mark_processed(const ObxInbound *msg, const InboundEvent *ev)
{
	Datum values[2];
	bool isnull;
	int rc;

	values[0] = CStringGetTextDatum(msg->sub->name);
	values[1] = CStringGetTextDatum(ev->event_id);
	rc = SPI_execute_plan(mark_plan, values, NULL, false, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "obx.mark_processed failed: %s", SPI_result_code_string(rc));
	return DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0],
									  SPI_tuptable->tupdesc, 1, &isnull));
}

typedef struct HandlerArgs
{
	const ObxInbound *msg;
	const InboundEvent *ev;
} HandlerArgs;

/* The timer that stops a handler, registered once per process. */
static TimeoutId handler_timeout_id = MAX_TIMEOUTS;
static volatile sig_atomic_t handler_timed_out = false;
static volatile sig_atomic_t handler_cancels = 0;

/*
 * A consumer worker whose handler is still running this many cancels (one
 * a second) after its timeout ends itself (see handler_timeout_fired).
 */
#define OBX_HANDLER_GRACE_CANCELS 5

/* This consumer worker's slot in shared memory; NULL outside one (a replay). */
static ObxHandlerSlot *my_handler_slot = NULL;

/* Whether the last obx_call_handler ended by its timeout. */
static bool handler_timeout_hit = false;

/*
 * Timer callback (signal context): cancel what runs, as pg_cancel_backend
 * would.  It fires again every second until the handler has stopped, so a
 * handler that catches query_canceled is cancelled again.
 */
static void
handler_timeout_fired(void)
{
	handler_timed_out = true;

	/*
	 * A handler that catches query_canceled and goes on would hold the
	 * worker, and every subscription it serves, forever.  The consumer
	 * worker then ends (FATAL, restarted by the postmaster); its successor
	 * finds the message in its slot and dead-letters it without calling the
	 * handler again (obx_inbox_attach).
	 */
	if (my_handler_slot != NULL && ++handler_cancels > OBX_HANDLER_GRACE_CANCELS)
		ProcDiePending = true;
	InterruptPending = true;
	QueryCancelPending = true;
	SetLatch(MyLatch);
}

/*
 * obx_call_handler
 *		Call a subscription's handler on an obx.inbound_event, as the
 *		subscription's owner, for at most timeout_ms (0: no limit).
 *
 * The call runs the way PostgreSQL runs index expressions during VACUUM:
 * with the owner as the current user, in a security-restricted operation
 * (no SET ROLE, no temporary objects, no cursors or prepared statements
 * outliving it) and inside a GUC nest level that is unwound when it
 * returns, so no setting it changes (search_path included) survives it.
 * It sees search_path = pg_catalog, pg_temp whoever calls it: a handler
 * names its objects with their schema, or sets its own search_path in its
 * definition (CREATE FUNCTION ... SET search_path).
 *
 * When the timeout passes, the handler is cancelled and this raises
 * query_canceled saying so.  On any error the caller's (sub)transaction
 * abort restores the user and the settings; the timer is stopped here.
 */
void
obx_call_handler(Oid handler, Oid owner, Datum event, int timeout_ms)
{
	MemoryContext cxt = CurrentMemoryContext;
	FmgrInfo flinfo;
	Oid save_user;
	int save_sec;
	int save_nestlevel;
	char *name;
	LOCAL_FCINFO(fcinfo, 1);

	if (handler_timeout_id == MAX_TIMEOUTS)
		handler_timeout_id = RegisterTimeout(USER_TIMEOUT, handler_timeout_fired);

	GetUserIdAndSecContext(&save_user, &save_sec);
	SetUserIdAndSecContext(owner, save_sec | SECURITY_LOCAL_USERID_CHANGE |
									  SECURITY_RESTRICTED_OPERATION);
	save_nestlevel = NewGUCNestLevel();
	(void) set_config_option("search_path", "pg_catalog, pg_temp", PGC_SUSET,
							 PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);

	if (pg_proc_aclcheck(handler, owner, ACL_EXECUTE) != ACLCHECK_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("role \"%s\" may not execute the obx handler %s",
						GetUserNameFromId(owner, true), format_procedure(handler))));
	/* Its name for the timeout's error, looked up while nothing failed. */
	name = format_procedure(handler);
	fmgr_info(handler, &flinfo);
	InitFunctionCallInfoData(*fcinfo, &flinfo, 1, InvalidOid, NULL, NULL);
	fcinfo->args[0].value = event;
	fcinfo->args[0].isnull = false;

	handler_timed_out = false;
	handler_timeout_hit = false;
	handler_cancels = 0;
	if (timeout_ms > 0)
		enable_timeout_every(handler_timeout_id,
							 TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
														 timeout_ms),
							 1000);
	PG_TRY();
	{
		(void) FunctionCallInvoke(fcinfo);
	}
	PG_CATCH();
	{
		ErrorData *edata;

		disable_timeout(handler_timeout_id, false);
		if (!handler_timed_out)
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
	PG_END_TRY();
	disable_timeout(handler_timeout_id, false);

	/* A cancel the timer sent after the handler returned is not for us. */
	if (handler_timed_out)
	{
		QueryCancelPending = false;
		handler_timed_out = false;
	}
	AtEOXact_GUC(false, save_nestlevel);
	SetUserIdAndSecContext(save_user, save_sec);
}

/*
 * Call the handler with an obx.inbound_event, as the subscription's owner.
 * The subtransaction around it restores the user on error.
 */
static void
call_handler(void *arg)
{
	HandlerArgs *a = (HandlerArgs *) arg;
	const ObxInbound *msg = a->msg;
	const InboundEvent *ev = a->ev;
	Oid nsp = get_namespace_oid("obx", false);
	Oid typid = GetSysCacheOid2(TYPENAMENSP, Anum_pg_type_oid,
								CStringGetDatum("inbound_event"),
								ObjectIdGetDatum(nsp));
	TupleDesc desc;
	Datum values[9];
	bool nulls[9];
	HeapTuple tuple;

	if (!OidIsValid(typid))
		elog(ERROR, "obx type obx.inbound_event does not exist");
	desc = lookup_rowtype_tupdesc_copy(typid, -1);
	memset(nulls, false, sizeof(nulls));
	values[0] = CStringGetTextDatum(ev->event_id);
	values[1] = ev->event_type ? CStringGetTextDatum(ev->event_type) : (Datum) 0;
	nulls[1] = (ev->event_type == NULL);
	values[2] = CStringGetTextDatum(msg->topic);
	values[3] = Int32GetDatum(msg->partition);
	values[4] = Int64GetDatum(msg->offset);
	values[5] = ev->key ? CStringGetTextDatum(ev->key) : (Datum) 0;
	nulls[5] = (ev->key == NULL);
	values[6] = ev->headers;
	values[7] = ev->payload;
	values[8] = TimestampTzGetDatum(msg->timestamp);
	nulls[8] = (msg->timestamp == 0);
	tuple = heap_form_tuple(desc, values, nulls);

	obx_call_handler(msg->sub->handler, msg->sub->owner,
					 HeapTupleGetDatum(tuple), msg->sub->handler_timeout_ms);
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

static void
enter_handler(const ObxInbound *msg)
{
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

static void
leave_handler(void)
{
	if (my_handler_slot != NULL)
		my_handler_slot->active = false;
}

/*
 * Whether a consumer worker ended while this message's handler ran; the
 * mark is cleared, so only one worker dead-letters the message.
 */
static bool
ended_a_worker(const ObxInbound *msg)
{
	int i;

	if (my_handler_slot == NULL)
		return false;
	for (i = 0; i < OBX_MAX_WORKERS; i++)
	{
		ObxHandlerSlot *slot = &obx_shared->handlers[i];

		if (slot->killed && slot->victim.partition == msg->partition &&
			slot->victim.offset == msg->offset &&
			strcmp(slot->victim.topic, msg->topic) == 0 &&
			strcmp(slot->victim.consumer, msg->sub->name) == 0)
		{
			slot->killed = false;
			return true;
		}
	}
	return false;
}

static ErrorData *
ended_a_worker_error(const ObxInbound *msg)
{
	ErrorData *edata = palloc0(sizeof(ErrorData));

	edata->elevel = ERROR;
	edata->sqlerrcode = ERRCODE_QUERY_CANCELED;
	edata->message = psprintf("obx handler %s did not stop after its timeout of %d ms, and its consumer worker was restarted",
							  format_procedure(msg->sub->handler),
							  msg->sub->handler_timeout_ms);
	handler_timeout_hit = true;
	return edata;
}

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

/*
 * obx_inbox_handle
 *		Apply one Kafka message in one transaction; see the file header.
 *
 * On OBX_INBOX_RETRY, errbuf says why; nothing was committed.
 */
ObxInboxResult
obx_inbox_handle(const ObxInbound *msg, char *errbuf, size_t errlen)
{
	MemoryContext caller = CurrentMemoryContext;
	volatile ObxInboxResult result = OBX_INBOX_RETRY;

	errbuf[0] = '\0';
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PG_TRY();
	{
		InboundEvent ev;
		const char *note;

		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "obx could not connect to SPI");
		PushActiveSnapshot(GetTransactionSnapshot());
		pgstat_report_activity(STATE_RUNNING, "obx: handling a Kafka message");
		prepare_plans();

		build_event(msg, &ev);
		if (ev.malformed)
		{
			if (ev.event_id != NULL && !mark_processed(msg, &ev))
				result = OBX_INBOX_DUPLICATE;
			else
			{
				record_dead_letter(msg, &ev, "malformed", NULL, ev.malformed_why);
				result = OBX_INBOX_DEAD_LETTER;
				if (log_now(msg, "malformed", 0, &note))
					ereport(WARNING,
							(errmsg("obx consumer quarantined a malformed message: " LOG_CONTEXT_FMT,
									LOG_CONTEXT_ARGS(msg, ev.event_id)),
							 errdetail("Error class malformed: %s%s", ev.malformed_why, note),
							 errhint("See obx.dead_letters; fix the row and call obx.replay_dead_letter.")));
			}
			record_progress(msg, &ev, result,
							result == OBX_INBOX_DEAD_LETTER ? "malformed" : NULL,
							result == OBX_INBOX_DEAD_LETTER ? ev.malformed_why : NULL);
		}
		else if (!mark_processed(msg, &ev))
		{
			result = OBX_INBOX_DUPLICATE;
			record_progress(msg, &ev, result, NULL, NULL);
		}
		else
		{
			HandlerArgs args = {msg, &ev};
			ErrorData *edata;

			if (ended_a_worker(msg))
				edata = ended_a_worker_error(msg);
			else
			{
				enter_handler(msg);
				edata = in_subtransaction(call_handler, &args);
				leave_handler();
			}

			if (edata == NULL)
			{
				result = OBX_INBOX_PROCESSED;
				record_progress(msg, &ev, result, NULL, NULL);
			}
			else if (!handler_timeout_hit &&
					 is_transient(msg->sub, edata->sqlerrcode))
			{
				snprintf(errbuf, errlen, "handler error %s: %s",
						 unpack_sql_state(edata->sqlerrcode), edata->message);
				if (log_now(msg, "transient", edata->sqlerrcode, &note))
					ereport(LOG,
							(errmsg("obx consumer will retry a message: " LOG_CONTEXT_FMT,
									LOG_CONTEXT_ARGS(msg, ev.event_id)),
							 errdetail("Error class transient: %s%s", errbuf, note)));
				result = OBX_INBOX_RETRY;
			}
			else
			{
				char *why = psprintf("%s: %s", unpack_sql_state(edata->sqlerrcode),
									 edata->message);

				record_dead_letter(msg, &ev, "handler",
								   unpack_sql_state(edata->sqlerrcode), edata->message);
				result = OBX_INBOX_DEAD_LETTER;
				record_progress(msg, &ev, result, "handler", why);
				if (log_now(msg, "handler", edata->sqlerrcode, &note))
					ereport(WARNING,
							(errmsg("obx consumer quarantined a message its handler rejected: " LOG_CONTEXT_FMT,
									LOG_CONTEXT_ARGS(msg, ev.event_id)),
							 errdetail("Error class handler: %s%s", why, note),
							 errhint("See obx.dead_letters; after a fix, call obx.replay_dead_letter.")));
			}
		}

		if (result == OBX_INBOX_RETRY)
			AbortCurrentTransaction();
		else
		{
			SPI_finish();
			PopActiveSnapshot();
			CommitTransactionCommand();
		}
	}
	PG_CATCH();
	{
		ErrorData *edata;
		const char *note;

		MemoryContextSwitchTo(caller);
		edata = CopyErrorData();
		FlushErrorState();
		AbortCurrentTransaction();
		snprintf(errbuf, errlen, "obx error %s: %s",
				 unpack_sql_state(edata->sqlerrcode), edata->message);
		if (log_now(msg, "obx", edata->sqlerrcode, &note))
			ereport(WARNING,
					(errmsg("obx consumer will retry a message: " LOG_CONTEXT_FMT,
							LOG_CONTEXT_ARGS(msg, NULL)),
					 errdetail("%s%s", errbuf, note)));
		FreeErrorData(edata);
		result = OBX_INBOX_RETRY;
	}
	PG_END_TRY();

	pgstat_report_stat(false);
	pgstat_report_activity(STATE_IDLE, NULL);
	MemoryContextSwitchTo(caller);
	return result;
}

/*
 * obx_inbox_note_retry
 *		Count a transient failure of a message and keep its error, in a
 *		transaction of its own (the message's was rolled back).
 */
void
obx_inbox_note_retry(const ObxInbound *msg, const char *error)
{
	MemoryContext caller = obx_step_begin("obx: recording a consumer retry");
	Datum values[4];
	int rc;

	prepare_plans();
	values[0] = CStringGetTextDatum(msg->sub->name);
	values[1] = CStringGetTextDatum(msg->topic);
	values[2] = Int32GetDatum(msg->partition);
	values[3] = CStringGetTextDatum(error);
	rc = SPI_execute_plan(retry_plan, values, NULL, false, 0);
	if (rc != SPI_OK_INSERT)
		elog(ERROR, "obx could not record a consumer retry: %s",
			 SPI_result_code_string(rc));
	obx_step_end(caller);
}

/*
 * obx_inbox_watermarks
 *		Record the partitions' low and high watermarks, for the lag.
 */
void
obx_inbox_watermarks(const char *consumer, int n, char **topics,
					 int32 *partitions, int64 *lows, int64 *highs)
{
	MemoryContext caller = obx_step_begin("obx: recording consumer watermarks");
	Datum *t = palloc(sizeof(Datum) * n);
	Datum *p = palloc(sizeof(Datum) * n);
	Datum *l = palloc(sizeof(Datum) * n);
	Datum *h = palloc(sizeof(Datum) * n);
	Datum values[5];
	int rc;
	int i;

	prepare_plans();
	for (i = 0; i < n; i++)
	{
		t[i] = CStringGetTextDatum(topics[i]);
		p[i] = Int32GetDatum(partitions[i]);
		l[i] = Int64GetDatum(lows[i]);
		h[i] = Int64GetDatum(highs[i]);
	}
	values[0] = CStringGetTextDatum(consumer);
	values[1] = PointerGetDatum(construct_array(t, n, TEXTOID, -1, false, TYPALIGN_INT));
	values[2] = PointerGetDatum(construct_array(p, n, INT4OID, 4, true, TYPALIGN_INT));
	values[3] = PointerGetDatum(construct_array(l, n, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	values[4] = PointerGetDatum(construct_array(h, n, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	rc = SPI_execute_plan(watermark_plan, values, NULL, false, 0);
	if (rc != SPI_OK_INSERT)
		elog(ERROR, "obx could not record consumer watermarks: %s",
			 SPI_result_code_string(rc));
	obx_step_end(caller);
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
	Oid handler;
	Oid owner;
	int rc;

	args[0] = Int64GetDatum(id);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "obx could not connect to SPI");
	rc = SPI_execute_with_args(
		"SELECT s.handler::pg_catalog.oid, s.owner::pg_catalog.oid,"
		"       s.options->>'handler_timeout_ms',"
		"       ROW(d.event_id, d.event_type, d.topic, d.kafka_partition,"
		"           d.kafka_offset, d.event_key, d.headers, d.payload,"
		"           d.kafka_timestamp)::obx.inbound_event"
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
	handler = DatumGetObjectId(SPI_getbinval(tup, desc, 1, &isnull));
	owner = DatumGetObjectId(SPI_getbinval(tup, desc, 2, &isnull));
	obx_call_handler(handler, owner, SPI_getbinval(tup, desc, 4, &isnull),
					 parse_timeout(copy_text(tup, desc, 3)));
	SPI_finish();
	PG_RETURN_VOID();
}
