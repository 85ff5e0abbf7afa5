/*-------------------------------------------------------------------------
 *
 * enqueue.c
 *	  SQL-callable functions of the application side: obx.enqueue, which
 *	  validates an event and inserts it into the outbox in the caller's
 *	  transaction, obx.enqueue_tombstone, and the commit-time wake-up of
 *	  the relay workers; the checks obx.enqueue_many (enqueue_many.c)
 *	  shares (enqueue.h).
 *
 * Every check happens here, inside the caller's transaction, so bad input
 * fails the statement that made it and never reaches the relay.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "obx.h"
#include "enqueue.h"
#include "status.h"
#include "trace.h"
#include "turns.h"
#include "worker.h"

#define OBX_MAX_TOPIC_LEN 249
#define OBX_MAX_KEY_LEN   1024

PG_FUNCTION_INFO_V1(obx_enqueue);
PG_FUNCTION_INFO_V1(obx_wake);
PG_FUNCTION_INFO_V1(obx_enqueue_tombstone);

static SPIPlanPtr insert_plan = NULL;     /* for ids given, in 1.0's table only */
static SPIPlanPtr insert_new_plan = NULL; /* for new ids (event_id.c checks given ones) */
static SPIPlanPtr existing_plan = NULL;   /* 1.0's table only */
static bool plans_1_0 = false;            /* prepared for 1.0's table */
static bool wake_at_commit = false;
static bool async_commit_announced = false; /* see obx_async_commit_starting */
static bool callback_registered = false;

/*
 * Kafka's own rule for topic names: 1 to 249 characters of [a-zA-Z0-9._-],
 * and neither "." nor "..".
 */
static void
check_topic_name(const char *topic)
{
	size_t len = strlen(topic);
	const char *p;

	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("obx topic name must not be empty")));
	if (len > OBX_MAX_TOPIC_LEN)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("obx topic name is too long"),
				 errdetail("Kafka topic names have at most %d characters; this one has %zu.",
						   OBX_MAX_TOPIC_LEN, len)));
	if (strcmp(topic, ".") == 0 || strcmp(topic, "..") == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid obx topic name \"%s\"", topic)));
	for (p = topic; *p; p++)
	{
		if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
			  (*p >= '0' && *p <= '9') || *p == '.' || *p == '_' || *p == '-'))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("invalid obx topic name \"%s\"", topic),
					 errdetail("Kafka topic names may contain only ASCII letters, digits, \".\", \"_\" and \"-\".")));
	}
}

/*
 * topic_allowed
 *		Whether obx.topics lets the topic through.
 *
 * obx.topics is a comma-separated list; an entry ending in "*" matches by
 * prefix, and "*" alone matches everything.  Blanks around entries are
 * ignored.
 */
static bool
topic_allowed(const char *topic)
{
	const char *p = obx_topics ? obx_topics : "";

	while (*p)
	{
		const char *start;
		const char *end;
		size_t len;

		while (*p == ' ' || *p == '\t' || *p == ',')
			p++;
		start = p;
		while (*p && *p != ',')
			p++;
		end = p;
		while (end > start && (end[-1] == ' ' || end[-1] == '\t'))
			end--;
		len = end - start;
		if (len == 0)
			continue;
		if (start[len - 1] == '*')
		{
			if (strncmp(topic, start, len - 1) == 0)
				return true;
		}
		else if (strlen(topic) == len && strncmp(topic, start, len) == 0)
			return true;
	}
	return false;
}

/*
 * The headers: a JSON object of strings, not naming obx's own, that with
 * the payload's payload_len bytes fits obx.max_payload_size.
 */
static void
check_headers(Jsonb *headers, size_t payload_len)
{
	JsonbIterator *it;
	JsonbValue v;
	JsonbIteratorToken tok;
	char *key = NULL;
	char *headers_text;

	if (!JB_ROOT_IS_OBJECT(headers) || JB_ROOT_IS_SCALAR(headers))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("obx event headers must be a JSON object of strings")));

	it = JsonbIteratorInit(&headers->root);
	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		if (tok == WJB_KEY)
		{
			key = pnstrdup(v.val.string.val, v.val.string.len);
			if (key[0] == '\0')
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("obx event header names must not be empty")));
			if (strcmp(key, "event_id") == 0 || strcmp(key, "event_type") == 0)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("obx event header \"%s\" is reserved", key),
						 errdetail("obx sets event_id and event_type itself; pass the type as event_type.")));
		}
		else if (tok == WJB_VALUE)
		{
			if (v.type != jbvString)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("obx event header \"%s\" must be a string", key)));
		}
	}
	headers_text = JsonbToCString(NULL, &headers->root, VARSIZE(headers));
	if (payload_len + strlen(headers_text) > (size_t) obx_max_payload_size)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("obx event headers are too large"),
				 errdetail("The headers have %zu bytes of JSON and the payload %zu; together they may have at most obx.max_payload_size = %d.",
						   strlen(headers_text), payload_len, obx_max_payload_size)));
}

