/*-------------------------------------------------------------------------
 *
 * inbound.h
 *	  What the consumer's files speak of: a subscription, one Kafka
 *	  message of it, and what became of the message.  And that message made
 *	  into the event a handler gets (inbound.c): the event id, type, key,
 *	  headers and payload, or why the message is malformed.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OBX_INBOUND_H
#define OBX_INBOUND_H

#include "postgres.h"

#include "datatype/timestamp.h"

/*
 * A subscription as the consumer workers read it from obx.subscriptions.
 * Allocated in the caller's memory context.
 */
typedef struct ObxSubscription
{
	char *name; /* consumer name = Kafka consumer group */
	int ntopics;
	char **topics;
	Oid handler;
	Oid owner;
	bool handler_missing;
	char *start; /* auto.offset.reset: earliest or latest */
	int nkafka;  /* options.kafka as name/value pairs */
	char **kafka_names;
	char **kafka_values;
	int nretry; /* options.retry_sqlstates, as error codes */
	int *retry_sqlstates;
	int handler_timeout_ms; /* options.handler_timeout_ms; 0: none */
	int max_attempts;       /* options.max_attempts; 0: no limit */
	char *signature;        /* everything above, to notice a change */
	/* Why the workers cannot serve it (obx._subscription_problem), or NULL */
	char *problem;
} ObxSubscription;

/* One Kafka message, as the consumer hands it to the inbox. */
typedef struct ObxInbound
{
	const ObxSubscription *sub;
	const char *topic;
	int32 partition;
	int64 offset;
	const char *key; /* NULL when the message has none */
	size_t key_len;
	const char *value; /* NULL for a tombstone */
	size_t value_len;
	int nheaders;
	const char **header_names;
	const char **header_values; /* NULL for a null header value */
	size_t *header_lens;
	TimestampTz timestamp; /* 0 when the message has none */
	int handler_failures;  /* transient handler failures of it so far */
} ObxInbound;

/* What became of one message (obx_inbox_apply, inbox.c). */
typedef enum ObxInboxResult
{
	OBX_INBOX_PROCESSED,    /* handler ran */
	OBX_INBOX_DUPLICATE,    /* already processed: handler not called */
	OBX_INBOX_DEAD_LETTER,  /* malformed or handler error: quarantined */
	OBX_INBOX_RETRY,        /* transient: rolled back, offset must not move */
	OBX_INBOX_HANDLER_RETRY /* the same, after a transient handler error */
} ObxInboxResult;

#define OBX_INBOX_RETRIED(result) \
	((result) == OBX_INBOX_RETRY || (result) == OBX_INBOX_HANDLER_RETRY)

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
