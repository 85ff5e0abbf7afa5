/*-------------------------------------------------------------------------
 *
 * kafka.c
 *	  Everything librdkafka: building the idempotent producer from the
 *	  obx.* settings, producing a claimed batch, serving delivery reports,
 *	  logs and errors on the worker's own thread, and classifying errors.
 *
 * No transaction, SPI or catalog access happens here, and no callback ever
 * raises an ERROR: callbacks run inside rd_kafka_poll() and only record
 * what happened (delivery reports into the batch, errors into flags) or
 * log at LOG/WARNING level.
 *
 * A process that hosts librdkafka's threads keeps the memory it frees
 * (keep_freed_memory): returning it to the kernel would cost a TLB
 * shootdown on every CPU those threads ran on, after every batch.
 *
 * librdkafka's threads never run PostgreSQL code: all signals are blocked
 * while the handle is created, so its threads inherit a full mask and the
 * postmaster's signals reach only the worker's main thread.  The main
 * queue (delivery reports, logs, errors) writes a byte to a pipe when it
 * becomes non-empty, and the worker waits on that pipe together with its
 * latch.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <unistd.h>
#include <pthread.h>

#include <librdkafka/rdkafka.h>

#include "nodes/pg_list.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "obx.h"

struct ObxProducer
{
	rd_kafka_t *rk;
	rd_kafka_queue_t *mainq;
	int worker; /* the relay worker whose obx.workers row shows its errors */
	int pipefd[2];
	bool fatal;                    /* idempotence broke: rebuild the producer */
	TimestampTz broker_trouble_at; /* last connection error, or 0 */
	TimestampTz delivered_at;      /* last successful delivery, or 0 */
	List *topics;                  /* topics whose metadata was asked for */
};

/*
 * How long producing a batch waits, once per topic and producer, for the
 * metadata of a topic the producer has not produced to before.
 */
#define OBX_TOPIC_METADATA_WAIT_MS 500

/*
 * A connection error within this window, with no delivery since, means the
 * brokers are down.  librdkafka retries connections at least every
 * reconnect.backoff.max.ms (see obx_kafka_create) and reports each failure.
 */
#define OBX_BROKER_TROUBLE_WINDOW_MS 30000

static void
dr_callback(rd_kafka_t *rk, const rd_kafka_message_t *msg, void *opaque)
{
	ObxProducer *producer = (ObxProducer *) opaque;
	ObxEvent *ev = (ObxEvent *) msg->_private;

	/*
	 * The event's batch is still in memory: the relay frees a batch only
	 * once every report of it has arrived, or after destroying the
	 * producer, which serves all outstanding reports first.
	 */
	if (ev == NULL || ev->outcome != OBX_OUTCOME_IN_FLIGHT)
		return;

	ev->batch->in_flight--;
	if (msg->err == RD_KAFKA_RESP_ERR__PURGE_QUEUE ||
		msg->err == RD_KAFKA_RESP_ERR__PURGE_INFLIGHT)
	{
		/* We gave up on it; it may or may not have reached the broker. */
		ev->outcome = OBX_OUTCOME_UNSENT;
	}
	else if (msg->err == RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		ev->outcome = OBX_OUTCOME_DELIVERED;
		ev->partition = msg->partition;
		ev->offset = msg->offset;
		if (ev->acked_at == 0)
			ev->acked_at = GetCurrentTimestamp();
		producer->delivered_at = ev->acked_at;
	}
	else
	{
		ev->outcome = OBX_OUTCOME_FAILED;
		ev->err = msg->err;
		ev->error_class = obx_kafka_classify(msg->err);
		ev->partition = msg->partition;
	}
}

/*
 * The moment an acknowledgement arrives, on the librdkafka broker thread
 * that received it (an interceptor): the delivery report reaches the
 * worker only once it next serves its queue, which can be milliseconds
 * later when it is busy claiming or recording.  Only the event's own
 * acked_at is written, before librdkafka queues the report, and
 * the worker reads it after taking the report off that queue (under the
 * queue's lock).  No PostgreSQL function is called here except the clock,
 * which is plain gettimeofday().
 */
