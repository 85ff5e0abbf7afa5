/*-------------------------------------------------------------------------
 *
 * enqueue_many.c
 *	  obx.enqueue_many: obx.enqueue for arrays of events of one topic,
 *	  each element checked as obx.enqueue checks its arguments (enqueue.h),
 *	  all inserted in array order by one statement.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/uuid.h"

#include "obx.h"
#include "enqueue.h"
#include "status.h"
#include "trace.h"
#include "worker.h"

/* obx.enqueue_many's array arguments: event_keys ... event_ids. */
#define OBX_MANY_ARRAYS 6

PG_FUNCTION_INFO_V1(obx_enqueue_many);

static SPIPlanPtr insert_many_plan = NULL;
static SPIPlanPtr insert_many_new_plan = NULL;
static int plans_epoch = 0; /* obx_enqueue_plans_epoch they were prepared at */

/*
 * obx.enqueue_many's arrays, each deconstructed: values and nulls of n
 * elements, or NULL for an optional array passed as NULL.
 */
typedef struct ManyArrays
{
	int n;
	Datum *values[OBX_MANY_ARRAYS];
	bool *nulls[OBX_MANY_ARRAYS];
} ManyArrays;

/* The array arguments of obx.enqueue_many, after the topic: names and types. */
static const char *const many_names[OBX_MANY_ARRAYS] = {
	"event_keys", "payloads", "aggregate_ids", "event_types", "headers", "event_ids"};
static const Oid many_types[OBX_MANY_ARRAYS] = {
	TEXTOID, JSONBOID, TEXTOID, TEXTOID, JSONBOID, UUIDOID};

/* The element being checked or inserted, for the error context; -1: none. */
static int many_element = -1;

static void
many_element_context(void *arg)
{
	if (many_element >= 0)
		errcontext("element %d of the arrays passed to obx.enqueue_many",
				   many_element + 1);
}

/*
 * read_many_arrays
 *		Deconstruct obx.enqueue_many's arrays into arrays; event_keys and
 *		payloads must be given, and every array given must be
 *		one-dimensional with as many elements as event_keys.
 */
static void
read_many_arrays(FunctionCallInfo fcinfo, ManyArrays *arrays)
{
	int i;

	memset(arrays, 0, sizeof(ManyArrays));
	arrays->n = -1;
	for (i = 0; i < OBX_MANY_ARRAYS; i++)
	{
		ArrayType *array;
		int16 typlen;
		bool typbyval;
		char typalign;
		int n;

		if (PG_ARGISNULL(i + 1))
		{
			if (i < 2)
				ereport(ERROR,
						(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
						 errmsg("obx.enqueue_many's %s must not be null", many_names[i])));
			continue;
		}
		array = PG_GETARG_ARRAYTYPE_P(i + 1);
		if (ARR_NDIM(array) > 1)
			ereport(ERROR,
					(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
					 errmsg("obx.enqueue_many's %s must be a one-dimensional array",
							many_names[i])));
		get_typlenbyvalalign(many_types[i], &typlen, &typbyval, &typalign);
		deconstruct_array(array, many_types[i], typlen, typbyval, typalign,
						  &arrays->values[i], &arrays->nulls[i], &n);
		if (arrays->n >= 0 && n != arrays->n)
			ereport(ERROR,
					(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
					 errmsg("obx.enqueue_many's arrays must have the same length"),
					 errdetail("event_keys has %d elements and %s %d.",
							   arrays->n, many_names[i], n)));
		arrays->n = n;
	}
}

/* Element i of array a as a C string, or NULL. */
static char *
many_text(const ManyArrays *arrays, int a, int i)
{
	if (arrays->values[a] == NULL || arrays->nulls[a][i])
		return NULL;
	return TextDatumGetCString(arrays->values[a][i]);
}

/*
 * check_many_element
 *		Read element i of the arrays into ev and check it as obx.enqueue
 *		checks its arguments.  A NULL element of an optional array means
 *		what a NULL argument of obx.enqueue means.
 */
