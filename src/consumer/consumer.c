/*-------------------------------------------------------------------------
 *
 * consumer.c
 *	  The consumer worker: reads obx.subscriptions, keeps one librdkafka
 *	  consumer per subscription (consumer group = consumer name), gathers
 *	  the messages ready for a consumer into a batch, hands the batch to
 *	  inbox.c to apply in one transaction, and stores the offsets only after
 *	  that transaction has committed.
 *
 * A batch: up to obx.consumer_batch_size messages, gathered for at most
 * obx.consumer_batch_time with polls that do not wait (only what
 * librdkafka has already fetched; no transaction is open meanwhile).  Then
 * one transaction applies them in the order they came, in groups that each
 * take one subtransaction (inbox_group.c), a message that a group cannot
 * take in a subtransaction of its own (inbox.c), and commits; then the
 * offset past the last applied message of each partition is stored.
 *
 * Offsets: enable.auto.offset.store is off; the worker stores offset + 1
 * after the commit, and librdkafka's auto commit sends stored offsets to
 * the group coordinator (every auto.commit.interval.ms, on rebalance and on
 * close).  A crash between the commit and the offset commit re-delivers
 * messages whose effects are already committed; obx.mark_processed makes
 * them duplicates.
 *
 * Transient failures: the later messages of the failed message's partition
 * in the batch are not applied (the rest of the batch is, and commits);
 * after the commit the partition is paused and its fetch position sought
 * back to the failed message; after a backoff
 * (obx.backoff_min doubling up to obx.backoff_max) it is resumed and the
 * message comes again.  Until the message succeeds, any later message of
 * that partition that arrives is a leftover of the earlier fetch: the
 * worker seeks back again instead of handling it.  Other partitions and
 * other subscriptions go on meanwhile.  When the batch's commit fails,
 * every partition of the batch is held back so, at its first message.
 *
 * As in kafka.c, librdkafka's threads never run PostgreSQL code: signals
 * are blocked while a handle is created, logs go through the consumer's
 * queue, and callbacks run only inside rd_kafka_consumer_poll() on the
 * worker's thread.  Each consumer queue writes a byte to one pipe when it
 * becomes non-empty; the worker waits on that pipe and its latch (the
 * worker base's kept wait set, see worker.c).
 *
 * Several consumer workers serve every subscription; their consumers join
 * the same group, so the partitions are shared among them.  The consumers
 * themselves (built, refreshed, closed) are consumer_group.c's; this file
 * is the worker's loop and what it does with each message.
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
#include "housekeeping.h"
#include "handler.h"
#include "inbox.h"
#include "consumer_group.h"
#include "held.h"
#include "worker.h"
#include "protocol.h"

/* Messages handled per consumer (whole batches) before the others get a turn. */
#define OBX_CONSUMER_FAIRNESS 200

/*
 * Subtransaction ids a batch's transaction should take at most: fewer than
 * the PGPROC_MAX_CACHED_SUBXIDS (64) PostgreSQL caches per backend.  Past
 * those, every other session's snapshot has to look transactions up in
 * pg_subtrans while the batch runs, a slowdown for the whole server.
 */
#define OBX_BATCH_SUBXIDS 48

/*
 * Everything the consumer worker keeps between two passes of its loop.
 */
typedef struct ConsumerState
{
	ObxWorker w;
	MemoryContext scratch; /* reset every pass */
	MemoryContext msg_cxt; /* reset after every batch */
	int pipefd[2];         /* every consumer queue signals on pipefd[1] */
	TimestampTz next_refresh;
	int batch_limit; /* messages per batch, at most obx.consumer_batch_size */
} ConsumerState;

static ConsumerState state = {.pipefd = {-1, -1}, .batch_limit = INT_MAX};

/* A partition of the batch being applied. */
typedef struct BatchPart
{
	const char *topic;
	int32 partition;
	int first;           /* index of its first message in the batch */
	int64 done;          /* offset of its last applied message, or -1 */
	int failed;          /* index of its message that failed transiently, or -1 */
	bool handler_failed; /* that was its handler's error, not obx's */
	char *error;         /* why, when failed */
	struct BatchPart *next;
} BatchPart;