static rd_kafka_resp_err_t
ack_interceptor(rd_kafka_t *rk, rd_kafka_message_t *msg, void *opaque)
{
	ObxEvent *ev = (ObxEvent *) msg->_private;

	if (ev != NULL && msg->err == RD_KAFKA_RESP_ERR_NO_ERROR)
		ev->acked_at = GetCurrentTimestamp();
	return RD_KAFKA_RESP_ERR_NO_ERROR;
}

static rd_kafka_resp_err_t
add_ack_interceptor(rd_kafka_t *rk, const rd_kafka_conf_t *conf, void *opaque,
					char *errstr, size_t errstr_size)
{
	return rd_kafka_interceptor_add_on_acknowledgement(rk, "obx", ack_interceptor, NULL);
}

/*
 * librdkafka's log callback, for the producer and the consumers: it runs
 * on the worker's own thread (log.queue), inside a poll.
 */
static void
log_callback(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
	/* Broker trouble also arrives through error_callback, as a WARNING. */
	int elevel = level <= 4 ? LOG : (level <= 6 ? DEBUG1 : DEBUG2);

	ereport(elevel,
			(errmsg_internal("obx librdkafka %s: %s", fac, buf)));
}

static void
error_callback(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
	ObxProducer *producer = (ObxProducer *) opaque;
	char shown[256];

	/*
	 * Refused credentials or a failed TLS handshake keep every broker out
	 * of reach just as a network failure does.
	 */
	if (err == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN ||
		err == RD_KAFKA_RESP_ERR__TRANSPORT ||
		err == RD_KAFKA_RESP_ERR__RESOLVE ||
		err == RD_KAFKA_RESP_ERR__AUTHENTICATION ||
		err == RD_KAFKA_RESP_ERR__SSL)
		producer->broker_trouble_at = GetCurrentTimestamp();
	if (err == RD_KAFKA_RESP_ERR__FATAL)
	{
		char fatal[256];

		producer->fatal = true;
		rd_kafka_fatal_error(rk, fatal, sizeof(fatal));
		ereport(WARNING,
				(errcode(ERRCODE_CONNECTION_FAILURE),
				 errmsg("obx Kafka producer failed fatally: %s", fatal),
				 errdetail("The producer is rebuilt; undelivered events are retried with the same ids.")));
		return;
	}
	/*
	 * obx.workers shows it too, so that a connection or authentication
	 * failure is visible before (and besides) the delivery timeouts it
	 * causes.  librdkafka's reasons name the broker and the failure, never
	 * a configured value such as sasl.password.
	 */
	snprintf(shown, sizeof(shown), "%s: %s", rd_kafka_err2name(err), reason);
	obx_status_error(producer->worker, shown);
	ereport(WARNING,
			(errcode(ERRCODE_CONNECTION_FAILURE),
			 errmsg("obx Kafka error %s: %s", rd_kafka_err2name(err), reason)));
}

/*
 * obx_kafka_set
 *		Set one librdkafka property; false with a message naming it when
 *		librdkafka refuses.  Used for the producer and the consumers alike.
 */
bool
obx_kafka_set(rd_kafka_conf_t *conf, const char *name, const char *value,
			  char *errbuf, size_t errlen)
{
	char err[256];

	if (rd_kafka_conf_set(conf, name, value, err, sizeof(err)) != RD_KAFKA_CONF_OK)
	{
		snprintf(errbuf, errlen, "librdkafka property \"%s\": %s", name, err);
		return false;
	}
	return true;
}

/*
 * obx_kafka_user_properties
 *		Apply obx.kafka_properties: "name=value" pairs separated by
 *		semicolons.  Used for the producer and the consumers alike.
 *
 * Errors name the entry and the property but never echo a value, since
 * values may be secrets and errors reach the log and obx.workers.  Then
 * obx.kafka_properties_file (kafka_conf.c), where secrets belong.
 */