/*
 * A time-ordered UUID (version 7): 48 bits of Unix milliseconds, then
 * random bits.  Ordering of events never depends on it (the sequence does);
 * time order only keeps the primary key index compact.
 */
void
obx_enqueue_make_id(pg_uuid_t *uuid)
{
	TimestampTz now = GetCurrentTimestamp();
	uint64 unix_ms;
	int i;

	unix_ms = (uint64) (now / 1000) +
			  (uint64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * SECS_PER_DAY * 1000;
	for (i = 0; i < 6; i++)
		uuid->data[i] = (unix_ms >> (8 * (5 - i))) & 0xff;
	if (!pg_strong_random(&uuid->data[6], UUID_LEN - 6))
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not generate random values for an obx event id")));
	uuid->data[6] = 0x70 | (uuid->data[6] & 0x0f);
	uuid->data[8] = 0x80 | (uuid->data[8] & 0x3f);
}

static void
wake_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
			/* The relay flushes such a commit before it publishes its events. */
			if (wake_at_commit && synchronous_commit == SYNCHRONOUS_COMMIT_OFF &&
				!async_commit_announced)
			{
				obx_async_commit_starting();
				async_commit_announced = true;
			}
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
			if (async_commit_announced)
				obx_async_commit_done(XactLastCommitEnd);
			async_commit_announced = false;
			if (wake_at_commit)
				obx_wake_workers();
			wake_at_commit = false;
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PREPARE:
			/*
			 * COMMIT PREPARED is always flushed, and wakes nobody: the poll
			 * finds those events.  XactLastCommitEnd is this transaction's
			 * commit end if an error came after its commit record, an older
			 * one otherwise: either is safe to report.
			 */
			if (async_commit_announced)
				obx_async_commit_done(XactLastCommitEnd);
			async_commit_announced = false;
			wake_at_commit = false;
			break;
		default:
			break;
	}
}

/*
 * Arrange for the relay workers to be woken when the current transaction
 * commits.  The callback runs after the commit is visible to other
 * backends, so a woken worker finds the new rows.
 */
void
obx_enqueue_wake_at_commit(void)
{
	if (!callback_registered)
	{
		RegisterXactCallback(wake_callback, NULL);
		callback_registered = true;
	}
	wake_at_commit = true;
}

text *
obx_enqueue_required_text(FunctionCallInfo fcinfo, int argno, const char *what)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("obx event %s must not be null", what)));
	return PG_GETARG_TEXT_PP(argno);
}

/*
 * Whether this database still has obx 1.0's outbox table: the library was
 * updated and ALTER EXTENSION obx UPDATE has not run yet.  obx.enqueue
 * then inserts into obx.outbox_events, which the update carries over into
 * obx.events (obx--1.0--1.1.sql), so the application keeps enqueueing
 * through the upgrade.  A database still at 1.1 has obx.events with every
 * column these statements name (1.2 adds era, whose default the update
 * gives the rows there are: obx--1.1--1.2.sql), and takes the same plans
 * as 1.2.  The relay publishes nothing until the update (worker.c).
 */
bool
obx_enqueue_schema_is_1_0(void)
{
	Oid nsp = get_namespace_oid("obx", true);

	return OidIsValid(nsp) && !OidIsValid(get_relname_relid("events", nsp));
}

/* Counts the times the plans were prepared, for enqueue_many.c's own. */
int obx_enqueue_plans_epoch = 0;

/*
 * Every name in these statements is schema-qualified, the one operator
 * included, so this SECURITY DEFINER function resolves nothing through the
 * caller's search_path.  The plans are prepared again once ALTER
 * EXTENSION obx UPDATE has invalidated them (see obx_enqueue_schema_is_1_0).
 */
