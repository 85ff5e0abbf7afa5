/*-------------------------------------------------------------------------
 *
 * consumer_group.c
 *	  The Kafka consumers of a consumer worker: one per subscription in
 *	  obx.subscriptions, in the consumer group named after it, built with
 *	  the settings the guarantees rest on, refreshed when the subscriptions
 *	  change and closed (leaving the group, committing stored offsets) when
 *	  they go; and the reading of obx.subscriptions they follow.
 *
 * As in kafka.c, librdkafka's threads never run PostgreSQL code: logs and
 * errors go through each consumer's queue, which writes a byte to the
 * worker's pipe (signal_fd) when it becomes non-empty, and callbacks run
 * only inside rd_kafka_consumer_poll() on the worker's thread.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <librdkafka/rdkafka.h>

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "obx.h"
#include "log_repeat.h"
#include "inbox.h"
#include "kafka_conf.h"
#include "handler.h"
#include "worker.h"
#include "consumer_group.h"
#include "protocol.h"

static int my_worker = -1;
static int signal_fd = -1;
static ObxConsumer *consumers = NULL;
static SPIPlanPtr watermark_plan = NULL;

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
 * Every subscription, with nothing parsed from the options of a row that
 * has a problem (obx._subscription_problem), so that a bad row cannot
 * fail the read.
 */
static const char *subscriptions_sql =
	"SELECT s.consumer_name, s.topics, p.oid, s.owner::pg_catalog.oid,"
	"       p.oid IS NULL,"
	"       CASE WHEN q.problem IS NULL"
	"            THEN coalesce(s.options->>'start', 'earliest') END,"
	"       CASE WHEN q.problem IS NULL THEN"
	"       ARRAY(SELECT k.key FROM pg_catalog.jsonb_each_text(s.options->'kafka') k ORDER BY k.key) END,"
	"       CASE WHEN q.problem IS NULL THEN"
	"       ARRAY(SELECT k.value FROM pg_catalog.jsonb_each_text(s.options->'kafka') k ORDER BY k.key) END,"
	"       CASE WHEN q.problem IS NULL THEN"
	"       ARRAY(SELECT pg_catalog.jsonb_array_elements_text(s.options->'retry_sqlstates')) END,"
	"       pg_catalog.concat_ws('|', s.topics::pg_catalog.text, p.oid,"
	"                 s.owner::pg_catalog.oid,"
	"                 s.options::pg_catalog.text, p.oid IS NULL, q.problem),"
	"       q.problem,"
	"       CASE WHEN q.problem IS NULL THEN s.options->>'handler_timeout_ms' END,"
	"       CASE WHEN q.problem IS NULL THEN s.options->>'max_attempts' END"
	"  FROM obx.subscriptions s"
	"  LEFT JOIN pg_catalog.pg_proc p ON p.oid = obx._handler(s)"
	"  CROSS JOIN LATERAL (SELECT obx._subscription_problem(s) AS problem) q"
	" ORDER BY s.consumer_name";

/* One row of subscriptions_sql, copied in the current memory context. */
static void
read_subscription(HeapTuple tup, TupleDesc desc, ObxSubscription *s)
{
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
	s->problem = copy_text(tup, desc, 11);
	if (s->problem != NULL)
	{
		s->start = pstrdup("earliest");
		s->kafka_names = s->kafka_values = palloc0(sizeof(char *));
		s->retry_sqlstates = palloc0(sizeof(int));
		return;
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
	s->handler_timeout_ms = obx_handler_timeout(copy_text(tup, desc, 12));
	/* 0, no limit, when absent */
	s->max_attempts = obx_option_int(copy_text(tup, desc, 13), 1, 1000000, 0);
}

/*
 * Every subscription, in name order, allocated in the caller's memory
 * context.  A row the workers cannot serve (a bad row written directly, an
 * owner or handler gone) comes with its problem set and nothing parsed
 * from its options.
 */
static ObxSubscription *
read_subscriptions(int *count)
{
	MemoryContext caller = obx_step_begin("obx: reading subscriptions");
	ObxSubscription *subs;
	int rc;
	uint64 i;

	rc = SPI_execute(subscriptions_sql, true, 0);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "obx could not read subscriptions: %s", SPI_result_code_string(rc));

	*count = (int) SPI_processed;
	subs = MemoryContextAllocZero(caller, sizeof(ObxSubscription) * Max(*count, 1));
	for (i = 0; i < SPI_processed; i++)
	{
		MemoryContext spi = MemoryContextSwitchTo(caller);

		read_subscription(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, &subs[i]);
		MemoryContextSwitchTo(spi);
	}
	obx_step_end(caller);
	return subs;
}