bool
obx_kafka_user_properties(rd_kafka_conf_t *conf, char *errbuf, size_t errlen)
{
	char *copy = pstrdup(obx_kafka_properties ? obx_kafka_properties : "");
	char *save = NULL;
	char *item;
	int entry = 0;

	for (item = strtok_r(copy, ";", &save); item; item = strtok_r(NULL, ";", &save))
	{
		char *eq;
		char *name;
		char *value;
		char err[256];
		rd_kafka_conf_res_t res;

		entry++;
		while (*item == ' ' || *item == '\t' || *item == '\n')
			item++;
		if (*item == '\0')
			continue;
		eq = strchr(item, '=');
		if (eq == NULL)
		{
			snprintf(errbuf, errlen,
					 "obx.kafka_properties entry %d is not name=value", entry);
			return false;
		}
		*eq = '\0';
		name = item;
		value = eq + 1;
		while (eq > name && (eq[-1] == ' ' || eq[-1] == '\t'))
			*--eq = '\0';
		while (*value == ' ' || *value == '\t')
			value++;
		res = rd_kafka_conf_set(conf, name, value, err, sizeof(err));
		if (res == RD_KAFKA_CONF_UNKNOWN)
		{
			snprintf(errbuf, errlen,
					 "obx.kafka_properties entry %d: librdkafka has no property \"%s\"",
					 entry, name);
			return false;
		}
		if (res != RD_KAFKA_CONF_OK)
		{
			snprintf(errbuf, errlen,
					 "obx.kafka_properties entry %d: invalid value for \"%s\"",
					 entry, name);
			return false;
		}
	}
	return obx_kafka_file_properties(conf, errbuf, errlen);
}

/*
 * OBX_KEEP_FREED_BYTES: how much freed memory a worker keeps for reuse
 * instead of handing it back to the kernel: two batches' payloads.
 */
#define OBX_KEEP_FREED_BYTES (2 * OBX_BATCH_BYTES)

/*
 * Stop glibc from returning freed memory to the kernel after each batch.
 *
 * By default it shrinks the heap whenever more than 128 kB at its top is
 * free, and serves every allocation over 128 kB with an mmap of its own.
 * Each batch's transactions and memory contexts free that much, so each
 * batch shrank the heap and grew it again.  In a single-threaded backend
 * that is cheap; in a process with librdkafka's threads, every shrink
 * (brk, munmap) interrupts all CPUs the process's threads ran on to flush
 * their TLBs, and every regrowth page-faults.  Measured at 2,000 events/s:
 * 9 % of the relay's CPU time went to those interrupts.
 */
static void
keep_freed_memory(void)
{
	static bool done = false;

	if (done)
		return;
	done = true;
	(void) mallopt(M_TRIM_THRESHOLD, OBX_KEEP_FREED_BYTES);
	(void) mallopt(M_MMAP_THRESHOLD, OBX_KEEP_FREED_BYTES);
}

/*
 * obx_kafka_new
 *		Create a librdkafka handle (producer or consumer) the way obx needs
 *		every handle: logs queued and served on the worker's own thread,
 *		and all signals blocked while librdkafka starts its threads, so
 *		they inherit a full mask.  On failure the caller still owns conf.
 */
rd_kafka_t *
obx_kafka_new(int type, rd_kafka_conf_t *conf, char *errbuf, size_t errlen)
{
	rd_kafka_t *rk;
	sigset_t all;
	sigset_t old;

	if (!obx_kafka_set(conf, "log.queue", "true", errbuf, errlen))
		return NULL;
	rd_kafka_conf_set_log_cb(conf, log_callback);
	keep_freed_memory();

	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	rk = rd_kafka_new((rd_kafka_type_t) type, conf, errbuf, errlen);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rk != NULL)
		rd_kafka_set_log_queue(rk, NULL);
	return rk;
}

/*
 * obx_kafka_create
 *		Build an idempotent producer (acks=all) from the current settings,
 *		for relay worker number worker.
 *
 * Returns NULL with a message in errbuf when the configuration is
 * rejected; the caller tries again a few seconds later.
 */
