/*-------------------------------------------------------------------------
 *
 * held.h
 *	  Partitions a consumer worker holds back after a transient failure
 *	  (held.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef OBX_HELD_H
#define OBX_HELD_H

#include <librdkafka/rdkafka.h>

#include "consumer_group.h"
#include "inbox.h"

/* A partition held back by a transient failure. */
typedef struct HeldPartition
{
	char *topic;
	int32 partition;
	int64 offset;          /* the failed message: next to handle */
	int attempts;          /* consecutive transient failures */
	int handler_failures;  /* of them, the handler's (options.max_attempts) */
	TimestampTz resume_at; /* 0 once resumed, waiting for the message */
	bool taken;            /* the message is in the batch being gathered */
	struct HeldPartition *next;
} HeldPartition;

extern rd_kafka_topic_partition_list_t *obx_one_partition(const char *topic,
														  int32 partition,
														  int64 offset);
extern HeldPartition *obx_held_find(ObxConsumer *c, const char *topic,
									int32 partition);
extern void obx_held_release(ObxConsumer *c, HeldPartition *h);
extern void obx_held_retry(ObxConsumer *c, HeldPartition *h,
						   const ObxInbound *in, const char *error,
						   bool by_handler);
extern int obx_held_handler_failures(ObxConsumer *c, const char *topic,
									 int32 partition, int64 offset);
extern void obx_held_resume_due(ObxConsumer *c, TimestampTz now);
extern bool obx_held_take(ObxConsumer *c, rd_kafka_message_t *m);
extern long obx_held_next_wakeup_ms(long timeout_ms);

#endif /* OBX_HELD_H */