static bool
check_many_element(const ManyArrays *arrays, int i, EnqueueEvent *ev)
{
	Jsonb *given;

	if (arrays->nulls[0][i])
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("obx event key must not be null")));
	if (arrays->nulls[1][i])
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("obx event payload must not be null")));
	ev->key = many_text(arrays, 0, i);
	ev->payload = DatumGetJsonbP(arrays->values[1][i]);
	ev->aggregate_id = many_text(arrays, 2, i);
	ev->event_type = many_text(arrays, 3, i);
	ev->headers = (arrays->values[4] == NULL || arrays->nulls[4][i]) ? NULL : DatumGetJsonbP(arrays->values[4][i]);
	obx_enqueue_check_event(ev);
	given = ev->headers;
	ev->headers = obx_trace_headers(given);
	return ev->headers != given;
}

static int
compare_uuids(const void *a, const void *b)
{
	return memcmp(a, b, UUID_LEN);
}

/*
 * In 1.0's table, the elements whose id was not inserted (in use already,
 * or given twice in the arrays): each is a no-op if the stored event is
 * the same, an error otherwise (check_existing).  inserted: the ids
 * inserted.
 */
static void
check_many_conflicts(const ManyArrays *arrays, const char *topic,
					 pg_uuid_t *ids, pg_uuid_t *inserted, uint64 ninserted)
{
	int n = arrays->n;
	pg_uuid_t *sorted = palloc(sizeof(pg_uuid_t) * n);
	int i;

	memcpy(sorted, ids, sizeof(pg_uuid_t) * n);
	qsort(sorted, n, sizeof(pg_uuid_t), compare_uuids);
	qsort(inserted, ninserted, sizeof(pg_uuid_t), compare_uuids);
	for (i = 0; i < n; i++)
	{
		pg_uuid_t *first = bsearch(&ids[i], sorted, n, sizeof(pg_uuid_t), compare_uuids);
		bool twice;
		EnqueueEvent ev;

		/* bsearch may land on any of equal ids: look on both sides. */
		twice = (first > sorted && compare_uuids(first - 1, first) == 0) ||
				(first < sorted + n - 1 && compare_uuids(first + 1, first) == 0);
		if (!twice && bsearch(&ids[i], inserted, ninserted, sizeof(pg_uuid_t), compare_uuids))
			continue;
		many_element = i;
		memset(&ev, 0, sizeof(ev));
		(void) check_many_element(arrays, i, &ev);
		obx_enqueue_check_existing(UUIDPGetDatum(&ids[i]), topic, ev.key,
								   ev.aggregate_id ? ev.aggregate_id : ev.key,
								   ev.payload, ev.event_type, ev.headers);
	}
	many_element = -1;
}

/*
 * check_many
 *		Check every element in array order into events (topic left
 *		unset); returns the event ids, those not given generated.  When
 *		the trace context (obx_trace_headers) changed an element's
 *		headers, *headers is the headers array to insert instead of the
 *		one given; else it is left alone.
 */
static pg_uuid_t *
check_many(const ManyArrays *arrays, EnqueueEvent *events, Datum *headers)
{
	pg_uuid_t *ids = palloc(sizeof(pg_uuid_t) * arrays->n);
	Datum *elems = palloc(sizeof(Datum) * arrays->n);
	bool *nulls = palloc(sizeof(bool) * arrays->n);
	bool traced = false;
	int dims[1] = {arrays->n};
	int lbs[1] = {1};
	int i;

	for (i = 0; i < arrays->n; i++)
	{
		EnqueueEvent ev;

		many_element = i;
		memset(&ev, 0, sizeof(ev));
		traced |= check_many_element(arrays, i, &ev);
		elems[i] = ev.headers ? JsonbPGetDatum(ev.headers) : (Datum) 0;
		nulls[i] = ev.headers == NULL;
		if (arrays->values[5] == NULL || arrays->nulls[5][i])
			obx_enqueue_make_id(&ids[i]);
		else
		{
			memcpy(&ids[i], DatumGetUUIDP(arrays->values[5][i]), sizeof(pg_uuid_t));
			ev.id_given = true;
		}
		ev.id = &ids[i];
		events[i] = ev;
	}
	many_element = -1;
	if (traced)
		*headers = PointerGetDatum(construct_md_array(elems, nulls, 1, dims, lbs,
													  JSONBOID, -1, false, TYPALIGN_INT));
	return ids;
}

