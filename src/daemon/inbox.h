/*-------------------------------------------------------------------------
 *
 * inbox.h
 *	  One message of a subscription obx-relay consumes (inbox.c): the
 *	  subscription's session, and the message applied on it.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OBX_DAEMON_INBOX_H
#define OBX_DAEMON_INBOX_H

#include <stdbool.h>

#include <librdkafka/rdkafka.h>

#include "subscription.h"

extern bool obx_inbox_connect(Sub *s);
extern bool obx_inbox_serve(Sub *s, const rd_kafka_message_t *m);

#endif
