/*-------------------------------------------------------------------------
 *
 * held.c
 *	  The partitions obx-relay's consumer holds back, as the consumer
 *	  workers do (src/consumer/held.c).  A message whose call failed (the
 *	  connection broke, obx's statements failed), whose handler failed
 *	  transiently ("retry") or whose subscription cannot be served now
 *	  ("refused") holds its partition: it is paused and sought back to
 *	  that message, and resumed after a backoff (backoff_min doubling up
 *	  to backoff_max), so no later message of the partition overtakes it.
 *	  The rules are docs/consumers.md's, "Consuming with obx-relay".
 *
 *-------------------------------------------------------------------------
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

#include "daemon.h"
#include "held.h"
#include "settings.h"

#define SEEK_TIMEOUT 5000

/* The subscription's hold on the partition, or NULL. */
Held *
obx_held_find(Sub *s, const char *topic, int partition)
{
	Held *h;

	for (h = s->held; h != NULL; h = h->next)
		if (h->partition == partition && strcmp(h->topic, topic) == 0)
			return h;
	return NULL;
}

/* Forget a hold: its message was applied, or the consumer closes. */
void
obx_held_release(Sub *s, Held *h)
{
	Held **p;

	for (p = &s->held; *p != NULL; p = &(*p)->next)
		if (*p == h)
		{
			*p = h->next;
			free(h->topic);
			free(h);
			return;
		}
}

/* A list of one partition at an offset, for librdkafka; the caller destroys it. */
rd_kafka_topic_partition_list_t *
obx_partition_list(const char *topic, int partition, long long offset)
{
	rd_kafka_topic_partition_list_t *list = rd_kafka_topic_partition_list_new(1);

	rd_kafka_topic_partition_list_add(list, topic, partition)->offset = offset;
	return list;
}

/* Stop fetching the partition; its next message is the held one. */
static void
hold_back(Sub *s, Held *h)
{
	rd_kafka_topic_partition_list_t *list = obx_partition_list(h->topic, h->partition, h->offset);
	rd_kafka_error_t *error;

	rd_kafka_pause_partitions(s->rk, list);
	error = rd_kafka_seek_partitions(s->rk, list, SEEK_TIMEOUT);
	if (error != NULL)
	{
		/* No longer ours: whoever gets it starts at or before this message. */
		obx_say("LOG", "consumer group \"%s\": could not seek topic \"%s\" partition %d to offset %lld: %s",
				s->name, h->topic, h->partition, h->offset, rd_kafka_error_string(error));
		rd_kafka_error_destroy(error);
	}
	rd_kafka_topic_partition_list_destroy(list);
}

/* Hold the message's partition back for a backoff. */
void
obx_hold(Sub *s, const rd_kafka_message_t *m, bool by_handler)
{
	const char *topic = rd_kafka_topic_name(m->rkt);
	Held *h = obx_held_find(s, topic, m->partition);
	long long ms = obx_config.backoff_min_ms;
	int i;

	if (h == NULL)
	{
		h = obx_xcalloc(1, sizeof(Held));
		h->topic = obx_xstrdup(topic);
		h->partition = m->partition;
		h->next = s->held;
		s->held = h;
	}
	if (h->offset != m->offset)
		h->attempts = h->handler_failures = 0;
	h->offset = m->offset;
	h->attempts++;
	h->handler_failures += by_handler;
	for (i = 1; i < h->attempts && ms < obx_config.backoff_max_ms; i++)
		ms *= 2;
	if (ms > obx_config.backoff_max_ms)
		ms = obx_config.backoff_max_ms;
	hold_back(s, h);
	h->resume_at = obx_now_us() + ms * 1000;
}

/* Resume the partitions whose backoff is over: their held message comes again. */
void
obx_held_resume_due(Sub *s)
{
	long long now = obx_now_us();
	Held *h;

	for (h = s->held; h != NULL; h = h->next)
	{
		rd_kafka_topic_partition_list_t *list;

		if (h->resume_at == 0 || now < h->resume_at)
			continue;
		h->resume_at = 0;
		list = obx_partition_list(h->topic, h->partition, h->offset);
		rd_kafka_resume_partitions(s->rk, list);
		rd_kafka_topic_partition_list_destroy(list);
	}
}

/*
 * Whether to apply a polled message: not while its partition waits, nor
 * one past the held message (fetched before the seek; every message before
 * the held one was applied, so dropping it loses nothing).
 */
bool
obx_held_take(Sub *s, const rd_kafka_message_t *m)
{
	Held *h = obx_held_find(s, rd_kafka_topic_name(m->rkt), m->partition);

	if (h == NULL)
		return true;
	if (h->resume_at != 0 || m->offset > h->offset)
	{
		if (h->resume_at == 0)
		{
			hold_back(s, h);
			h->resume_at = obx_now_us();
		}
		return false;
	}
	return true;
}
