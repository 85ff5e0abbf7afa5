/*-------------------------------------------------------------------------
 *
 * progress.h
 *	  The consumer's progress rows in obx.consumer_partitions (progress.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef OBX_PROGRESS_H
#define OBX_PROGRESS_H

#include "postgres.h"

#include "inbound.h"

/* What one message did, kept until its subtransaction is released. */
typedef struct ObxOutcome
{
	ObxInboxResult result;
	const char *event_id;
	const char *error_class;
	const char *error;
} ObxOutcome;

extern void obx_progress_begin(const char *consumer);
extern void obx_progress_count(const ObxInbound *msg, const ObxOutcome *o);
extern void obx_progress_write(void);

/* A transaction of its own. */
extern void obx_inbox_note_retry(const ObxInbound *msg, const char *error);

#endif /* OBX_PROGRESS_H */
