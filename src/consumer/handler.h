/*-------------------------------------------------------------------------
 *
 * handler.h
 *	  Calling a subscription's handler as the subscription's owner
 *	  (handler.c): restricted, inside a GUC nest level, under a timeout;
 *	  and the consumer worker's shared-memory slot that lets a successor
 *	  recognise a message whose handler ended the worker.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OBX_HANDLER_H
#define OBX_HANDLER_H

#include "postgres.h"

#include "inbound.h"

#include "fmgr.h"

/* A handler ready to be called, again and again (obx_handler_prepare). */
typedef struct ObxHandlerCall
{
	char *consumer; /* the subscription's name (obx_handler_consumer) */
	Oid handler;
	Oid owner;
	int timeout_ms;
	MemoryContext cxt; /* holds what the calls keep */
	bool ready;        /* checked and looked up by the first call */
	char *name;        /* for the timeout's error */
	FmgrInfo flinfo;
} ObxHandlerCall;

extern void obx_handler_prepare(ObxHandlerCall *call, const char *consumer,
								Oid handler, Oid owner, int timeout_ms,
								MemoryContext cxt);
extern void obx_handler_invoke(ObxHandlerCall *call, Datum event);
extern void obx_call_handler(const char *consumer, Oid handler, Oid owner,
							 Datum event, int timeout_ms);
extern const char *obx_handler_consumer(void);
extern int obx_handler_timeout(const char *option);

/* The consumer worker's side: one slot per worker number. */
extern void obx_inbox_attach(int worker);
extern void obx_handler_enter(const ObxInbound *msg);
extern void obx_handler_leave(void);
extern bool obx_handler_timed_out(void);
extern bool obx_handler_is_victim(const ObxInbound *msg);
extern ErrorData *obx_handler_ended_a_worker(const ObxInbound *msg);

#endif /* OBX_HANDLER_H */
