/*-------------------------------------------------------------------------
 *
 * consumer.c
 *	  The consumer worker: reads obx.subscriptions, keeps one librdkafka
 *	  consumer per subscription (consumer group = consumer name), hands each
 *	  message to inbox.c, and stores its offset only after the message's
 *	  transaction has committed.
 *
 * Offsets: enable.auto.offset.store is off; the worker stores offset + 1
 * after the commit, and librdkafka's auto commit sends stored offsets to
 * the group coordinator (every auto.commit.interval.ms, on rebalance and on
 * close).  A crash between the commit and the offset commit re-delivers
 * messages whose effects are already committed; obx.mark_processed makes
 * them duplicates.
 *
 * Transient failures: the message's partition is paused and its fetch
 * position sought back to the failed message; after a backoff
 * (obx.backoff_min doubling up to obx.backoff_max) it is resumed and the
 * message comes again.  Until the message succeeds, any later message of
 * that partition that arrives is a leftover of the earlier fetch: the
 * worker seeks back again instead of handling it.  Other partitions and
 * other subscriptions go on meanwhile.
 *
 * As in kafka.c, librdkafka's threads never run PostgreSQL code: signals
 * are blocked while a handle is created, logs go through the consumer's
 * queue, and callbacks run only inside rd_kafka_consumer_poll() on the
 * worker's thread.  Each consumer queue writes a byte to one pipe when it
 * becomes non-empty; the worker waits on that pipe and its latch (the
 * worker base's kept wait set, see worker.c).
 *
 * Several consumer workers serve every subscription; their consumers join
 * the same group, so the partitions are shared among them.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <fcntl.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

#include "access/xlog.h"
#include "miscadmin.h"
#include "postmaster/interrupt.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "obx.h"
#include "worker.h"

/* Messages handled per consumer before the others get a turn. */
#define OBX_CONSUMER_FAIRNESS     200
#define OBX_WATERMARK_INTERVAL_MS 1000
#define OBX_SEEK_TIMEOUT_MS       5000

/* A partition held back by a transient failure. */
typedef struct HeldPartition
{
	char *topic;
	int32 partition;
	int64 offset;          /* the failed message: next to handle */
	int attempts;          /* consecutive transient failures */
	TimestampTz resume_at; /* 0 once resumed, waiting for the message */
	struct HeldPartition *next;
} HeldPartition;

typedef struct Consumer
{
	ObxSubscription sub; /* copied into cxt */
	MemoryContext cxt;
	rd_kafka_t *rk;
	rd_kafka_queue_t *queue;
	HeldPartition *held;
	TimestampTz next_watermarks;
	int64 watermarks_sum; /* of the last recorded watermarks */
	struct Consumer *next;
} Consumer;

/*
 * Everything the consumer worker keeps between two passes of its loop.
 */
typedef struct ConsumerState
{
	ObxWorker w;
	MemoryContext scratch; /* reset every pass */
	MemoryContext msg_cxt; /* reset after every message */
	Consumer *consumers;   /* one per subscription */
	int pipefd[2];         /* every consumer queue signals on state.pipefd[1] */
	TimestampTz next_refresh;
} ConsumerState;

static ConsumerState state = {.pipefd = {-1, -1}};

/*
 * Log a Kafka error of a consumer at most once a minute per distinct
 * message (obx_log_allowed), since librdkafka repeats connection errors
 * while brokers are down; the next line logged says how many were not.
 */
static void
note_kafka_error(Consumer *c, const char *what)
{
	int64 suppressed;

	if (!obx_log_allowed(psprintf("kafka|%s|%s", c->sub.name, what), &suppressed))
		return;
	if (suppressed > 0)
		ereport(WARNING,
				(errcode(ERRCODE_CONNECTION_FAILURE),
				 errmsg("obx consumer %d, consumer group \"%s\": Kafka error: %s",
						state.w.number, c->sub.name, what),
				 errdetail("%lld more like it since the last one logged.",
						   (long long) suppressed)));
	else
		ereport(WARNING,
				(errcode(ERRCODE_CONNECTION_FAILURE),
				 errmsg("obx consumer %d, consumer group \"%s\": Kafka error: %s",
						state.w.number, c->sub.name, what)));
}

