/*-------------------------------------------------------------------------
 *
 * held.c
 *	  Partitions held back by a transient failure (the consumer worker's,
 *	  see consumer.c): paused and sought back to the failed message, resumed
 *	  after a backoff (obx.backoff_min doubling up to obx.backoff_max), and
 *	  the leftovers of earlier fetches dropped until the message comes again.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <librdkafka/rdkafka.h>

#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "obx.h"
#include "consumer_group.h"
#include "held.h"
#include "inbox.h"
#include "progress.h"
#include "worker.h"

#define OBX_SEEK_TIMEOUT_MS 5000

HeldPartition *
obx_held_find(ObxConsumer *c, const char *topic, int32 partition)
{
	HeldPartition *h;

	for (h = c->held; h != NULL; h = h->next)
		if (h->partition == partition && strcmp(h->topic, topic) == 0)
			return h;
	return NULL;
}

void
obx_held_release(ObxConsumer *c, HeldPartition *h)
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

rd_kafka_topic_partition_list_t *
obx_one_partition(const char *topic, int32 partition, int64 offset)
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
hold_back(ObxConsumer *c, HeldPartition *h)
{
	rd_kafka_topic_partition_list_t *list = obx_one_partition(h->topic, h->partition,
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
						obx_consumers_worker(), c->sub.name, h->topic, h->partition,
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
void
obx_held_resume_due(ObxConsumer *c, TimestampTz now)
{
	HeldPartition *h;

	for (h = c->held; h != NULL; h = h->next)
	{
		rd_kafka_topic_partition_list_t *list;

		if (h->resume_at == 0 || now < h->resume_at)
			continue;
		h->resume_at = 0;
		list = obx_one_partition(h->topic, h->partition, h->offset);
		rd_kafka_resume_partitions(c->rk, list);
		rd_kafka_topic_partition_list_destroy(list);
	}
}

/*
 * A transient failure (by_handler: the handler's error): hold the
 * message's partition back (h, or a new held partition) for a backoff,
 * with its position on the message.
 */
void
obx_held_retry(ObxConsumer *c, HeldPartition *h, const ObxInbound *in,
			   const char *error, bool by_handler)
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
	if (by_handler)
		h->handler_failures++;
	h->taken = false;
	hold_back(c, h);
	h->resume_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
											   backoff_ms(h->attempts));
	obx_inbox_note_retry(in, error);
}

/*
 * Whether a message polled for c goes into the batch.  A message of a held
 * partition, or past the held message, was fetched before the seek: every
 * message before the held one has been handled, so dropping it loses
 * nothing, and the held message must come first.  The messages after the
 * held one in the same batch follow it.
 */
bool
obx_held_take(ObxConsumer *c, rd_kafka_message_t *m)
{
	HeldPartition *h = obx_held_find(c, rd_kafka_topic_name(m->rkt), m->partition);

	if (h == NULL || h->taken)
		return true;
	if (h->resume_at != 0 || m->offset > h->offset)
	{
		if (h->resume_at == 0)
		{
			hold_back(c, h);
			h->resume_at = GetCurrentTimestamp();
		}
		return false;
	}
	h->taken = (m->offset == h->offset);
	return true;
}

/*
 * How many times the handler failed transiently on the message at offset
 * of a partition of c, held back since: 0 unless it is the held one.
 */
int
obx_held_handler_failures(ObxConsumer *c, const char *topic, int32 partition,
						  int64 offset)
{
	HeldPartition *h = obx_held_find(c, topic, partition);

	return (h != NULL && h->offset == offset) ? h->handler_failures : 0;
}

/* Until the earliest held partition is due, at most timeout_ms. */
long
obx_held_next_wakeup_ms(long timeout_ms)
{
	ObxConsumer *c;
	HeldPartition *h;

	for (c = obx_consumers(); c != NULL; c = c->next)
		for (h = c->held; h != NULL; h = h->next)
			if (h->resume_at != 0)
				timeout_ms = Min(timeout_ms, obx_ms_until(h->resume_at));
	return Max(timeout_ms, 1);
}