ObxProducer *
obx_kafka_create(int worker, char *errbuf, size_t errlen)
{
	ObxProducer *producer;
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	char timeout[32];

	producer = MemoryContextAllocZero(TopMemoryContext, sizeof(ObxProducer));
	producer->pipefd[0] = producer->pipefd[1] = -1;
	producer->worker = worker;

	snprintf(timeout, sizeof(timeout), "%d", obx_delivery_timeout_ms);

	/*
	 * A claim hands librdkafka a whole batch at once (obx.claim_gap
	 * gathers the commits of a busy moment), so a long linger.ms would
	 * only add its own wait.  Nagle's algorithm off: with it on, a request
	 * written while the broker has not yet acknowledged the previous one
	 * on that connection waits for that acknowledgement.
	 *
	 * Reconnects: librdkafka doubles the wait between attempts to reach a
	 * broker up to reconnect.backoff.max.ms, 10 s by default, so after an
	 * outage of every broker the backlog could wait that long once the
	 * cluster is back.  A quarter of a second keeps that wait short; a
	 * refused connection costs next to nothing.
	 */
	if (!obx_kafka_set(conf, "bootstrap.servers", obx_brokers, errbuf, errlen) ||
		!obx_kafka_set(conf, "client.id", "obx", errbuf, errlen) ||
		!obx_kafka_set(conf, "enable.idempotence", "true", errbuf, errlen) ||
		!obx_kafka_set(conf, "acks", "all", errbuf, errlen) ||
		!obx_kafka_set(conf, "message.timeout.ms", timeout, errbuf, errlen) ||
		!obx_kafka_set(conf, "partitioner", "murmur2_random", errbuf, errlen) ||
		!obx_kafka_set(conf, "linger.ms", "1", errbuf, errlen) ||
		!obx_kafka_set(conf, "socket.nagle.disable", "true", errbuf, errlen) ||
		!obx_kafka_set(conf, "reconnect.backoff.ms", "50", errbuf, errlen) ||
		!obx_kafka_set(conf, "reconnect.backoff.max.ms", "250", errbuf, errlen) ||
		!obx_kafka_user_properties(conf, errbuf, errlen))
	{
		rd_kafka_conf_destroy(conf);
		pfree(producer);
		return NULL;
	}
	/*
	 * Settings obx depends on win over user settings: its guarantees need
	 * idempotence and acks=all (obx_kafka_new forces log.queue, which
	 * keeps librdkafka's threads from ever calling into PostgreSQL's
	 * logging).
	 */
	if (!obx_kafka_set(conf, "enable.idempotence", "true", errbuf, errlen) ||
		!obx_kafka_set(conf, "acks", "all", errbuf, errlen))
	{
		rd_kafka_conf_destroy(conf);
		pfree(producer);
		return NULL;
	}

	rd_kafka_conf_set_opaque(conf, producer);
	rd_kafka_conf_set_dr_msg_cb(conf, dr_callback);
	rd_kafka_conf_set_error_cb(conf, error_callback);
	if (rd_kafka_conf_interceptor_add_on_new(conf, "obx", add_ack_interceptor, NULL) !=
		RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		snprintf(errbuf, errlen, "could not add the acknowledgement interceptor");
		rd_kafka_conf_destroy(conf);
		pfree(producer);
		return NULL;
	}

	producer->rk = obx_kafka_new(RD_KAFKA_PRODUCER, conf, errbuf, errlen);
	if (producer->rk == NULL)
	{
		/*
		 * conf is not destroyed: a failed rd_kafka_new() (librdkafka 2.0,
		 * e.g. an unreadable ssl.ca.location) has already freed the
		 * interceptors conf shares with the handle it gave up on, and
		 * destroying conf frees them again and crashes the worker.  The
		 * rest of conf leaks, once per attempt (every few seconds while
		 * the settings stay wrong).
		 */
		pfree(producer);
		return NULL;
	}

	if (pipe(producer->pipefd) != 0 ||
		fcntl(producer->pipefd[0], F_SETFL, O_NONBLOCK) != 0 ||
		fcntl(producer->pipefd[1], F_SETFL, O_NONBLOCK) != 0)
	{
		snprintf(errbuf, errlen, "could not create a pipe: %m");
		obx_kafka_destroy(producer, 0);
		return NULL;
	}
	producer->mainq = rd_kafka_queue_get_main(producer->rk);
	rd_kafka_queue_io_event_enable(producer->mainq, producer->pipefd[1], "1", 1);
	return producer;
}

/*
 * obx_kafka_destroy
 *		Flush for up to flush_ms, purge what is left, and free everything.
 *
 * Reports of purged events still land in their batches (as unsent: the
 * events are released and re-sent, the attempt not counted) before this
 * returns, so the caller may record and free the batches afterwards.
 */
