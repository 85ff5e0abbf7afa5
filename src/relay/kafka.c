/*-------------------------------------------------------------------------
 *
 * kafka.c
 *	  The relay's librdkafka producer: building the idempotent producer
 *	  from the obx.* settings, producing a claimed batch, serving delivery
 *	  reports, logs and errors on the worker's own thread, and classifying
 *	  errors.  The handle itself is created by obx_kafka_new (kafka_conf.c).
 *
 * No transaction, SPI or catalog access happens here, and no callback ever
 * raises an ERROR: callbacks run inside rd_kafka_poll() and only record
 * what happened (delivery reports into the batch, errors into flags) or
 * log at LOG/WARNING level.
 *
 * The main queue (delivery reports, logs, errors) writes a byte to a pipe
 * when it becomes non-empty, and the worker waits on that pipe together
 * with its latch.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <fcntl.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

#include "nodes/pg_list.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "obx.h"
#include "outbox.h"
#include "status.h"
#include "kafka.h"
#include "kafka_conf.h"
#include "cloudevents.h"

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
 * reconnect.backoff.max.ms (see set_producer_properties) and reports each
 * failure.
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
	else if (msg->err == RD_KAFKA_RESP_ERR_NO_ERROR && msg->offset < 0)
	{
		/*
		 * "Delivered" with no offset: no broker said where it wrote the
		 * message.  librdkafka reports this when it infers that a retried
		 * request was persisted because the broker refused its sequence
		 * number after accepting a later one; that inference is wrong when
		 * the broker accepted the later request first because the earlier
		 * one reached it before it knew the partition (a new topic,
		 * KAFKA-15591), and the message was never written.  Send it
		 * again: at worst a duplicate with the same event id.
		 */
		ev->outcome = OBX_OUTCOME_UNSENT;
		ereport(WARNING,
				(errmsg("obx: Kafka reported event %s as delivered to %s [%d] without an offset; it is sent again",
						ev->id_text, ev->topic, msg->partition),
				 errdetail("The broker may not hold it: it refused the request's sequence number after accepting a later one. "
						   "If it does hold it, consumers see a duplicate with the same event_id, after the key's later events.")));
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
 * worker only once it next serves its queue, which comes later when it
 * is busy claiming or recording.  Only the event's own
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
 * The producer's properties: obx's own, then obx.kafka_properties and its
 * file, then what obx's guarantees need, which wins over the user's.
 *
 * A claim hands librdkafka a whole batch at once (obx.claim_gap gathers
 * the commits of a busy moment).  linger.ms is long enough that the batch
 * leaves in one produce request per broker, not split by the time it takes
 * to hand it over, and short beside a turn (docs/configuration.md).  Nagle's algorithm off: with it on, a request written while the
 * broker has not yet acknowledged the previous one on that connection
 * waits for that acknowledgement.  Reconnects: librdkafka doubles the wait
 * between attempts to reach a broker up to reconnect.backoff.max.ms
 * (seconds by default), so after an outage of every broker the backlog
 * could wait that long once the cluster is back; a short maximum keeps
 * that wait short, and a refused connection costs next to nothing.
 */
static bool
set_producer_properties(rd_kafka_conf_t *conf, char *errbuf, size_t errlen)
{
	char timeout[32];

	snprintf(timeout, sizeof(timeout), "%d", obx_delivery_timeout_ms);
	if (!obx_kafka_set(conf, "bootstrap.servers", obx_brokers, errbuf, errlen) ||
		!obx_kafka_set(conf, "client.id", "obx", errbuf, errlen) ||
		!obx_kafka_set(conf, "enable.idempotence", "true", errbuf, errlen) ||
		!obx_kafka_set(conf, "acks", "all", errbuf, errlen) ||
		!obx_kafka_set(conf, "message.timeout.ms", timeout, errbuf, errlen) ||
		!obx_kafka_set(conf, "partitioner", "murmur2_random", errbuf, errlen) ||
		!obx_kafka_set(conf, "linger.ms", "5", errbuf, errlen) ||
		!obx_kafka_set(conf, "socket.nagle.disable", "true", errbuf, errlen) ||
		!obx_kafka_set(conf, "reconnect.backoff.ms", "50", errbuf, errlen) ||
		!obx_kafka_set(conf, "reconnect.backoff.max.ms", "250", errbuf, errlen) ||
		!obx_kafka_user_properties(conf, errbuf, errlen))
		return false;

	/*
	 * Idempotence and acks=all win over user settings (obx_kafka_new forces
	 * log.queue, which keeps librdkafka's threads from ever calling into
	 * PostgreSQL's logging).
	 */
	return obx_kafka_set(conf, "enable.idempotence", "true", errbuf, errlen) &&
		   obx_kafka_set(conf, "acks", "all", errbuf, errlen);
}

/* Delivery reports, errors and acknowledgement times reach producer. */
static bool
set_producer_callbacks(rd_kafka_conf_t *conf, ObxProducer *producer,
					   char *errbuf, size_t errlen)
{
	rd_kafka_conf_set_opaque(conf, producer);
	rd_kafka_conf_set_dr_msg_cb(conf, dr_callback);
	rd_kafka_conf_set_error_cb(conf, error_callback);
	if (rd_kafka_conf_interceptor_add_on_new(conf, "obx", add_ack_interceptor, NULL) !=
		RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		snprintf(errbuf, errlen, "could not add the acknowledgement interceptor");
		return false;
	}
	return true;
}

/* The pipe the main queue writes to when it becomes non-empty. */
static bool
open_event_pipe(ObxProducer *producer, char *errbuf, size_t errlen)
{
	if (pipe(producer->pipefd) != 0 ||
		fcntl(producer->pipefd[0], F_SETFL, O_NONBLOCK) != 0 ||
		fcntl(producer->pipefd[1], F_SETFL, O_NONBLOCK) != 0)
	{
		snprintf(errbuf, errlen, "could not create a pipe: %m");
		return false;
	}
	producer->mainq = rd_kafka_queue_get_main(producer->rk);
	rd_kafka_queue_io_event_enable(producer->mainq, producer->pipefd[1], "1", 1);
	return true;
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

	producer = MemoryContextAllocZero(TopMemoryContext, sizeof(ObxProducer));
	producer->pipefd[0] = producer->pipefd[1] = -1;
	producer->worker = worker;
	if (!set_producer_properties(conf, errbuf, errlen) ||
		!set_producer_callbacks(conf, producer, errbuf, errlen))
	{
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
		 * rest of conf leaks, once per attempt while the settings stay
		 * wrong.
		 */
		pfree(producer);
		return NULL;
	}

	if (!open_event_pipe(producer, errbuf, errlen))
	{
		obx_kafka_destroy(producer, 0);
		return NULL;
	}
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
 * on its periodic topic scan, so the first batch of every topic (the
 * whole first batch after a worker starts) would wait for that scan
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
		obx_cloudevents_add(hdrs, ev);

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