/*
 * The events of obx.enqueue_many's arrays in array order, so that seq grows
 * in array order.  In 1.0's table ids given may be in use already (ON
 * CONFLICT); the ids inserted are returned.  Generated ones are new, as in
 * enqueue.  In 1.1, arrays with ids given go one by one (insert_given).
 */
#define INSERT_MANY_SELECT                                                  \
	"SELECT e.id, COALESCE(e.aggregate_id, e.event_key), $1, e.event_key, " \
	"e.event_type, e.headers, e.payload "                                   \
	"FROM ROWS FROM (pg_catalog.unnest($2), pg_catalog.unnest($3), "        \
	"pg_catalog.unnest($4), pg_catalog.unnest($5), pg_catalog.unnest($6), " \
	"pg_catalog.unnest($7)) WITH ORDINALITY "                               \
	"AS e(id, event_key, payload, aggregate_id, event_type, headers, n) "

static void
prepare_many_plans(void)
{
	Oid types[7] = {TEXTOID, UUIDARRAYOID, TEXTARRAYOID, JSONBARRAYOID,
					TEXTARRAYOID, TEXTARRAYOID, JSONBARRAYOID};
	bool v10;

	/* Prepared again with obx.enqueue's (see obx_enqueue_schema_is_1_0). */
	if (insert_many_new_plan != NULL && plans_epoch == obx_enqueue_plans_epoch)
		return;
	if (insert_many_plan != NULL)
		SPI_freeplan(insert_many_plan);
	if (insert_many_new_plan != NULL)
		SPI_freeplan(insert_many_new_plan);
	insert_many_plan = NULL;
	plans_epoch = obx_enqueue_plans_epoch;
	v10 = obx_enqueue_schema_is_1_0();
	if (v10)
		insert_many_plan = obx_prepare_kept_generic(
			"INSERT INTO obx.outbox_events "
			"(id, aggregate_id, topic, event_key, event_type, headers, payload) " INSERT_MANY_SELECT "ORDER BY e.n ON CONFLICT (id) DO NOTHING RETURNING id",
			7, types);
	insert_many_new_plan = obx_prepare_kept_generic(
		v10 ? "INSERT INTO obx.outbox_events "
			  "(id, aggregate_id, topic, event_key, event_type, headers, payload) " INSERT_MANY_SELECT "ORDER BY e.n"
			: "INSERT INTO obx.events "
			  "(id, aggregate_id, topic, event_key, event_type, headers, payload) " INSERT_MANY_SELECT "ORDER BY e.n",
		7, types);
}

/*
 * insert_many
 *		Insert the checked events in one statement, in array order (so
 *		their seq grows in array order), in the caller's transaction;
 *		returns how many were inserted.  Elements whose id was not inserted
 *		go to check_many_conflicts.
 */
