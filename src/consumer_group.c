/*-------------------------------------------------------------------------
 *
 * consumer_group.c
 *	  The Kafka consumers of a consumer worker: one per subscription in
 *	  obx.subscriptions, in the consumer group named after it, built with
 *	  the settings the guarantees rest on, refreshed when the subscriptions
 *	  change and closed (leaving the group, committing stored offsets) when
 *	  they go.
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

#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "obx.h"
#include "inbox.h"
#include "kafka_conf.h"
#include "status.h"
#include "consumer_group.h"

static int my_worker = -1;
static int signal_fd = -1;
static ObxConsumer *consumers = NULL;

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

/* The running consumers, a list linked through next. */
ObxConsumer *
obx_consumers(void)
{
	return consumers;
}

/*
 * obx_consumer_kafka_error
 *		Log a Kafka error of a consumer at most once a minute per distinct
 *		message (obx_log_allowed), since librdkafka repeats connection
 *		errors while brokers are down; the next line logged says how many
 *		were not.
 */
void
obx_consumer_kafka_error(ObxConsumer *c, const char *what)
{
	int64 suppressed;

	if (!obx_log_allowed(psprintf("kafka|%s|%s", c->sub.name, what), &suppressed))
		return;
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
	ObxSubscription *subs = obx_inbox_subscriptions(&n);
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