static void
consumer_error_callback(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
	Consumer *c = (Consumer *) opaque;

	note_kafka_error(c, psprintf("%s: %s", rd_kafka_err2name(err), reason));
}

/*
 * Build and subscribe the Kafka consumer of a subscription.  Returns false
 * with a message when librdkafka rejects the configuration.
 */
static bool
start_kafka_consumer(Consumer *c, char *errbuf, size_t errlen)
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
	rd_kafka_queue_io_event_enable(c->queue, state.pipefd[1], "1", 1);

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
stop_kafka_consumer(Consumer *c)
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
drop_consumer(Consumer *c)
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

static Consumer *
new_consumer(const ObxSubscription *sub)
{
	MemoryContext cxt = AllocSetContextCreate(TopMemoryContext, "obx consumer",
											  ALLOCSET_SMALL_SIZES);
	MemoryContext old = MemoryContextSwitchTo(cxt);
	Consumer *c = MemoryContextAllocZero(TopMemoryContext, sizeof(Consumer));
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
						state.w.number, sub->name, errbuf),
				 errhint("Check obx.brokers, obx.kafka_properties and the subscription's options; "
						 "obx tries again when they change.")));
		stop_kafka_consumer(c);
	}
	else
		ereport(LOG,
				(errmsg("obx consumer %d joined consumer group \"%s\"",
						state.w.number, sub->name)));
	return c;
}

/*
 * A subscription the workers cannot serve: its owner or handler is gone, or
 * the row holds what obx.subscribe refuses.  Kept as a consumer without a
 * Kafka handle, so that it is skipped, and said so, once per change of the
 * subscription.  obx.consumers shows the problem too.
 */
static Consumer *
skipped_consumer(const ObxSubscription *sub)
{
	Consumer *c = MemoryContextAllocZero(TopMemoryContext, sizeof(Consumer));

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
 * Bring the consumers in line with obx.subscriptions: start the new ones,
 * restart the changed ones, stop the removed ones.
 */
static void
refresh_subscriptions(void)
{
	MemoryContext old = MemoryContextSwitchTo(state.scratch);
	int n;
	ObxSubscription *subs = obx_inbox_subscriptions(&n);
	Consumer *kept = NULL;
	Consumer *c;
	int i;

	MemoryContextSwitchTo(old);

	/* Stop what is gone or changed. */
	while ((c = state.consumers) != NULL)
	{
		bool found = false;

		state.consumers = c->next;
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
							state.w.number, c->sub.name)));
			drop_consumer(c);
		}
	}
	state.consumers = kept;

	for (i = 0; i < n; i++)
	{
		bool running = false;

		for (c = state.consumers; c != NULL; c = c->next)
			if (strcmp(subs[i].name, c->sub.name) == 0)
				running = true;
		if (running)
			continue;
		if (subs[i].problem != NULL)
			c = skipped_consumer(&subs[i]);
		else
			c = new_consumer(&subs[i]);
		c->next = state.consumers;
		state.consumers = c;
	}
	MemoryContextReset(state.scratch);
}

static void
stop_all(void)
{
	Consumer *c;

	while ((c = state.consumers) != NULL)
	{
		state.consumers = c->next;
		drop_consumer(c);
	}
}

static HeldPartition *
find_held(Consumer *c, const char *topic, int32 partition)
{
	HeldPartition *h;

	for (h = c->held; h != NULL; h = h->next)
		if (h->partition == partition && strcmp(h->topic, topic) == 0)
			return h;
	return NULL;
}

static void
release_held(Consumer *c, HeldPartition *h)
{
	HeldPartition **p;

	for (p = &c->held; *p != NULL; p = &(*p)->next)
		if (*p == h)
		{
			*p = h->next;
			pfree(h->topic);
			pfree(h);
			return;
		}
}

static rd_kafka_topic_partition_list_t *
one_partition(const char *topic, int32 partition, int64 offset)
{
	rd_kafka_topic_partition_list_t *list = rd_kafka_topic_partition_list_new(1);

	rd_kafka_topic_partition_list_add(list, topic, partition)->offset = offset;
	return list;
}

/*
 * Stop fetching the partition and move its position back to the message
 * that must come next.
 */
