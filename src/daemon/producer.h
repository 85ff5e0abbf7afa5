/*-------------------------------------------------------------------------
 *
 * producer.h
 *	  obx-relay's Kafka producer (producer.c): made from the settings,
 *	  given each claimed batch, closed.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OBX_DAEMON_PRODUCER_H
#define OBX_DAEMON_PRODUCER_H

#include <librdkafka/rdkafka.h>

#include "batch.h"

extern rd_kafka_t *obx_producer_new(void);
extern void obx_produce(rd_kafka_t *rk, Batch *batch);
extern void obx_producer_close(rd_kafka_t *rk);

#endif