/*
 * obx_consumers_init
 *		Set up for consumer worker number worker, whose consumer queues
 *		signal on signal_fd.
 */
void
obx_consumers_init(int worker, int fd)
{
	my_worker = worker;
	signal_fd = fd;
}

/* The number of the consumer worker this is. */
int
obx_consumers_worker(void)
{
	return my_worker;
}

/* The running consumers, a list linked through next. */
ObxConsumer *
obx_consumers(void)
{
	return consumers;
}

/* Keep a Kafka error of c for obx.consumer_kafka_errors. */
static void
keep_kafka_error(ObxConsumer *c, const char *what)
{
	if (c->kafka_error != NULL)
		pfree(c->kafka_error);
	c->kafka_error = MemoryContextStrdup(c->cxt, what);
}

/*
 * obx_consumer_kafka_error
 *		Log a Kafka error of a consumer at most once a minute per distinct
 *		message (obx_log_allowed), since librdkafka repeats connection
 *		errors while brokers are down; the next line logged says how many
 *		were not.  What is logged goes to obx.consumer_kafka_errors too.
 */
void
obx_consumer_kafka_error(ObxConsumer *c, const char *what)
{
	int64 suppressed;

	if (!obx_log_allowed(psprintf("kafka|%s|%s", c->sub.name, what), &suppressed))
		return;
	keep_kafka_error(c, what);
	if (suppressed > 0)
		ereport(WARNING,
				(errcode(ERRCODE_CONNECTION_FAILURE),
				 errmsg("obx consumer %d, consumer group \"%s\": Kafka error: %s",
						my_worker, c->sub.name, what),
				 errdetail("%lld more like it since the last one logged.",
						   (long long) suppressed)));
	else
		ereport(WARNING,
				(errcode(ERRCODE_CONNECTION_FAILURE),
				 errmsg("obx consumer %d, consumer group \"%s\": Kafka error: %s",
						my_worker, c->sub.name, what)));
}

static void
consumer_error_callback(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
	ObxConsumer *c = (ObxConsumer *) opaque;

	obx_consumer_kafka_error(c, psprintf("%s: %s", rd_kafka_err2name(err), reason));
}

/*
 * Build and subscribe the Kafka consumer of a subscription.  Returns false
 * with a message when librdkafka rejects the configuration.
 */
