/*-------------------------------------------------------------------------
 *
 * progress.c
 *	  The consumer's rows in obx.consumer_partitions: what each batch did
 *	  per partition (position, counters, last event, last error), counted
 *	  in memory while the batch runs and written by one upsert per
 *	  partition before it commits; and the count of a transient failure,
 *	  in a transaction of its own.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/memutils.h"

#include "progress.h"
#include "worker.h"

static SPIPlanPtr progress_plan = NULL;
static SPIPlanPtr retry_plan = NULL;

/* Per partition, what the open batch applied: one progress row each. */
typedef struct BatchPartition
{
	char *topic;
	int32 partition;
	int64 next_offset;
	int64 processed;
	int64 duplicates;
	int64 dead_lettered;
	char *last_event_id;
	char *error_class;
	char *error;
	struct BatchPartition *next;
} BatchPartition;

/*
 * The open batch's partitions, allocated in cxt (the batch's memory
 * context, which outlives every subtransaction).
 */
static struct
{
	MemoryContext cxt;
	const char *consumer;
	BatchPartition *parts;
} progress;

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

static const char *retry_sql =
	"INSERT INTO obx.consumer_partitions AS p"
	"   (consumer_name, topic, kafka_partition, retries,"
	"    last_error_class, last_error, last_error_at)"
	" VALUES ($1, $2, $3, 1, 'transient', $4, pg_catalog.now())"
	" ON CONFLICT (consumer_name, topic, kafka_partition) DO UPDATE"
	"   SET retries = p.retries + 1, last_error_class = 'transient',"
	"       last_error = excluded.last_error, last_error_at = pg_catalog.now()";

/* This file's statements, prepared once per process and kept (SPI_keepplan). */
static void
progress_prepare_plans(void)
{
	if (progress_plan != NULL)
		return;
	{
		Oid types[] = {TEXTOID, TEXTOID, INT4OID, INT8OID, INT8OID, INT8OID,
					   INT8OID, TEXTOID, TEXTOID, TEXTOID};

		progress_plan = obx_prepare_kept(progress_sql, 10, types);
	}
	{
		Oid types[] = {TEXTOID, TEXTOID, INT4OID, TEXTOID};

		retry_plan = obx_prepare_kept(retry_sql, 4, types);
	}
}

/*
 * obx_progress_begin
 *		A batch of consumer's messages begins; its counts are allocated in
 *		the current memory context.
 */
void
obx_progress_begin(const char *consumer)
{
	progress.cxt = CurrentMemoryContext;
	progress.consumer = consumer;
	progress.parts = NULL;
}

static char *
copy_or_null(const char *s)
{
	return s == NULL ? NULL : MemoryContextStrdup(progress.cxt, s);
}

/*
 * obx_progress_count
 *		Count what a message of the open batch did (its subtransaction was
 *		released) in its partition's row.
 */
void
obx_progress_count(const ObxInbound *msg, const ObxOutcome *o)
{
	BatchPartition *p;

	for (p = progress.parts; p != NULL; p = p->next)
		if (p->partition == msg->partition && strcmp(p->topic, msg->topic) == 0)
			break;
	if (p == NULL)
	{
		p = MemoryContextAllocZero(progress.cxt, sizeof(BatchPartition));
		p->topic = MemoryContextStrdup(progress.cxt, msg->topic);
		p->partition = msg->partition;
		p->next = progress.parts;
		progress.parts = p;
	}
	p->next_offset = msg->offset + 1;
	p->processed += o->result == OBX_INBOX_PROCESSED;
	p->duplicates += o->result == OBX_INBOX_DUPLICATE;
	p->dead_lettered += o->result == OBX_INBOX_DEAD_LETTER;
	if (o->event_id != NULL)
		p->last_event_id = copy_or_null(o->event_id);
	if (o->error != NULL)
	{
		p->error_class = copy_or_null(o->error_class);
		p->error = copy_or_null(o->error);
	}
}

/* One partition's row in obx.consumer_partitions, for the whole batch. */
static void
write_progress(const BatchPartition *p)
{
	Datum values[10];
	char nulls[10];
	int rc;

	memset(nulls, ' ', sizeof(nulls));
	values[0] = CStringGetTextDatum(progress.consumer);
	values[1] = CStringGetTextDatum(p->topic);
	values[2] = Int32GetDatum(p->partition);
	values[3] = Int64GetDatum(p->next_offset);
	values[4] = Int64GetDatum(p->processed);
	values[5] = Int64GetDatum(p->duplicates);
	values[6] = Int64GetDatum(p->dead_lettered);
	values[7] = obx_text_or_null(p->last_event_id, &nulls[7]);
	values[8] = obx_text_or_null(p->error_class, &nulls[8]);
	values[9] = obx_text_or_null(p->error, &nulls[9]);
	rc = SPI_execute_plan(progress_plan, values, nulls, false, 0);
	if (rc != SPI_OK_INSERT)
		elog(ERROR, "obx could not record consumer progress: %s",
			 SPI_result_code_string(rc));
}

/*
 * obx_progress_write
 *		Write the open batch's rows, one per partition it counted, in its
 *		transaction.
 */
void
obx_progress_write(void)
{
	BatchPartition *p;

	progress_prepare_plans();
	for (p = progress.parts; p != NULL; p = p->next)
		write_progress(p);
	progress.parts = NULL;
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

	progress_prepare_plans();
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