void
obx_kafka_destroy(ObxProducer *producer, int flush_ms)
{
	if (producer == NULL)
		return;
	if (producer->rk != NULL)
	{
		if (flush_ms > 0)
			rd_kafka_flush(producer->rk, flush_ms);
		rd_kafka_purge(producer->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
		while (rd_kafka_poll(producer->rk, 0) > 0)
			;
		if (producer->mainq != NULL)
		{
			rd_kafka_queue_io_event_enable(producer->mainq, -1, NULL, 0);
			rd_kafka_queue_destroy(producer->mainq);
		}
		rd_kafka_destroy(producer->rk);
	}
	if (producer->pipefd[0] >= 0)
		close(producer->pipefd[0]);
	if (producer->pipefd[1] >= 0)
		close(producer->pipefd[1]);
	list_free_deep(producer->topics);
	pfree(producer);
}

int
obx_kafka_event_fd(ObxProducer *producer)
{
	return producer->pipefd[0];
}

static bool
same_key(const ObxEvent *a, const ObxEvent *b)
{
	return strcmp(a->key, b->key) == 0 && strcmp(a->topic, b->topic) == 0;
}

/*
 * Whether an earlier event of this event's key failed or was held back in
 * this batch; then this one must wait too, or it would overtake.
 */
static bool
key_held_back(ObxBatch *batch, int upto, ObxEvent **held, int nheld)
{
	int i;

	for (i = 0; i < nheld; i++)
		if (same_key(held[i], &batch->events[upto]))
			return true;
	return false;
}

/*
 * Ask the brokers for the metadata of each topic of the batch this
 * producer has not produced to before.
 *
 * librdkafka 2.0 looks up a topic it learns about after connecting only
 * on its once-a-second topic scan, so the first batch of every topic (the
 * whole first batch after a worker starts) would wait up to a second
 * before it is sent.  This asks at once instead, waiting at most
 * OBX_TOPIC_METADATA_WAIT_MS (no transaction is open here), once per topic
 * for the life of the producer, whatever the answer: after a timeout the
 * scan still finds the topic.
 */
static void
learn_topics(ObxProducer *producer, ObxBatch *batch)
{
	const char *last = NULL;
	int i;

	for (i = 0; i < batch->nevents; i++)
	{
		const char *topic = batch->events[i].topic;
		ListCell *lc;
		bool known = false;
		rd_kafka_topic_t *rkt;
		const struct rd_kafka_metadata *md;
		MemoryContext old;

		if (last != NULL && strcmp(last, topic) == 0)
			continue;
		last = topic;
		foreach (lc, producer->topics)
			if (strcmp((const char *) lfirst(lc), topic) == 0)
				known = true;
		if (known)
			continue;

		old = MemoryContextSwitchTo(TopMemoryContext);
		producer->topics = lappend(producer->topics, pstrdup(topic));
		MemoryContextSwitchTo(old);

		rkt = rd_kafka_topic_new(producer->rk, topic, NULL);
		if (rkt == NULL)
			continue;
		if (rd_kafka_metadata(producer->rk, 0, rkt, &md,
							  OBX_TOPIC_METADATA_WAIT_MS) == RD_KAFKA_RESP_ERR_NO_ERROR)
			rd_kafka_metadata_destroy(md);
		rd_kafka_topic_destroy(rkt);
	}
}

/*
 * obx_kafka_produce
 *		Hand every event of the batch to librdkafka, in batch (seq) order,
 *		with its key and the event_id, event_type and caller's headers.
 *
 * An event librdkafka refuses at once is marked FAILED, and the later
 * events of its key in the batch are left UNSENT so they cannot overtake
 * it.  Delivery reports land in the batch while the caller serves the
 * producer; several batches may be in flight at once.
 */
void
obx_kafka_produce(ObxProducer *producer, ObxBatch *batch)
{
	ObxEvent **held = palloc(sizeof(ObxEvent *) * batch->nevents);
	int nheld = 0;
	int i;

	batch->in_flight = 0;

	for (i = 0; i < batch->nevents; i++)
	{
		ObxEvent *ev = &batch->events[i];
		rd_kafka_headers_t *hdrs;
		rd_kafka_resp_err_t err;
		int h;

		ev->batch = batch;
		if (nheld > 0 && key_held_back(batch, i, held, nheld))
		{
			ev->outcome = OBX_OUTCOME_UNSENT;
			continue;
		}

		hdrs = rd_kafka_headers_new(2 + ev->nheaders);
		rd_kafka_header_add(hdrs, "event_id", -1, ev->id_text, -1);
		if (ev->event_type)
			rd_kafka_header_add(hdrs, "event_type", -1, ev->event_type, -1);
		for (h = 0; h < ev->nheaders; h++)
			rd_kafka_header_add(hdrs, ev->header_names[h], -1,
								ev->header_values[h], -1);

		for (;;)
		{
			err = rd_kafka_producev(producer->rk,
									RD_KAFKA_V_TOPIC(ev->topic),
									RD_KAFKA_V_KEY(ev->key, strlen(ev->key)),
									RD_KAFKA_V_VALUE(ev->payload, ev->payload_len),
									RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
									RD_KAFKA_V_HEADERS(hdrs),
									RD_KAFKA_V_OPAQUE(ev),
									RD_KAFKA_V_END);
			if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL)
				break;
			/* The local queue is full: let deliveries drain it. */
			rd_kafka_poll(producer->rk, 10);
		}

		if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
		{
			ev->outcome = OBX_OUTCOME_IN_FLIGHT;
			batch->in_flight++;
		}
		else
		{
			rd_kafka_headers_destroy(hdrs);
			ev->outcome = OBX_OUTCOME_FAILED;
			ev->refused_locally = true;
			ev->err = err;
			ev->error_class = obx_kafka_classify(err);
			held[nheld++] = ev;
		}
	}
	learn_topics(producer, batch);
}