static bool
start_kafka_consumer(ObxConsumer *c, char *errbuf, size_t errlen)
{
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	rd_kafka_topic_partition_list_t *topics;
	rd_kafka_resp_err_t err;
	int i;

	/*
	 * Never apply a property a subscription may not set, whatever the row
	 * says (obx.subscribe refuses them; see kafka_conf.c).
	 */
	for (i = 0; i < c->sub.nkafka; i++)
		if (!obx_kafka_subscription_property_allowed(c->sub.kafka_names[i]))
		{
			snprintf(errbuf, errlen,
					 "Kafka property \"%s\" cannot be set by an obx subscription",
					 c->sub.kafka_names[i]);
			rd_kafka_conf_destroy(conf);
			return false;
		}

	/*
	 * obx's defaults first, then obx.kafka_properties and
	 * obx.kafka_properties_file, then the subscription's own; the settings
	 * the guarantees rest on last.
	 */
	if (!obx_kafka_set(conf, "bootstrap.servers", obx_brokers, errbuf, errlen) ||
		!obx_kafka_set(conf, "client.id", "obx-consumer", errbuf, errlen) ||
		!obx_kafka_set(conf, "auto.offset.reset", c->sub.start, errbuf, errlen) ||
		!obx_kafka_set(conf, "auto.commit.interval.ms", "1000", errbuf, errlen) ||
		!obx_kafka_set(conf, "session.timeout.ms", "10000", errbuf, errlen) ||
		!obx_kafka_set(conf, "topic.metadata.refresh.interval.ms", "10000", errbuf, errlen) ||
		!obx_kafka_user_properties(conf, errbuf, errlen))
		goto fail;
	for (i = 0; i < c->sub.nkafka; i++)
		if (!obx_kafka_set(conf, c->sub.kafka_names[i], c->sub.kafka_values[i],
						   errbuf, errlen))
			goto fail;
	if (!obx_kafka_set(conf, "group.id", c->sub.name, errbuf, errlen) ||
		!obx_kafka_set(conf, "enable.auto.offset.store", "false", errbuf, errlen) ||
		!obx_kafka_set(conf, "enable.partition.eof", "false", errbuf, errlen))
		goto fail;

	rd_kafka_conf_set_opaque(conf, c);
	rd_kafka_conf_set_error_cb(conf, consumer_error_callback);

	c->rk = obx_kafka_new(RD_KAFKA_CONSUMER, conf, errbuf, errlen);
	if (c->rk == NULL)
		goto fail;

	/* Logs, errors and messages all arrive through the consumer queue. */
	rd_kafka_poll_set_consumer(c->rk);
	c->queue = rd_kafka_queue_get_consumer(c->rk);
	rd_kafka_queue_io_event_enable(c->queue, signal_fd, "1", 1);

	topics = rd_kafka_topic_partition_list_new(c->sub.ntopics);
	for (i = 0; i < c->sub.ntopics; i++)
		rd_kafka_topic_partition_list_add(topics, c->sub.topics[i],
										  RD_KAFKA_PARTITION_UA);
	err = rd_kafka_subscribe(c->rk, topics);
	rd_kafka_topic_partition_list_destroy(topics);
	if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		snprintf(errbuf, errlen, "could not subscribe: %s", rd_kafka_err2str(err));
		return false;
	}
	return true;

fail:
	if (c->rk == NULL)
		rd_kafka_conf_destroy(conf);
	return false;
}

/*
 * Leave the group, committing the stored offsets, for at most
 * obx.shutdown_timeout; then free the handle whatever state it is in.
 */
static void
stop_kafka_consumer(ObxConsumer *c)
{
	if (c->rk == NULL)
		return;
	if (c->queue != NULL)
	{
		rd_kafka_queue_io_event_enable(c->queue, -1, NULL, 0);
		rd_kafka_queue_destroy(c->queue);
		c->queue = NULL;
	}
	{
		rd_kafka_queue_t *q = rd_kafka_queue_new(c->rk);
		rd_kafka_error_t *error = rd_kafka_consumer_close_queue(c->rk, q);
		TimestampTz give_up = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
														  obx_shutdown_timeout_ms);

		if (error != NULL)
			rd_kafka_error_destroy(error);
		else
			while (!rd_kafka_consumer_closed(c->rk) &&
				   GetCurrentTimestamp() < give_up)
			{
				rd_kafka_event_t *ev = rd_kafka_queue_poll(q, 100);

				if (ev != NULL)
					rd_kafka_event_destroy(ev);
			}
		rd_kafka_queue_destroy(q);
	}
	rd_kafka_destroy_flags(c->rk, RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE);
	c->rk = NULL;
}

static void
drop_consumer(ObxConsumer *c)
{
	stop_kafka_consumer(c);
	MemoryContextDelete(c->cxt);
	pfree(c);
}

static char **
copy_strings(char **src, int n)
{
	char **dst = palloc(sizeof(char *) * Max(n, 1));
	int i;

	for (i = 0; i < n; i++)
		dst[i] = pstrdup(src[i]);
	return dst;
}

