/*-------------------------------------------------------------------------
 *
 * latency.c
 *	  Publish latency per topic: how long each published event took from
 *	  its enqueue (occurred_at, clock_timestamp() when obx.enqueue inserted
 *	  it) to the broker's acknowledgement (published_at, when librdkafka
 *	  received it).  The record step (outbox.c) adds every event it marks
 *	  published, once its transaction committed; obx.publish_latency()
 *	  reads the counts.
 *
 * The histogram lives in shared memory, so it outlives the retention purge
 * and a worker's restart (not a server restart).  Its buckets are fixed
 * (latency_bounds_ms).  Up to OBX_LATENCY_TOPICS topics get rows of their
 * own, in the order they were first published; the events of any later
 * topic are counted under OBX_LATENCY_OTHER, a name no Kafka topic can
 * have.  One LWLock guards it: the record step takes it once per batch.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/float.h"

#include "compat.h"
#include "latency.h"

#define OBX_LATENCY_TOPICS 64
#define OBX_LATENCY_OTHER  "(other)"
#define OBX_TOPIC_SIZE     250 /* Kafka topic names have up to 249 bytes */

/* Upper bounds of the buckets, in milliseconds; one more bucket, +Inf. */
static const int latency_bounds_ms[] = {1, 2, 5, 10, 20, 50, 100, 200, 500,
										1000, 2000, 5000, 10000};

#define OBX_LATENCY_BOUNDS lengthof(latency_bounds_ms)

typedef struct TopicLatency
{
	char topic[OBX_TOPIC_SIZE];
	uint64 counts[OBX_LATENCY_BOUNDS + 1]; /* per bucket, the last +Inf */
	uint64 count;
	int64 sum_us;
} TopicLatency;

typedef struct LatencyShared
{
	LWLock *lock;
	int ntopics; /* rows in use, OBX_LATENCY_OTHER's included */
	TopicLatency topics[OBX_LATENCY_TOPICS + 1];
} LatencyShared;

static LatencyShared *latency = NULL;

PG_FUNCTION_INFO_V1(obx_publish_latency);

Size
obx_latency_shmem_size(void)
{
	return MAXALIGN(sizeof(LatencyShared));
}

/* From the shmem_request hook. */
void
obx_latency_shmem_request(void)
{
	RequestAddinShmemSpace(obx_latency_shmem_size());
	RequestNamedLWLockTranche("obx latency", 1);
}

/* From the shmem_startup hook, under AddinShmemInitLock. */
void
obx_latency_shmem_init(void)
{
	bool found;

	latency = ShmemInitStruct("obx latency", sizeof(LatencyShared), &found);
	if (!found)
	{
		memset(latency, 0, sizeof(LatencyShared));
		latency->lock = &(GetNamedLWLockTranche("obx latency"))->lock;
	}
}

/* The row of a topic, added if there is room; caller holds the lock. */
static TopicLatency *
topic_row(const char *topic)
{
	int i;

	for (i = 0; i < latency->ntopics; i++)
		if (strcmp(latency->topics[i].topic, topic) == 0)
			return &latency->topics[i];
	if (latency->ntopics < OBX_LATENCY_TOPICS)
		i = latency->ntopics++;
	else
	{
		topic = OBX_LATENCY_OTHER;
		i = OBX_LATENCY_TOPICS;
		if (latency->topics[i].topic[0] == '\0')
			latency->ntopics++;
	}
	strlcpy(latency->topics[i].topic, topic, OBX_TOPIC_SIZE);
	return &latency->topics[i];
}

/* The bucket a latency falls in: the first whose bound it does not exceed. */
static int
bucket_of(int64 latency_us)
{
	int b;

	for (b = 0; b < OBX_LATENCY_BOUNDS; b++)
		if (latency_us <= (int64) latency_bounds_ms[b] * 1000)
			return b;
	return OBX_LATENCY_BOUNDS;
}

/*
 * obx_latency_add
 *		Count published events.  The caller has committed their record, so
 *		each event is counted once per time it was published (a replayed
 *		event again, from its original occurred_at).
 */
void
obx_latency_add(const ObxLatencySample *samples, int n)
{
	TopicLatency *row = NULL;
	const char *row_of = NULL; /* the topic row was looked up for */
	int i;

	if (latency == NULL || n == 0)
		return;
	LWLockAcquire(latency->lock, LW_EXCLUSIVE);
	for (i = 0; i < n; i++)
	{
		int64 us = Max(samples[i].latency_us, 0);

		if (row_of == NULL || strcmp(row_of, samples[i].topic) != 0)
		{
			row = topic_row(samples[i].topic);
			row_of = samples[i].topic;
		}
		row->counts[bucket_of(us)]++;
		row->count++;
		row->sum_us += us;
	}
	LWLockRelease(latency->lock);
}

/*
 * obx.publish_latency() returns setof (topic, le, count, sum): per topic,
 * one row per bucket, cumulative as Prometheus has it: count is the events
 * whose latency was at most le seconds (the last row, le = Infinity, all
 * of them); sum is the topic's total latency in seconds.  Empty when obx
 * is not preloaded (no relay, no histogram).
 */
Datum
obx_publish_latency(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	TopicLatency *copy;
	int i;

	obx_init_materialized_srf(fcinfo, false);
	if (latency == NULL)
		return (Datum) 0;

	copy = palloc(sizeof(latency->topics));
	LWLockAcquire(latency->lock, LW_SHARED);
	memcpy(copy, latency->topics, sizeof(latency->topics));
	LWLockRelease(latency->lock);

	for (i = 0; i < OBX_LATENCY_TOPICS + 1; i++)
	{
		uint64 cumulative = 0;
		int b;

		if (copy[i].topic[0] == '\0')
			continue;
		for (b = 0; b <= OBX_LATENCY_BOUNDS; b++)
		{
			Datum values[4];
			bool nulls[4] = {0};

			cumulative += copy[i].counts[b];
			values[0] = CStringGetTextDatum(copy[i].topic);
			values[1] = Float8GetDatum(b < OBX_LATENCY_BOUNDS
										   ? latency_bounds_ms[b] / 1000.0
										   : get_float8_infinity());
			values[2] = Int64GetDatum((int64) cumulative);
			values[3] = Float8GetDatum(copy[i].sum_us / 1000000.0);
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		}
	}
	return (Datum) 0;
}
