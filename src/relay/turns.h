/*-------------------------------------------------------------------------
 *
 * turns.h
 *	  The claim-turn protocol between committing backends and the relay
 *	  workers (turns.c): the commit wake-up, the count of changes that
 *	  lets a claim be skipped, the asynchronous-commit tracking a claim
 *	  flushes past, and the turns that space the workers' claims out.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OBX_TURNS_H
#define OBX_TURNS_H

#include "access/xlogdefs.h"
#include "datatype/timestamp.h"

/* Backends, at commit (enqueue.c) */
extern void obx_wake_workers(void);
extern void obx_async_commit_starting(void);
extern void obx_async_commit_done(XLogRecPtr commit_end);

/* Claims (outbox.c) */
extern bool obx_async_commits_settled(XLogRecPtr *commit_end);
extern void obx_note_change(void);
extern uint64 obx_changes(void);
extern void obx_claimed_changes(uint64 changes);
extern bool obx_claim_pointless(void);

/* The relay's turns (relay.c) */
extern long obx_turn_quiet_ms(void);
extern bool obx_turn_take(TimestampTz now);
extern void obx_turns_end(TimestampTz claimed_since);

#endif /* OBX_TURNS_H */