static ObxConsumer *
new_consumer(const ObxSubscription *sub)
{
	MemoryContext cxt = AllocSetContextCreate(TopMemoryContext, "obx consumer",
											  ALLOCSET_SMALL_SIZES);
	MemoryContext old = MemoryContextSwitchTo(cxt);
	ObxConsumer *c = MemoryContextAllocZero(TopMemoryContext, sizeof(ObxConsumer));
	char errbuf[512];

	c->cxt = cxt;
	c->kafka_error_shown = true; /* an earlier consumer may have left one */
	c->sub = *sub;
	c->sub.name = pstrdup(sub->name);
	c->sub.topics = copy_strings(sub->topics, sub->ntopics);
	c->sub.start = pstrdup(sub->start);
	c->sub.kafka_names = copy_strings(sub->kafka_names, sub->nkafka);
	c->sub.kafka_values = copy_strings(sub->kafka_values, sub->nkafka);
	c->sub.retry_sqlstates = palloc(sizeof(int) * Max(sub->nretry, 1));
	memcpy(c->sub.retry_sqlstates, sub->retry_sqlstates, sizeof(int) * sub->nretry);
	c->sub.signature = pstrdup(sub->signature);
	MemoryContextSwitchTo(old);

	if (!start_kafka_consumer(c, errbuf, sizeof(errbuf)))
	{
		ereport(WARNING,
				(errcode(ERRCODE_CONFIG_FILE_ERROR),
				 errmsg("obx consumer %d could not start the Kafka consumer of subscription \"%s\": %s",
						my_worker, sub->name, errbuf),
				 errhint("Check obx.brokers, obx.kafka_properties and the subscription's options; "
						 "obx tries again when they change.")));
		stop_kafka_consumer(c);
		c->start_error = MemoryContextStrdup(c->cxt,
											 psprintf("could not start the Kafka consumer: %s",
													  errbuf));
	}
	else
		ereport(LOG,
				(errmsg("obx consumer %d joined consumer group \"%s\"",
						my_worker, sub->name)));
	return c;
}

/*
 * A subscription the workers cannot serve: its owner or handler is gone, or
 * the row holds what obx.subscribe refuses.  Kept as a consumer without a
 * Kafka handle, so that it is skipped, and said so, once per change of the
 * subscription.  obx.consumers shows the problem too.
 */
static ObxConsumer *
skipped_consumer(const ObxSubscription *sub)
{
	ObxConsumer *c = MemoryContextAllocZero(TopMemoryContext, sizeof(ObxConsumer));

	c->cxt = AllocSetContextCreate(TopMemoryContext, "obx consumer",
								   ALLOCSET_SMALL_SIZES);
	c->sub.name = MemoryContextStrdup(c->cxt, sub->name);
	c->sub.signature = MemoryContextStrdup(c->cxt, sub->signature);
	ereport(WARNING,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("obx subscription \"%s\" is not consumed: %s",
					sub->name, sub->problem),
			 errhint(sub->handler_missing
						 ? "Create the function again, or call obx.subscribe with a new handler."
						 : "Fix it with obx.subscribe, or remove it with obx.unsubscribe; obx.consumers shows the problem.")));
	return c;
}

/*
 * obx_consumers_refresh
 *		Bring the consumers in line with obx.subscriptions: start the new
 *		ones, restart the changed ones, stop the removed ones.  Uses and
 *		resets scratch.
 */
void
obx_consumers_refresh(MemoryContext scratch)
{
	MemoryContext old = MemoryContextSwitchTo(scratch);
	int n;
	ObxSubscription *subs = read_subscriptions(&n);
	ObxConsumer *kept = NULL;
	ObxConsumer *c;
	int i;

	MemoryContextSwitchTo(old);

	/* Stop what is gone or changed. */
	while ((c = consumers) != NULL)
	{
		bool found = false;

		consumers = c->next;
		for (i = 0; i < n; i++)
			if (strcmp(subs[i].name, c->sub.name) == 0 &&
				strcmp(subs[i].signature, c->sub.signature) == 0)
				found = true;
		if (found)
		{
			c->next = kept;
			kept = c;
		}
		else
		{
			ereport(LOG,
					(errmsg("obx consumer %d left consumer group \"%s\"",
							my_worker, c->sub.name)));
			drop_consumer(c);
		}
	}
	consumers = kept;

	for (i = 0; i < n; i++)
	{
		bool running = false;

		for (c = consumers; c != NULL; c = c->next)
			if (strcmp(subs[i].name, c->sub.name) == 0)
				running = true;
		if (running)
			continue;
		if (subs[i].problem != NULL)
			c = skipped_consumer(&subs[i]);
		else
			c = new_consumer(&subs[i]);
		c->next = consumers;
		consumers = c;
	}
	MemoryContextReset(scratch);
}