/* The messages of one batch of a consumer, in the order they came. */
typedef struct Batch
{
	ObxConsumer *c;
	int n;
	rd_kafka_message_t **msgs;
	ObxInbound *in;   /* what the inbox gets of msgs[i] */
	BatchPart **part; /* msgs[i]'s partition */
	BatchPart *parts;
} Batch;

int obx_consumer_batch_size = 500;
int obx_consumer_batch_time_ms = 5;

static void
store_offset(ObxConsumer *c, const char *topic, int32 partition, int64 offset)
{
	rd_kafka_topic_partition_list_t *list = obx_one_partition(topic, partition, offset);
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
inbound_message(ObxConsumer *c, rd_kafka_message_t *m, ObxInbound *in)
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
	in->handler_failures = obx_held_handler_failures(c, in->topic, m->partition,
													 m->offset);
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
 * Record the low and high watermarks of the consumer's partitions (from
 * librdkafka's cache, no network round trip) when they have changed.
 */
static void
record_watermarks(ObxConsumer *c, TimestampTz now)
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
	obx_consumers_record_watermarks(c->sub.name, n, topics, parts, lows, highs);
}

/*
 * Gather the messages ready for c into b: up to obx.consumer_batch_size,
 * for at most obx.consumer_batch_time, without waiting for the network.
 * Returns how many messages or events were polled.
 */
static int
gather_batch(ObxConsumer *c, Batch *b)
{
	TimestampTz until = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
													obx_consumer_batch_time_ms);
	int polled = 0;
	int limit = Min(obx_consumer_batch_size, state.batch_limit);

	b->c = c;
	b->n = 0;
	b->msgs = palloc(sizeof(rd_kafka_message_t *) * limit);
	while (b->n < limit)
	{
		rd_kafka_message_t *m = rd_kafka_consumer_poll(c->rk, 0);

		if (m == NULL)
			break;
		polled++;
		if (m->err != RD_KAFKA_RESP_ERR_NO_ERROR)
			obx_consumer_kafka_error(c, psprintf("%s: %s", rd_kafka_err2name(m->err),
												 rd_kafka_message_errstr(m)));
		else
			c->fetched = true;
		if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR && obx_held_take(c, m))
			b->msgs[b->n++] = m;
		else
			rd_kafka_message_destroy(m);
		if (GetCurrentTimestamp() >= until)
			break;
	}
	return polled;
}

/* Each message's partition in b, and what the inbox gets of it. */
static void
prepare_batch(Batch *b)
{
	int i;

	b->in = palloc(sizeof(ObxInbound) * Max(b->n, 1));
	b->part = palloc(sizeof(BatchPart *) * Max(b->n, 1));
	b->parts = NULL;
	for (i = 0; i < b->n; i++)
	{
		rd_kafka_message_t *m = b->msgs[i];
		const char *topic = rd_kafka_topic_name(m->rkt);
		BatchPart *p;

		for (p = b->parts; p != NULL; p = p->next)
			if (p->partition == m->partition && strcmp(p->topic, topic) == 0)
				break;
		if (p == NULL)
		{
			p = palloc0(sizeof(BatchPart));
			p->topic = topic;
			p->partition = m->partition;
			p->first = i;
			p->done = -1;
			p->failed = -1;
			p->next = b->parts;
			b->parts = p;
		}
		b->part[i] = p;
		inbound_message(b->c, m, &b->in[i]);
	}
}

/*
 * The messages of b from index next on, except those of partitions that
 * failed: their indexes in idx, the messages in run.  Returns how many.
 */
static int
remaining_run(Batch *b, int next, int *idx, const ObxInbound **run)
{
	int m = 0;
	int i;

	for (i = next; i < b->n; i++)
		if (b->part[i]->failed < 0)
		{
			idx[m] = i;
			run[m++] = &b->in[i];
		}
	return m;
}

/*
 * Apply message i of b alone; known: its handler's error in a group.
 * Returns what became of it.
 */
