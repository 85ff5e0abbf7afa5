/*-------------------------------------------------------------------------
 *
 * kafka.h
 *	  The relay's librdkafka producer (kafka.c): no transaction or SPI
 *	  call in it.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OBX_KAFKA_H
#define OBX_KAFKA_H

#include "outbox.h"
#include "kafka_errors.h"

typedef struct ObxProducer ObxProducer;

extern ObxProducer *obx_kafka_create(int worker, char *errbuf, size_t errlen);
extern void obx_kafka_destroy(ObxProducer *producer, int flush_ms);
extern int obx_kafka_event_fd(ObxProducer *producer);
extern void obx_kafka_produce(ObxProducer *producer, ObxBatch *batch);
extern int obx_kafka_blame_oversize(ObxBatch *batch);
extern void obx_kafka_serve(ObxProducer *producer);
extern void obx_kafka_purge(ObxProducer *producer);
extern bool obx_kafka_broken(ObxProducer *producer);
extern bool obx_kafka_brokers_down(ObxProducer *producer);

#endif /* OBX_KAFKA_H */