void
obx_enqueue_prepare_plans(void)
{
	Oid insert_types[7] = {UUIDOID, TEXTOID, TEXTOID, TEXTOID,
						   TEXTOID, JSONBOID, JSONBOID};
	Oid existing_types[1] = {UUIDOID};
	bool v10;

	if (insert_new_plan != NULL && SPI_plan_is_valid(insert_new_plan) &&
		(!plans_1_0 || (SPI_plan_is_valid(insert_plan) && SPI_plan_is_valid(existing_plan))))
		return;
	if (insert_new_plan != NULL)
		SPI_freeplan(insert_new_plan);
	if (insert_plan != NULL)
		SPI_freeplan(insert_plan);
	if (existing_plan != NULL)
		SPI_freeplan(existing_plan);
	insert_plan = existing_plan = NULL;
	v10 = obx_enqueue_schema_is_1_0();
	plans_1_0 = v10;
	obx_enqueue_plans_epoch++;

	/*
	 * A generated id is new (48 bits of time, 74 random): its insert needs
	 * no speculative insertion and no look-up, which cost a good part of a
	 * one-row insert.  In 1.1 a given id is looked up first
	 * (obx_enqueue_given) and then inserted with the same plan.
	 */
	insert_new_plan = obx_prepare_kept(
		v10 ? "INSERT INTO obx.outbox_events "
			  "(id, aggregate_id, topic, event_key, event_type, headers, payload) "
			  "VALUES ($1, $2, $3, $4, $5, $6, $7)"
			: "INSERT INTO obx.events "
			  "(id, aggregate_id, topic, event_key, event_type, headers, payload) "
			  "VALUES ($1, $2, $3, $4, $5, $6, $7)",
		7, insert_types);
	if (!v10)
		return;

	/*
	 * In 1.0's table one unique index sees every id: a given id that is
	 * there already is not inserted (ON CONFLICT), and is then compared
	 * (obx_enqueue_check_existing).
	 */
	insert_plan = obx_prepare_kept(
		"INSERT INTO obx.outbox_events "
		"(id, aggregate_id, topic, event_key, event_type, headers, payload) "
		"VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (id) DO NOTHING",
		7, insert_types);
	existing_plan = obx_prepare_kept(
		"SELECT topic, event_key, coalesce(payload::pg_catalog.text, ''), "
		"coalesce(event_type, ''), coalesce(headers::pg_catalog.text, ''), "
		"aggregate_id "
		"FROM obx.outbox_events WHERE id OPERATOR(pg_catalog.=) $1",
		1, existing_types);
}

static bool
same_text(HeapTuple tup, TupleDesc desc, int col, const char *expected)
{
	char *value = SPI_getvalue(tup, desc, col);

	return value != NULL && strcmp(value, expected) == 0;
}

/*
 * An event id given twice, in 1.0's table: a no-op returning the id when
 * the event is the same (a retried business action), an error when it
 * differs.  1.1 looks given ids up in event_id.c instead.
 */
void
obx_enqueue_check_existing(Datum id, const char *topic, const char *key, const char *aggregate_id,
						   Jsonb *payload, const char *event_type, Jsonb *headers)
{
	Datum values[1] = {id};
	int rc;
	HeapTuple tup;
	TupleDesc desc;
	char *payload_text;
	char *headers_text;

	rc = SPI_execute_plan(existing_plan, values, NULL, false, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "obx enqueue lookup failed: %s", SPI_result_code_string(rc));
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNIQUE_VIOLATION),
				 errmsg("obx event id %s is already in use",
						DatumGetCString(DirectFunctionCall1(uuid_out, id))),
				 errdetail("The event with this id is not visible to this transaction's snapshot.")));

	tup = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	payload_text = payload ? JsonbToCString(NULL, &payload->root, VARSIZE(payload)) : "";
	headers_text = headers ? JsonbToCString(NULL, &headers->root, VARSIZE(headers)) : "";
	if (!same_text(tup, desc, 1, topic) ||
		!same_text(tup, desc, 2, key) ||
		!same_text(tup, desc, 3, payload_text) ||
		!same_text(tup, desc, 4, event_type ? event_type : "") ||
		!same_text(tup, desc, 5, headers_text) ||
		!same_text(tup, desc, 6, aggregate_id))
		ereport(ERROR,
				(errcode(ERRCODE_UNIQUE_VIOLATION),
				 errmsg("obx event id %s already exists with different content",
						DatumGetCString(DirectFunctionCall1(uuid_out, id))),
				 errdetail("Enqueueing an existing event id is a no-op only when topic, key, payload, aggregate id, event type and headers are the same."),
				 errhint("Give a new event its own id, or omit the id to have one generated.")));
}