static ObxInboxResult
apply_alone(Batch *b, int i, const ObxInboxFailure *known,
			char *errbuf, size_t errlen)
{
	BatchPart *p = b->part[i];
	ObxInboxResult result = obx_inbox_apply(&b->in[i], known, errbuf, errlen);

	if (OBX_INBOX_RETRIED(result))
	{
		p->failed = i;
		p->handler_failed = (result == OBX_INBOX_HANDLER_RETRY);
		p->error = pstrdup(errbuf);
	}
	else
		p->done = b->in[i].offset;
	return result;
}

/*
 * Apply b in one transaction, in order: as groups of messages, each in one
 * subtransaction (obx_inbox_apply_group), and the messages a group cannot
 * take alone, each in a subtransaction of its own (obx_inbox_apply).
 * After a transient failure, no later message of that partition, and
 * after a shutdown request no message at all (the rest is read again).
 * Returns whether the transaction committed.
 *
 * A failed group is paid for again (its messages marked and handled up to
 * the failure, then once more up to it), so after a failure the next
 * group is no longer than the run that succeeded before it (longest), and
 * it doubles with every group that succeeds.  After a group that failed
 * at its first message, messages go alone until one succeeds: a batch
 * whose every message fails costs what it did before groups.
 */
static bool
apply_batch(Batch *b, char *errbuf, size_t errlen)
{
	int *idx = palloc(sizeof(int) * Max(b->n, 1));
	const ObxInbound **run = palloc(sizeof(ObxInbound *) * Max(b->n, 1));
	int next = 0;
	int longest = b->n;

	if (!obx_inbox_batch_begin(&b->c->sub, errbuf, errlen))
		return false;
	while (next < b->n && !ShutdownRequestPending)
	{
		int left = remaining_run(b, next, idx, run);
		int m = Min(left, longest);
		ObxInboxFailure failure;
		ObxInboxResult result;
		int applied;
		int j;

		if (left == 0)
			break;
		applied = (m == 0) ? 0 : obx_inbox_apply_group(run, m, &failure);
		for (j = 0; j < applied; j++)
			b->part[idx[j]]->done = b->in[idx[j]].offset;
		if (m > 0 && applied == m)
		{
			next = idx[m - 1] + 1;
			longest = Min(b->n, longest * 2);
			continue;
		}
		result = apply_alone(b, idx[applied], m == 0 ? NULL : &failure,
							 errbuf, errlen);
		next = idx[applied] + 1;
		if (m == 0)
			longest = (result == OBX_INBOX_PROCESSED ||
					   result == OBX_INBOX_DUPLICATE);
		else
			longest = applied;
		CHECK_FOR_INTERRUPTS();
	}
	return obx_inbox_batch_commit(errbuf, errlen);
}

/*
 * After the batch's transaction: on commit, store each partition's offset
 * past its last applied message (only now may Kafka learn that the group
 * is past it) and hold back the partitions that failed transiently; if the
 * commit failed, hold back every partition at its first message.
 */
static void
settle_batch(Batch *b, bool committed, const char *error)
{
	BatchPart *p;

	for (p = b->parts; p != NULL; p = p->next)
	{
		HeldPartition *h = obx_held_find(b->c, p->topic, p->partition);
		int retry = !committed ? p->first : p->failed;

		if (committed && p->done >= 0)
			store_offset(b->c, p->topic, p->partition, p->done + 1);
		if (h != NULL && (retry < 0 || b->in[retry].offset != h->offset))
		{
			obx_held_release(b->c, h);
			h = NULL;
		}
		if (retry >= 0)
			obx_held_retry(b->c, h, &b->in[retry],
						   committed ? p->error : error,
						   committed && p->handler_failed);
	}
}

/*
 * After a committed batch of n messages: how many messages the next batch
 * may have.  A group of messages takes one subtransaction id, a message
 * applied alone one or two; a handler with an exception block that writes
 * takes one per call, and would overflow the backend's cache with batches
 * of obx.consumer_batch_size.  The limit keeps such batches to about
 * OBX_BATCH_SUBXIDS ids at the last batch's rate; after an overflow, whose
 * rate is unknown, to half of OBX_BATCH_SUBXIDS messages at most, and
 * less again if that overflows too.
 */
