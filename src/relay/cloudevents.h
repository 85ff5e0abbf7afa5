/*-------------------------------------------------------------------------
 *
 * cloudevents.h
 *	  CloudEvents binary-mode headers of a produced record
 *	  (cloudevents.c).  Used by kafka.c only.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OBX_CLOUDEVENTS_H
#define OBX_CLOUDEVENTS_H

#include "postgres.h"

#include <librdkafka/rdkafka.h>

#include "outbox.h"

extern void obx_cloudevents_add(rd_kafka_headers_t *hdrs, const ObxEvent *ev);

#endif /* OBX_CLOUDEVENTS_H */