static void
hold_back(Consumer *c, HeldPartition *h)
{
	rd_kafka_topic_partition_list_t *list = one_partition(h->topic, h->partition,
														  h->offset);
	rd_kafka_error_t *error;

	rd_kafka_pause_partitions(c->rk, list);
	error = rd_kafka_seek_partitions(c->rk, list, OBX_SEEK_TIMEOUT_MS);
	if (error != NULL)
	{
		/*
		 * The partition is not ours any more (a rebalance): whoever gets it
		 * starts from the committed offset, which is not past this message.
		 */
		ereport(LOG,
				(errmsg("obx consumer %d, consumer group \"%s\": could not seek topic \"%s\" partition %d to offset %lld: %s",
						state.w.number, c->sub.name, h->topic, h->partition,
						(long long) h->offset, rd_kafka_error_string(error))));
		rd_kafka_error_destroy(error);
	}
	rd_kafka_topic_partition_list_destroy(list);
}

static long
backoff_ms(int attempts)
{
	long ms = obx_backoff_min_ms;

	while (--attempts > 0 && ms < obx_backoff_max_ms)
		ms *= 2;
	return Min(ms, obx_backoff_max_ms);
}

/* Resume the held partitions whose backoff has passed. */
static void
resume_due(Consumer *c, TimestampTz now)
{
	HeldPartition *h;

	for (h = c->held; h != NULL; h = h->next)
	{
		rd_kafka_topic_partition_list_t *list;

		if (h->resume_at == 0 || now < h->resume_at)
			continue;
		h->resume_at = 0;
		list = one_partition(h->topic, h->partition, h->offset);
		rd_kafka_resume_partitions(c->rk, list);
		rd_kafka_topic_partition_list_destroy(list);
	}
}

static void
store_offset(Consumer *c, const rd_kafka_message_t *m)
{
	rd_kafka_topic_partition_list_t *list = one_partition(rd_kafka_topic_name(m->rkt),
														  m->partition,
														  m->offset + 1);
	rd_kafka_resp_err_t err = rd_kafka_offsets_store(c->rk, list);

	/* Not ours any more after a rebalance: the next owner re-reads it. */
	if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
		elog(DEBUG1, "obx consumer %d could not store an offset: %s",
			 state.w.number, rd_kafka_err2name(err));
	rd_kafka_topic_partition_list_destroy(list);
}

/*
 * Copy what the inbox needs of a Kafka message into *in: the message stays
 * valid until it is destroyed; header arrays are allocated in the current
 * (per-message) context.
 */