static void
adapt_batch_limit(int n)
{
	bool overflowed;
	int subxids = obx_inbox_batch_subxids(&overflowed);

	if (overflowed)
		state.batch_limit = Max(1, Min(n, OBX_BATCH_SUBXIDS) / 2);
	else if (subxids <= 2 || n == 0)
		state.batch_limit = INT_MAX;
	else
		state.batch_limit = Max(1, (int) ((int64) n * OBX_BATCH_SUBXIDS / subxids));
}

/*
 * Serve one batch of c: gather, apply, settle.  Returns how many messages
 * or events were polled (0: nothing was ready).
 */
static int
serve_batch(ObxConsumer *c)
{
	MemoryContext old = MemoryContextSwitchTo(state.msg_cxt);
	Batch b;
	int polled = gather_batch(c, &b);
	char errbuf[512];
	int i;

	if (b.n > 0)
	{
		bool committed;

		prepare_batch(&b);
		committed = apply_batch(&b, errbuf, sizeof(errbuf));
		if (committed)
			adapt_batch_limit(b.n);
		settle_batch(&b, committed, errbuf);
	}
	for (i = 0; i < b.n; i++)
		rd_kafka_message_destroy(b.msgs[i]);
	MemoryContextSwitchTo(old);
	MemoryContextReset(state.msg_cxt);
	CHECK_FOR_INTERRUPTS();
	return polled;
}

/*
 * Serve every consumer once: batches of each until OBX_CONSUMER_FAIRNESS
 * messages or nothing is ready.  Returns how many messages (or events)
 * were served.
 */
static int
serve_consumers(void)
{
	TimestampTz now = GetCurrentTimestamp();
	ObxConsumer *c;
	int served = 0;

	for (c = obx_consumers(); c != NULL && !ShutdownRequestPending; c = c->next)
	{
		int mine = 0;

		obx_consumer_note_kafka(c);
		if (c->rk == NULL)
			continue;
		obx_held_resume_due(c, now);
		while (mine < OBX_CONSUMER_FAIRNESS && !ShutdownRequestPending)
		{
			int n = serve_batch(c);

			if (n == 0)
				break;
			mine += n;
		}
		served += mine;
		record_watermarks(c, now);
	}
	return served;
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
	obx_consumers_stop_all();
}

/*
 * Whether this database's subscriptions may be consumed: not while a
 * logical replication subscription writes into obx's tables here
 * (obx._replica_problem, read again once OBX_REPLICA_CHECK_MS passed).
 * Their rows are copies of the publisher's, whose consumers apply their
 * messages; a consumer here would join the same groups, take some of their
 * partitions, and apply those messages to this copy, where the publisher
 * never sees them.
 */
static bool
replica_free(void)
{
	(void) obx_worker_check_replica(&state.w, "consumes nothing",
									"Its subscriptions are copies; the consumers of the database "
									"they come from apply their messages.");
	return state.w.replica_problem == NULL;
}

/*
 * Every obx.poll_interval: whether obx is installed and this database is
 * no logical replica of obx's tables (if not, stop every consumer, leaving
 * its group, and wait: no consumer and no purge meanwhile), and if so
 * bring the consumers in line with obx.subscriptions.
 */
static bool
subscriptions_ready(void)
{
	TimestampTz now = GetCurrentTimestamp();

	if (now < state.next_refresh)
	{
		if (state.w.replica_problem == NULL)
			return true;
		wait_for_messages(obx_ms_until(state.next_refresh));
		return false;
	}
	state.next_refresh = TimestampTzPlusMilliseconds(now, obx_poll_interval_ms);
	if (!obx_worker_extension_ready(&state.w) || !replica_free())
	{
		obx_consumers_stop_all();
		wait_for_messages(obx_poll_interval_ms);
		return false;
	}
	obx_consumers_refresh(state.scratch);
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
	obx_consumers_init(state.w.number, state.pipefd[1]);

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
			obx_consumers_stop_all();
			wait_for_messages(obx_poll_interval_ms);
			continue;
		}
		if (!subscriptions_ready())
			continue;
		obx_housekeeping(&state.w);
		if (serve_consumers() == 0)
			wait_for_messages(obx_held_next_wakeup_ms(Min(obx_poll_interval_ms,
														  OBX_WATERMARK_INTERVAL_MS)));
	}

	obx_consumers_stop_all();
	obx_worker_exit(&state.w);
}