/* The bytes of an event that count toward Kafka's size limits, roughly. */
static int
event_bytes(const ObxEvent *ev)
{
	return ev->payload_len + (int) strlen(ev->key);
}

static bool
refused_as_too_large(const ObxEvent *ev)
{
	return ev->outcome == OBX_OUTCOME_FAILED && !ev->refused_locally &&
		   ev->err == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE;
}

/*
 * obx_kafka_blame_oversize
 *		Keep a broker's MSG_SIZE_TOO_LARGE on the events that caused it.
 *
 * A broker refuses a whole record batch (the messages librdkafka sent
 * together to one partition) that exceeds the topic's max.message.bytes,
 * and librdkafka reports the error on every message of it: events that
 * would fit share the fate of the one that cannot.  (The Java producer
 * splits such a batch and sends it again; librdkafka does not.)  Of the
 * events of this batch so refused in one partition, only the largest keep
 * the error (permanent: quarantined); the others become unsent, so the
 * record releases them without counting the attempt and the next claim
 * sends them again, without it.  An event refused alone keeps the error.
 * Call once every report of the batch is in; returns how many it released.
 */
int
obx_kafka_blame_oversize(ObxBatch *batch)
{
	int released = 0;
	int i;
	int j;

	for (i = 0; i < batch->nevents; i++)
	{
		ObxEvent *ev = &batch->events[i];

		if (!refused_as_too_large(ev))
			continue;
		for (j = 0; j < batch->nevents; j++)
		{
			ObxEvent *other = &batch->events[j];

			if (refused_as_too_large(other) && other->partition == ev->partition &&
				strcmp(other->topic, ev->topic) == 0 &&
				event_bytes(other) > event_bytes(ev))
			{
				ev->outcome = OBX_OUTCOME_UNSENT;
				released++;
				break;
			}
		}
	}
	return released;
}

/*
 * obx_kafka_serve
 *		Serve everything waiting on the main queue: delivery reports, logs,
 *		errors.  Never blocks.
 */
void
obx_kafka_serve(ObxProducer *producer)
{
	char buf[64];

	/* A short read means the pipe is empty: no second read to hear EAGAIN. */
	while (read(producer->pipefd[0], buf, sizeof(buf)) == sizeof(buf))
		;
	while (rd_kafka_poll(producer->rk, 0) > 0)
		;
}

/*
 * obx_kafka_purge
 *		Drop events not yet sent; their reports say _PURGE_QUEUE.
 */