static void
inbound_message(Consumer *c, rd_kafka_message_t *m, ObxInbound *in)
{
	rd_kafka_headers_t *hdrs = NULL;
	rd_kafka_timestamp_type_t tstype;
	int64 ts;

	memset(in, 0, sizeof(ObxInbound));
	in->sub = &c->sub;
	in->topic = rd_kafka_topic_name(m->rkt);
	in->partition = m->partition;
	in->offset = m->offset;
	in->key = m->key;
	in->key_len = m->key_len;
	in->value = m->payload;
	in->value_len = m->len;
	ts = rd_kafka_message_timestamp(m, &tstype);
	if (tstype != RD_KAFKA_TIMESTAMP_NOT_AVAILABLE && ts >= 0)
		in->timestamp = (TimestampTz) ts * 1000 -
						((POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * SECS_PER_DAY * USECS_PER_SEC);
	if (rd_kafka_message_headers(m, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		size_t count = rd_kafka_header_cnt(hdrs);
		size_t i;

		in->header_names = palloc(sizeof(char *) * count);
		in->header_values = palloc(sizeof(char *) * count);
		in->header_lens = palloc(sizeof(size_t) * count);
		for (i = 0; i < count; i++)
		{
			const char *name;
			const void *value;
			size_t len;

			if (rd_kafka_header_get_all(hdrs, i, &name, &value, &len) !=
				RD_KAFKA_RESP_ERR_NO_ERROR)
				break;
			in->header_names[i] = name;
			in->header_values[i] = value;
			in->header_lens[i] = len;
			in->nheaders++;
		}
	}
}

/*
 * A transient failure: hold the message's partition back (h, or a new held
 * partition) for a backoff, with its position on the message.
 */
static void
hold_for_retry(Consumer *c, HeldPartition *h, const ObxInbound *in,
			   const char *error)
{
	if (h == NULL)
	{
		h = MemoryContextAllocZero(c->cxt, sizeof(HeldPartition));
		h->topic = MemoryContextStrdup(c->cxt, in->topic);
		h->partition = in->partition;
		h->next = c->held;
		c->held = h;
	}
	h->offset = in->offset;
	h->attempts++;
	hold_back(c, h);
	h->resume_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
											   backoff_ms(h->attempts));
	obx_inbox_note_retry(in, error);
}

/*
 * Hand one message to the inbox; store its offset once its transaction
 * has committed, or hold its partition back on a transient failure.
 *
 * A message of a held partition, or past the held message, was fetched
 * before the seek: every message before the held one has been handled, so
 * dropping it loses nothing, and the held message must come first.
 */
static void
handle_message(Consumer *c, rd_kafka_message_t *m)
{
	HeldPartition *h = find_held(c, rd_kafka_topic_name(m->rkt), m->partition);
	ObxInbound in;
	char errbuf[512];

	if (h != NULL && (h->resume_at != 0 || m->offset > h->offset))
	{
		if (h->resume_at == 0)
		{
			hold_back(c, h);
			h->resume_at = GetCurrentTimestamp();
		}
		return;
	}

	inbound_message(c, m, &in);
	if (obx_inbox_handle(&in, errbuf, sizeof(errbuf)) == OBX_INBOX_RETRY)
	{
		hold_for_retry(c, h, &in, errbuf);
		return;
	}

	/* Committed: only now may Kafka learn that the group is past it. */
	store_offset(c, m);
	if (h != NULL)
		release_held(c, h);
}

/*
 * Record the low and high watermarks of the consumer's partitions (from
 * librdkafka's cache, no network round trip) when they have changed.
 */
static void
record_watermarks(Consumer *c, TimestampTz now)
{
	rd_kafka_topic_partition_list_t *assigned = NULL;
	char **topics;
	int32 *parts;
	int64 *lows;
	int64 *highs;
	int64 sum = 0;
	int n = 0;
	int i;

	if (now < c->next_watermarks)
		return;
	c->next_watermarks = TimestampTzPlusMilliseconds(now, OBX_WATERMARK_INTERVAL_MS);
	if (rd_kafka_assignment(c->rk, &assigned) != RD_KAFKA_RESP_ERR_NO_ERROR)
		return;
	topics = palloc(sizeof(char *) * Max(assigned->cnt, 1));
	parts = palloc(sizeof(int32) * Max(assigned->cnt, 1));
	lows = palloc(sizeof(int64) * Max(assigned->cnt, 1));
	highs = palloc(sizeof(int64) * Max(assigned->cnt, 1));
	for (i = 0; i < assigned->cnt; i++)
	{
		rd_kafka_topic_partition_t *p = &assigned->elems[i];
		int64_t lo;
		int64_t hi;

		if (rd_kafka_get_watermark_offsets(c->rk, p->topic, p->partition,
										   &lo, &hi) != RD_KAFKA_RESP_ERR_NO_ERROR ||
			hi < 0)
			continue;
		topics[n] = pstrdup(p->topic);
		parts[n] = p->partition;
		lows[n] = lo;
		highs[n] = hi;
		sum += (lo + 1) * 31 + hi * 1000003 + p->partition;
		n++;
	}
	rd_kafka_topic_partition_list_destroy(assigned);
	if (n == 0 || sum == c->watermarks_sum)
		return;
	c->watermarks_sum = sum;
	obx_inbox_watermarks(c->sub.name, n, topics, parts, lows, highs);
}

/* Poll one message of c and serve it; false if there was none. */
static bool
serve_one(Consumer *c)
{
	rd_kafka_message_t *m = rd_kafka_consumer_poll(c->rk, 0);
	MemoryContext old;

	if (m == NULL)
		return false;
	old = MemoryContextSwitchTo(state.msg_cxt);
	if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR)
		handle_message(c, m);
	else
		note_kafka_error(c, psprintf("%s: %s", rd_kafka_err2name(m->err),
									 rd_kafka_message_errstr(m)));
	rd_kafka_message_destroy(m);
	MemoryContextSwitchTo(old);
	MemoryContextReset(state.msg_cxt);
	CHECK_FOR_INTERRUPTS();
	return true;
}

/*
 * Serve every consumer once: up to OBX_CONSUMER_FAIRNESS messages each.
 * Returns how many messages (or events) were served.
 */
