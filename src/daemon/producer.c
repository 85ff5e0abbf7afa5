/*-------------------------------------------------------------------------
 *
 * producer.c
 *	  obx-relay's Kafka producer, everything librdkafka on the relay's
 *	  side (no database in it): the producer set as the in-database
 *	  relay's (src/relay/kafka.c), a claimed batch handed to it in seq
 *	  order, and the delivery reports written into the batch's events.
 *
 *-------------------------------------------------------------------------
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

#include "daemon.h"
#include "producer.h"
#include "settings.h"

/*
 * A delivery report, served by rd_kafka_poll on the relay's thread: how
 * the event went (where it landed and when, or its error), and one event
 * fewer in flight in its batch.
 */
static void
delivered(rd_kafka_t *rk, const rd_kafka_message_t *msg, void *opaque)
{
	Event *ev = (Event *) msg->_private;

	(void) rk;
	(void) opaque;
	if (ev == NULL)
		return;
	if (msg->err == RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		ev->outcome = DELIVERED;
		ev->partition = msg->partition;
		ev->offset = msg->offset;
		ev->acked_us = obx_now_us();
	}
	else
	{
		ev->outcome = FAILED;
		ev->err = msg->err;
	}
	ev->batch->in_flight--;
}

/*
 * The producer, set as the in-database relay's (src/relay/kafka.c): obx's
 * properties, then the user's, then what the guarantees need; NULL (said
 * why) if librdkafka refuses them.
 */
rd_kafka_t *
obx_producer_new(void)
{
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	char timeout[32];
	char err[512];
	rd_kafka_t *rk;
	int i;
	bool ok;

	snprintf(timeout, sizeof(timeout), "%d", obx_config.delivery_timeout_ms);
	ok = obx_kafka_set(conf, "bootstrap.servers", obx_config.brokers) &&
		 obx_kafka_set(conf, "client.id", "obx-relay") &&
		 obx_kafka_set(conf, "message.timeout.ms", timeout) &&
		 obx_kafka_set(conf, "partitioner", "murmur2_random") &&
		 obx_kafka_set(conf, "linger.ms", "5") &&
		 obx_kafka_set(conf, "socket.nagle.disable", "true") &&
		 obx_kafka_set(conf, "reconnect.backoff.ms", "50") &&
		 obx_kafka_set(conf, "reconnect.backoff.max.ms", "250");
	for (i = 0; ok && i < obx_config.nkafka; i++)
		ok = obx_kafka_set(conf, obx_config.kafka_names[i], obx_config.kafka_values[i]);
	ok = ok && obx_kafka_set(conf, "enable.idempotence", "true") && obx_kafka_set(conf, "acks", "all");
	if (!ok)
	{
		rd_kafka_conf_destroy(conf);
		return NULL;
	}
	rd_kafka_conf_set_dr_msg_cb(conf, delivered);
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
	if (rk == NULL)
	{
		obx_say("ERROR", "could not create the Kafka producer: %s", err);
		return NULL;
	}
	return rk;
}

/*
 * Ask the brokers at once for the metadata of each topic of the batch not
 * produced to before: librdkafka 2.0 would otherwise wait for its periodic
 * topic scan before sending the first batch of a topic (src/relay/kafka.c,
 * learn_topics).  At most half a second per new topic, no transaction open.
 */
#define MAX_KNOWN_TOPICS 1024
static char *known_topics[MAX_KNOWN_TOPICS];
static int nknown_topics = 0;

static void
learn_topics(rd_kafka_t *rk, Batch *batch)
{
	int i;
	int j;

	for (i = 0; i < batch->nevents; i++)
	{
		const char *topic = batch->events[i].topic;
		rd_kafka_topic_t *rkt;
		const struct rd_kafka_metadata *md;
		bool known = false;

		for (j = 0; j < nknown_topics && !known; j++)
			known = strcmp(known_topics[j], topic) == 0;
		if (known || nknown_topics == MAX_KNOWN_TOPICS)
			continue;
		known_topics[nknown_topics++] = obx_xstrdup(topic);
		rkt = rd_kafka_topic_new(rk, topic, NULL);
		if (rkt == NULL)
			continue;
		if (rd_kafka_metadata(rk, 0, rkt, &md, 500) == RD_KAFKA_RESP_ERR_NO_ERROR)
			rd_kafka_metadata_destroy(md);
		rd_kafka_topic_destroy(rkt);
	}
}

static bool
same_key(const Event *a, const Event *b)
{
	return strcmp(a->key, b->key) == 0 && strcmp(a->topic, b->topic) == 0;
}

/*
 * Hand the batch to librdkafka in seq order, the payloads not copied: they
 * stay in the claim's rows until the batch's every report is in.  An event it refuses at once
 * fails, and the later events of its key stay unsent so that they cannot
 * overtake it (src/relay/kafka.c does the same).
 */
void
obx_produce(rd_kafka_t *rk, Batch *batch)
{
	Event **refused = obx_xcalloc(batch->nevents, sizeof(Event *));
	int nrefused = 0;
	int i;

	learn_topics(rk, batch);
	batch->in_flight = 0;
	for (i = 0; i < batch->nevents; i++)
	{
		Event *ev = &batch->events[i];
		rd_kafka_headers_t *hdrs;
		rd_kafka_resp_err_t err;
		bool held = false;
		int j;

		for (j = 0; j < nrefused && !held; j++)
			held = same_key(refused[j], ev);
		if (held)
			continue;
		hdrs = rd_kafka_headers_new(2 + ev->nheaders);
		rd_kafka_header_add(hdrs, "event_id", -1, ev->id, -1);
		if (ev->event_type != NULL)
			rd_kafka_header_add(hdrs, "event_type", -1, ev->event_type, -1);
		for (j = 0; j < ev->nheaders; j++)
			rd_kafka_header_add(hdrs, ev->header_names[j], -1, ev->header_values[j], -1);
		for (;;)
		{
			err = rd_kafka_producev(rk,
									RD_KAFKA_V_TOPIC(ev->topic),
									RD_KAFKA_V_KEY(ev->key, strlen(ev->key)),
									RD_KAFKA_V_VALUE((void *) ev->payload, ev->payload_len),
									RD_KAFKA_V_MSGFLAGS(0),
									RD_KAFKA_V_HEADERS(hdrs),
									RD_KAFKA_V_OPAQUE(ev),
									RD_KAFKA_V_END);
			if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL)
				break;
			rd_kafka_poll(rk, 10);
		}
		if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
		{
			ev->outcome = IN_FLIGHT;
			batch->in_flight++;
		}
		else
		{
			rd_kafka_headers_destroy(hdrs);
			ev->outcome = FAILED;
			ev->err = err;
			ev->refused_locally = true;
			refused[nrefused++] = ev;
		}
	}
	free(refused);
}

/*
 * Close the producer: wait up to delivery_timeout for the reports still
 * due, then forget the topics it learnt.
 */
void
obx_producer_close(rd_kafka_t *rk)
{
	rd_kafka_flush(rk, obx_config.delivery_timeout_ms);
	rd_kafka_destroy(rk);
	while (nknown_topics > 0)
		free(known_topics[--nknown_topics]);
}
