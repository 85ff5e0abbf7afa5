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

#include "inbound.h"

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

#endif /* OBX_INBOX_H */
