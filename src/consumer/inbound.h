/*-------------------------------------------------------------------------
 *
 * inbound.h
 *	  A Kafka message made into the event a handler gets (inbound.c): the
 *	  event id, type, key, headers and payload, or why the message is
 *	  malformed.  Used by inbox.c only.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OBX_INBOUND_H
#define OBX_INBOUND_H

#include "postgres.h"

#include "inbox.h"

/*
 * What the handler gets and what a dead letter records, built from the
 * Kafka message before anything is written.
 */
typedef struct ObxInboundEvent
{
	char *event_id; /* NULL when there is none */
	char *event_type;
	char *key;
	Datum headers;  /* jsonb */
	Datum payload;  /* jsonb, valid when is_json */
	bool is_json;   /* the value parsed as JSON */
	bool tombstone; /* no value, with an event_id header: a deletion */
	bool malformed;
	char *malformed_why;
} ObxInboundEvent;

/*
 * An event id longer than this (in bytes) is malformed: it could not be
 * recorded in obx.processed_events, whose index has a size limit.
 */
#define OBX_MAX_EVENT_ID_LEN 512

extern void obx_inbound_build(const ObxInbound *msg, ObxInboundEvent *ev);
extern Datum obx_inbound_row(const ObxInbound *msg, const ObxInboundEvent *ev);

/* Run fn(arg) in a subtransaction: NULL when it succeeded, else its error. */
extern ErrorData *obx_in_subtransaction(void (*fn)(void *), void *arg);

#endif /* OBX_INBOUND_H */