void
obx_kafka_purge(ObxProducer *producer)
{
	rd_kafka_purge(producer->rk, RD_KAFKA_PURGE_F_QUEUE);
	obx_kafka_serve(producer);
}

bool
obx_kafka_broken(ObxProducer *producer)
{
	return producer->fatal;
}

/*
 * obx_kafka_brokers_down
 *		Whether librdkafka reported connection trouble recently and nothing
 *		was delivered since.
 */
bool
obx_kafka_brokers_down(ObxProducer *producer)
{
	return producer->broker_trouble_at > producer->delivered_at &&
		   !TimestampDifferenceExceeds(producer->broker_trouble_at,
									   GetCurrentTimestamp(),
									   OBX_BROKER_TROUBLE_WINDOW_MS);
}

/*
 * obx_kafka_classify
 *		Sort a Kafka error into transient (retry forever), permanent
 *		(quarantine now) or other (retry up to obx.max_attempts).
 */
ObxErrorClass
obx_kafka_classify(int err)
{
	switch ((rd_kafka_resp_err_t) err)
	{
		case RD_KAFKA_RESP_ERR__MSG_TIMED_OUT:
		case RD_KAFKA_RESP_ERR__TIMED_OUT:
		case RD_KAFKA_RESP_ERR__TRANSPORT:
		case RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN:
		case RD_KAFKA_RESP_ERR__RESOLVE:
		case RD_KAFKA_RESP_ERR__QUEUE_FULL:
		case RD_KAFKA_RESP_ERR__PURGE_QUEUE:
		case RD_KAFKA_RESP_ERR__PURGE_INFLIGHT:
		case RD_KAFKA_RESP_ERR__DESTROY:
		case RD_KAFKA_RESP_ERR__FATAL:
		case RD_KAFKA_RESP_ERR__TIMED_OUT_QUEUE:
		case RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT:
		case RD_KAFKA_RESP_ERR_NETWORK_EXCEPTION:
		case RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE:
		case RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION:
		case RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS:
		case RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND:
		case RD_KAFKA_RESP_ERR_BROKER_NOT_AVAILABLE:
		case RD_KAFKA_RESP_ERR_REPLICA_NOT_AVAILABLE:
		case RD_KAFKA_RESP_ERR_KAFKA_STORAGE_ERROR:
		case RD_KAFKA_RESP_ERR_NOT_COORDINATOR:
		case RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE:
		case RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS:
		case RD_KAFKA_RESP_ERR_THROTTLING_QUOTA_EXCEEDED:
		case RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER:
		case RD_KAFKA_RESP_ERR_UNKNOWN_PRODUCER_ID:
		case RD_KAFKA_RESP_ERR_INVALID_PRODUCER_EPOCH:
			return OBX_ERROR_TRANSIENT;
		case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
		case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
		case RD_KAFKA_RESP_ERR_INVALID_RECORD:
		case RD_KAFKA_RESP_ERR_INVALID_MSG:
		case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
		case RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION:
		case RD_KAFKA_RESP_ERR__INVALID_ARG:
		case RD_KAFKA_RESP_ERR_UNSUPPORTED_FOR_MESSAGE_FORMAT:
		case RD_KAFKA_RESP_ERR_POLICY_VIOLATION:
			return OBX_ERROR_PERMANENT;
		default:
			return OBX_ERROR_OTHER;
	}
}

/*
 * obx_kafka_timed_out
 *		Whether librdkafka gave up on a message after message.timeout.ms
 *		(obx.delivery_timeout): the attempt has waited that long already.
 */
bool
obx_kafka_timed_out(int err)
{
	return err == RD_KAFKA_RESP_ERR__MSG_TIMED_OUT;
}

const char *
obx_kafka_error_name(int err)
{
	return rd_kafka_err2name((rd_kafka_resp_err_t) err);
}

const char *
obx_kafka_error_text(int err)
{
	return rd_kafka_err2str((rd_kafka_resp_err_t) err);
}

const char *
obx_error_class_name(ObxErrorClass cls)
{
	switch (cls)
	{
		case OBX_ERROR_TRANSIENT:
			return "transient";
		case OBX_ERROR_PERMANENT:
			return "permanent";
		case OBX_ERROR_OTHER:
			return "other";
	}
	return "other";
}
