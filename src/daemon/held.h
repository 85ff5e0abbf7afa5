/*-------------------------------------------------------------------------
 *
 * held.h
 *	  The partitions obx-relay's consumer holds back on one message
 *	  (held.c), per subscription.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OBX_DAEMON_HELD_H
#define OBX_DAEMON_HELD_H

#include <stdbool.h>

#include <librdkafka/rdkafka.h>

#include "subscription.h"

/* A partition held back on one message: paused until resume_at. */
typedef struct Held
{
	char *topic;
	int partition;
	long long offset;
	long long resume_at; /* 0: resumed, waiting for the message */
	int attempts;
	int handler_failures;
	struct Held *next;
} Held;

extern Held *obx_held_find(Sub *s, const char *topic, int partition);
extern void obx_held_release(Sub *s, Held *h);
extern void obx_hold(Sub *s, const rd_kafka_message_t *m, bool by_handler);
extern bool obx_held_take(Sub *s, const rd_kafka_message_t *m);
extern void obx_held_resume_due(Sub *s);
extern rd_kafka_topic_partition_list_t *obx_partition_list(const char *topic, int partition,
														   long long offset);

#endif
