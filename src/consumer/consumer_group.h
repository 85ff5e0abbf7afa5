/*-------------------------------------------------------------------------
 *
 * consumer_group.h
 *	  The Kafka consumers of a consumer worker, one per subscription, each
 *	  in the consumer group named after it (consumer_group.c), as the
 *	  worker's loop (consumer.c) serves them.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OBX_CONSUMER_GROUP_H
#define OBX_CONSUMER_GROUP_H

#include <librdkafka/rdkafka.h>

#include "obx.h"
#include "inbox.h"

/*
 * One subscription's Kafka consumer.  rk is NULL when it could not be
 * started, or when the subscription has a problem that keeps it from
 * being served.
 */
typedef struct ObxConsumer
{
	ObxSubscription sub; /* copied into cxt */
	MemoryContext cxt;
	rd_kafka_t *rk;
	rd_kafka_queue_t *queue;
	struct HeldPartition *held; /* see held.c, allocated in cxt */
	TimestampTz next_watermarks;
	int64 watermarks_sum; /* of the last recorded watermarks */
	/* For obx.consumer_kafka_errors (obx_consumer_note_kafka): */
	char *kafka_error;          /* met since the last note (in cxt), or NULL */
	char *start_error;          /* why it could not start (in cxt), or NULL */
	TimestampTz start_error_at; /* when that was last noted */
	bool kafka_error_shown;     /* the table may hold one for the group */
	bool fetched;               /* a message came since the last note */
	struct ObxConsumer *next;
} ObxConsumer;

extern void obx_consumers_init(int worker, int signal_fd);
extern int obx_consumers_worker(void);
extern ObxConsumer *obx_consumers(void);
extern void obx_consumers_refresh(MemoryContext scratch);
extern void obx_consumers_stop_all(void);
extern void obx_consumer_kafka_error(ObxConsumer *c, const char *what);
extern void obx_consumer_note_kafka(ObxConsumer *c);
extern void obx_consumers_record_watermarks(const char *consumer, int n,
											char **topics, int32 *partitions,
											int64 *lows, int64 *highs);

#endif /* OBX_CONSUMER_GROUP_H */