/* The topic: a valid Kafka topic name that obx.topics lets through. */
void
obx_enqueue_check_topic(const char *topic)
{
	check_topic_name(topic);
	if (!topic_allowed(topic))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("obx topic \"%s\" is not allowed", topic),
				 errdetail("obx.topics is \"%s\".", obx_topics ? obx_topics : ""),
				 errhint("Add the topic, or a prefix ending in *, to obx.topics.")));
}

/* The key: not empty, at most OBX_MAX_KEY_LEN bytes. */
static void
check_key(const char *key)
{
	if (key[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("obx event key must not be empty"),
				 errhint("Use the aggregate's id, e.g. the order id, so its events keep their order.")));
	if (strlen(key) > OBX_MAX_KEY_LEN)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("obx event key is too long"),
				 errdetail("Keys have at most %d bytes; this one has %zu.",
						   OBX_MAX_KEY_LEN, strlen(key))));
}

/* A JSON object of at most obx.max_payload_size bytes; returns its size. */
static size_t
check_payload(Jsonb *payload)
{
	size_t payload_len;

	if (!JB_ROOT_IS_OBJECT(payload) || JB_ROOT_IS_SCALAR(payload))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("obx event payload must be a JSON object"),
				 errhint("Wrap the data in an object with explicit fields, e.g. {\"eventType\": ..., \"orderId\": ...}.")));
	payload_len = strlen(JsonbToCString(NULL, &payload->root, VARSIZE(payload)));
	if (payload_len > (size_t) obx_max_payload_size)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("obx event payload is too large"),
				 errdetail("The payload has %zu bytes of JSON; obx.max_payload_size is %d.",
						   payload_len, obx_max_payload_size)));
	return payload_len;
}

/*
 * check_event
 *		Check an event's key, payload (none for a tombstone), aggregate id,
 *		event type and headers, in that order (the topic is checked by the
 *		caller).
 */
void
obx_enqueue_check_event(const EnqueueEvent *ev)
{
	size_t payload_len;

	check_key(ev->key);
	payload_len = ev->payload ? check_payload(ev->payload) : 0;
	if (ev->aggregate_id && ev->aggregate_id[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("obx aggregate id must not be empty"),
				 errhint("Pass NULL to use the event key.")));
	if (ev->event_type && ev->event_type[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("obx event type must not be empty"),
				 errhint("Pass NULL when the event has no type.")));
	if (ev->headers)
		check_headers(ev->headers, payload_len);
}

/*
 * Read obx.enqueue's arguments into ev and check them: first that topic,
 * key and payload are given (a tombstone has no payload), then the topic,
 * then the rest (check_event); then the trace context goes into the
 * headers (obx_trace_headers).  The id is generated when none is given.
 */
static void
read_event(FunctionCallInfo fcinfo, EnqueueEvent *ev, bool tombstone)
{
	memset(ev, 0, sizeof(EnqueueEvent));
	ev->topic = text_to_cstring(obx_enqueue_required_text(fcinfo, 0, "topic"));
	ev->key = text_to_cstring(obx_enqueue_required_text(fcinfo, 1, "key"));
	if (PG_ARGISNULL(2) && !tombstone)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("obx event payload must not be null"),
				 errhint("To delete the key from a compacted topic, use obx.enqueue_tombstone.")));
	ev->payload = tombstone ? NULL : PG_GETARG_JSONB_P(2);
	if (!PG_ARGISNULL(3))
		ev->aggregate_id = text_to_cstring(PG_GETARG_TEXT_PP(3));
	if (!PG_ARGISNULL(4))
		ev->event_type = text_to_cstring(PG_GETARG_TEXT_PP(4));
	if (!PG_ARGISNULL(5))
		ev->headers = PG_GETARG_JSONB_P(5);
	obx_enqueue_check_topic(ev->topic);
	obx_enqueue_check_event(ev);
	ev->headers = obx_trace_headers(ev->headers);
	if (PG_ARGISNULL(6))
	{
		ev->id = palloc(sizeof(pg_uuid_t));
		obx_enqueue_make_id(ev->id);
	}
	else
	{
		ev->id = PG_GETARG_UUID_P(6);
		ev->id_given = true;
	}
}