/* Stop every consumer: each leaves its group. */
void
obx_consumers_stop_all(void)
{
	ObxConsumer *c;

	while ((c = consumers) != NULL)
	{
		consumers = c->next;
		drop_consumer(c);
	}
}

/*
 * obx_consumers_record_watermarks
 *		Record the partitions' low and high watermarks of a consumer group,
 *		for the lag, in a transaction of its own.
 */
void
obx_consumers_record_watermarks(const char *consumer, int n, char **topics,
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

	if (watermark_plan == NULL)
	{
		Oid types[] = {TEXTOID, TEXTARRAYOID, INT4ARRAYOID, INT8ARRAYOID,
					   INT8ARRAYOID};

		watermark_plan = obx_prepare_kept(OBX_SQL_WATERMARKS, 5, types);
	}
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

static const char *kafka_error_sql =
	"INSERT INTO obx.consumer_kafka_errors AS k (consumer_name, error, error_at)"
	" VALUES ($1, $2, pg_catalog.now())"
	" ON CONFLICT (consumer_name) DO UPDATE"
	"   SET error = excluded.error, error_at = excluded.error_at";

static const char *kafka_ok_sql =
	"DELETE FROM obx.consumer_kafka_errors WHERE consumer_name = $1";

/*
 * obx_consumer_note_kafka
 *		Bring the group's row of obx.consumer_kafka_errors up to date, in a
 *		transaction of its own, when there is something to say: the Kafka
 *		error c met since the last call, or, if a message came since and
 *		the table may hold an error, that the group works again.  A
 *		consumer that could not start says so again every
 *		OBX_LOG_REPEAT_MS, as librdkafka repeats a lasting error, so that
 *		kafka_error_at stays recent while the trouble lasts.
 */
void
obx_consumer_note_kafka(ObxConsumer *c)
{
	static SPIPlanPtr error_plan = NULL;
	static SPIPlanPtr ok_plan = NULL;
	bool record;
	MemoryContext caller;
	Datum values[2];
	int rc;

	if (c->start_error != NULL)
	{
		TimestampTz now = GetCurrentTimestamp();

		if (c->start_error_at == 0 ||
			now >= TimestampTzPlusMilliseconds(c->start_error_at, OBX_LOG_REPEAT_MS))
		{
			c->start_error_at = now;
			keep_kafka_error(c, c->start_error);
		}
	}
	record = (c->kafka_error != NULL);
	if (!record && !(c->fetched && c->kafka_error_shown))
		return;
	c->fetched = false;
	caller = obx_step_begin("obx: recording a consumer's Kafka error");
	if (error_plan == NULL)
	{
		Oid types[] = {TEXTOID, TEXTOID};

		error_plan = obx_prepare_kept(kafka_error_sql, 2, types);
		ok_plan = obx_prepare_kept(kafka_ok_sql, 1, types);
	}
	values[0] = CStringGetTextDatum(c->sub.name);
	if (record)
	{
		values[1] = CStringGetTextDatum(c->kafka_error);
		rc = SPI_execute_plan(error_plan, values, NULL, false, 0);
	}
	else
		rc = SPI_execute_plan(ok_plan, values, NULL, false, 0);
	if (rc != (record ? SPI_OK_INSERT : SPI_OK_DELETE))
		elog(ERROR, "obx could not record a consumer's Kafka error: %s",
			 SPI_result_code_string(rc));
	obx_step_end(caller);
	if (record)
	{
		pfree(c->kafka_error);
		c->kafka_error = NULL;
	}
	c->kafka_error_shown = record;
}