static int
serve_consumers(void)
{
	TimestampTz now = GetCurrentTimestamp();
	Consumer *c;
	int served = 0;

	for (c = state.consumers; c != NULL && !ShutdownRequestPending; c = c->next)
	{
		int i;

		if (c->rk == NULL)
			continue;
		resume_due(c, now);
		for (i = 0; i < OBX_CONSUMER_FAIRNESS && !ShutdownRequestPending; i++)
		{
			if (!serve_one(c))
				break;
			served++;
		}
		record_watermarks(c, now);
	}
	return served;
}

/* Until the earliest held partition is due, at most timeout_ms. */
static long
next_wakeup_ms(long timeout_ms)
{
	Consumer *c;
	HeldPartition *h;

	for (c = state.consumers; c != NULL; c = c->next)
		for (h = c->held; h != NULL; h = h->next)
			if (h->resume_at != 0)
				timeout_ms = Min(timeout_ms, obx_ms_until(h->resume_at));
	return Max(timeout_ms, 1);
}

/* Sleep on the latch and the consumers' pipe, then empty the pipe. */
static void
wait_for_messages(long timeout_ms)
{
	char drain[64];

	obx_worker_wait(&state.w, timeout_ms, true);
	while (read(state.pipefd[0], drain, sizeof(drain)) > 0)
		;
}

/* SIGHUP: new Kafka settings restart every consumer with them. */
static void
consumer_reload(void)
{
	if (!obx_worker_reload(&state.w))
		return;
	ereport(LOG,
			(errmsg("obx consumer %d: Kafka settings changed, restarting its consumers",
					state.w.number)));
	stop_all();
}

/*
 * Every obx.poll_interval: whether obx is installed (if not, stop every
 * consumer and wait), and if so bring the consumers in line with
 * obx.subscriptions.
 */
static bool
subscriptions_ready(void)
{
	TimestampTz now = GetCurrentTimestamp();

	if (now < state.next_refresh)
		return true;
	state.next_refresh = TimestampTzPlusMilliseconds(now, obx_poll_interval_ms);
	if (!obx_worker_extension_ready(&state.w))
	{
		stop_all();
		wait_for_messages(obx_poll_interval_ms);
		return false;
	}
	refresh_subscriptions();
	return true;
}

/*
 * Start-up beyond the base: the worker's handler slot (see
 * obx_inbox_attach), the pipe its consumer queues signal on, its memory.
 */
static void
consumer_start(Datum main_arg)
{
	obx_worker_start(&state.w, OBX_WORKER_CONSUMER, main_arg);
	obx_inbox_attach(state.w.number);

	if (pipe(state.pipefd) != 0 ||
		fcntl(state.pipefd[0], F_SETFL, O_NONBLOCK) != 0 ||
		fcntl(state.pipefd[1], F_SETFL, O_NONBLOCK) != 0)
		elog(ERROR, "obx consumer could not create a pipe: %m");
	obx_worker_watch_fd(&state.w, state.pipefd[0]);

	state.scratch = AllocSetContextCreate(TopMemoryContext, "obx consumer loop",
										  ALLOCSET_DEFAULT_SIZES);
	state.msg_cxt = AllocSetContextCreate(TopMemoryContext, "obx consumer message",
										  ALLOCSET_DEFAULT_SIZES);
}

/*
 * obx_consumer_main
 *		Entry point of consumer worker number main_arg.  Each pass of the
 *		loop is a list of steps; a step that has to wait waits and starts the
 *		next pass.
 */
void
obx_consumer_main(Datum main_arg)
{
	consumer_start(main_arg);

	while (!ShutdownRequestPending)
	{
		MemoryContextSwitchTo(state.scratch);
		MemoryContextReset(state.scratch);
		consumer_reload();

		if (RecoveryInProgress())
		{
			stop_all();
			wait_for_messages(obx_poll_interval_ms);
			continue;
		}
		if (!subscriptions_ready())
			continue;
		obx_worker_housekeeping(&state.w);
		if (serve_consumers() == 0)
			wait_for_messages(next_wakeup_ms(Min(obx_poll_interval_ms,
												 OBX_WATERMARK_INTERVAL_MS)));
	}

	stop_all();
	obx_worker_exit(&state.w);
}
