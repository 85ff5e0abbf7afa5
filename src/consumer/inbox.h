/*-------------------------------------------------------------------------
 *
 * inbox.h
 *	  The consumer worker's statements on messages (inbox.c): one
 *	  transaction per batch of Kafka messages, each in a
 *	  subtransaction that dedupes it and calls its handler or makes it a
 *	  dead letter, with one progress row per partition.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OBX_INBOX_H
#define OBX_INBOX_H

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
 * The error a message's handler raised while it was applied in a group
 * (obx_inbox_apply_group), for obx_inbox_apply to act on without calling
 * the handler again.
 */
typedef struct ObxInboxFailure
{
	ErrorData *error; /* NULL: none */
	bool timed_out;   /* the handler ran past its timeout */
} ObxInboxFailure;

/*
 * A batch: one transaction; its messages in groups of one subtransaction
 * each (inbox_group.c), a message a group cannot take in a subtransaction
 * of its own (inbox.c).
 */
extern bool obx_inbox_batch_begin(const ObxSubscription *sub,
								  char *errbuf, size_t errlen);
extern int obx_inbox_apply_group(const ObxInbound **msgs, int n,
								 ObxInboxFailure *failure);
extern ObxInboxResult obx_inbox_apply(const ObxInbound *msg,
									  const ObxInboxFailure *known,
									  char *errbuf, size_t errlen);
extern void obx_inbox_count(const ObxInbound *msg, ObxInboxResult result,
							const char *event_id);
extern bool obx_inbox_batch_commit(char *errbuf, size_t errlen);
extern int obx_inbox_batch_subxids(bool *overflowed);

/* A transaction of its own (progress.c). */
extern void obx_inbox_note_retry(const ObxInbound *msg, const char *error);

#endif /* OBX_INBOX_H */