/*
 * obx_enqueue_insert
 *		Insert the checked event, in the caller's transaction; returns
 *		whether it was inserted, false when its id was there already with
 *		the same content (a given id: obx_enqueue_given, event_id.c).
 */
bool
obx_enqueue_insert(const EnqueueEvent *ev)
{
	const char *aggregate_id = ev->aggregate_id ? ev->aggregate_id : ev->key;
	Datum values[7];
	char nulls[7] = {' ', ' ', ' ', ' ', ' ', ' ', ' '};
	bool inserted;
	int rc;

	values[0] = UUIDPGetDatum(ev->id);
	values[1] = CStringGetTextDatum(aggregate_id);
	values[2] = CStringGetTextDatum(ev->topic);
	values[3] = CStringGetTextDatum(ev->key);
	values[4] = ev->event_type ? CStringGetTextDatum(ev->event_type) : (Datum) 0;
	nulls[4] = ev->event_type ? ' ' : 'n';
	values[5] = ev->headers ? JsonbPGetDatum(ev->headers) : (Datum) 0;
	nulls[5] = ev->headers ? ' ' : 'n';
	values[6] = ev->payload ? JsonbPGetDatum(ev->payload) : (Datum) 0;
	nulls[6] = ev->payload ? ' ' : 'n';

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "obx could not connect to SPI");
	obx_enqueue_prepare_plans();
	if (ev->id_given && !plans_1_0)
	{
		inserted = obx_enqueue_given(ev, insert_new_plan, values, nulls);
		SPI_finish();
		return inserted;
	}
	rc = SPI_execute_plan(ev->id_given ? insert_plan : insert_new_plan,
						  values, nulls, false, 0);
	if (rc != SPI_OK_INSERT)
		elog(ERROR, "obx enqueue insert failed: %s", SPI_result_code_string(rc));
	inserted = (SPI_processed == 1);
	if (!inserted)
		obx_enqueue_check_existing(values[0], ev->topic, ev->key, aggregate_id,
								   ev->payload, ev->event_type, ev->headers);
	SPI_finish();
	return inserted;
}

/*
 * obx.enqueue(topic, event_key, payload, aggregate_id, event_type, headers,
 *			   event_id) returns uuid
 *
 * Validates the event, inserts it into obx.events in the caller's
 * transaction and returns its id.  The event exists if and only if the
 * caller commits.
 */
Datum
obx_enqueue(PG_FUNCTION_ARGS)
{
	EnqueueEvent ev;

	obx_warn_if_unserved();
	read_event(fcinfo, &ev, false);
	if (obx_enqueue_insert(&ev))
		obx_enqueue_wake_at_commit();
	PG_RETURN_UUID_P(ev.id);
}

/*
 * obx.enqueue_tombstone(topic, event_key, aggregate_id, event_type,
 *						 headers, event_id) returns uuid
 *
 * obx.enqueue without a payload: the relay publishes the key with a null
 * value (a tombstone, which deletes the key from a compacted topic), in
 * seq order with the key's other events.  Its arguments are obx.enqueue's
 * with the payload left out.
 */
Datum
obx_enqueue_tombstone(PG_FUNCTION_ARGS)
{
	LOCAL_FCINFO(args, 7);
	EnqueueEvent ev;
	int i;

	obx_warn_if_unserved();
	InitFunctionCallInfoData(*args, fcinfo->flinfo, 7, fcinfo->fncollation,
							 NULL, NULL);
	for (i = 0; i < 7; i++)
	{
		args->args[i].value = i == 2 ? (Datum) 0 : fcinfo->args[i < 2 ? i : i - 1].value;
		args->args[i].isnull = i == 2 || fcinfo->args[i < 2 ? i : i - 1].isnull;
	}
	read_event(args, &ev, true);
	if (obx_enqueue_insert(&ev))
		obx_enqueue_wake_at_commit();
	PG_RETURN_UUID_P(ev.id);
}

/*
 * obx._wake_at_commit() returns void
 *
 * Used by the operator functions (retry, replay) so that the events they
 * make publishable go out at commit instead of at the next poll.
 */
Datum
obx_wake(PG_FUNCTION_ARGS)
{
	obx_enqueue_wake_at_commit();
	PG_RETURN_VOID();
}