static uint64
insert_many(FunctionCallInfo fcinfo, const ManyArrays *arrays, const char *topic,
			ArrayType *id_array, pg_uuid_t *ids, Datum headers)
{
	Datum values[7];
	char nulls[7] = {' ', ' ', ' ', ' ', ' ', ' ', ' '};
	uint64 inserted;
	bool given;
	int rc;
	int i;

	values[0] = CStringGetTextDatum(topic);
	values[1] = PointerGetDatum(id_array);
	for (i = 0; i < 5; i++)
	{
		nulls[i + 2] = PG_ARGISNULL(i + 1) ? 'n' : ' ';
		values[i + 2] = PG_ARGISNULL(i + 1) ? (Datum) 0 : PG_GETARG_DATUM(i + 1);
	}
	if (headers != (Datum) 0)
	{
		/* The headers with the trace context in them (check_many). */
		values[6] = headers;
		nulls[6] = ' ';
	}

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "obx could not connect to SPI");
	obx_enqueue_prepare_plans();
	prepare_many_plans();
	given = arrays->values[5] != NULL;
	rc = SPI_execute_plan(given ? insert_many_plan : insert_many_new_plan,
						  values, nulls, false, 0);
	if (rc != (given ? SPI_OK_INSERT_RETURNING : SPI_OK_INSERT))
		elog(ERROR, "obx enqueue_many insert failed: %s", SPI_result_code_string(rc));
	inserted = SPI_processed;
	if (inserted < (uint64) arrays->n)
	{
		pg_uuid_t *done = palloc(sizeof(pg_uuid_t) * (inserted + 1));
		uint64 j;

		for (j = 0; j < inserted; j++)
		{
			bool isnull;
			Datum id = SPI_getbinval(SPI_tuptable->vals[j], SPI_tuptable->tupdesc, 1, &isnull);

			memcpy(&done[j], DatumGetUUIDP(id), sizeof(pg_uuid_t));
		}
		check_many_conflicts(arrays, topic, ids, done, inserted);
	}
	SPI_finish();
	return inserted;
}

/*
 * insert_given
 *		Insert the checked events one by one in array order, for arrays
 *		with event ids given in 1.1: each given id is looked up first
 *		(obx_enqueue_given), and a lookup cannot be shared by a statement
 *		that inserts many.  Returns how many were inserted.
 */
static uint64
insert_given(EnqueueEvent *events, int n, char *topic)
{
	uint64 inserted = 0;
	int i;

	for (i = 0; i < n; i++)
	{
		many_element = i;
		events[i].topic = topic;
		if (obx_enqueue_insert(&events[i]))
			inserted++;
	}
	many_element = -1;
	return inserted;
}

/*
 * obx.enqueue_many(topic, event_keys, payloads, aggregate_ids, event_types,
 *					headers, event_ids) returns uuid[]
 *
 * obx.enqueue for many events of one topic at once: element i of the
 * arrays is one event, checked as obx.enqueue checks its arguments (an
 * error names the element), and inserted in array order by one statement.
 * Returns the events' ids in array order.
 */
Datum
obx_enqueue_many(PG_FUNCTION_ARGS)
{
	char *topic = text_to_cstring(obx_enqueue_required_text(fcinfo, 0, "topic"));
	ManyArrays arrays;
	ErrorContextCallback context;
	EnqueueEvent *events;
	pg_uuid_t *ids;
	Datum *id_datums;
	ArrayType *result;
	uint64 inserted;
	Datum headers = (Datum) 0;
	int i;

	obx_warn_if_unserved();
	read_many_arrays(fcinfo, &arrays);
	obx_enqueue_check_topic(topic);
	if (arrays.n <= 0)
		PG_RETURN_ARRAYTYPE_P(construct_empty_array(UUIDOID));

	many_element = -1;
	context.callback = many_element_context;
	context.arg = NULL;
	context.previous = error_context_stack;
	error_context_stack = &context;

	events = palloc(sizeof(EnqueueEvent) * arrays.n);
	ids = check_many(&arrays, events, &headers);
	id_datums = palloc(sizeof(Datum) * arrays.n);
	for (i = 0; i < arrays.n; i++)
		id_datums[i] = UUIDPGetDatum(&ids[i]);
	result = construct_array(id_datums, arrays.n, UUIDOID, UUID_LEN, false,
							 TYPALIGN_CHAR);
	if (arrays.values[5] != NULL && !obx_enqueue_schema_is_1_0())
		inserted = insert_given(events, arrays.n, topic);
	else
		inserted = insert_many(fcinfo, &arrays, topic, result, ids, headers);

	error_context_stack = context.previous;
	if (inserted > 0)
		obx_enqueue_wake_at_commit();
	PG_RETURN_ARRAYTYPE_P(result);
}
