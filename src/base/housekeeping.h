/*-------------------------------------------------------------------------
 *
 * housekeeping.h
 *	  The purges of old rows both kinds of worker run (housekeeping.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef OBX_HOUSEKEEPING_H
#define OBX_HOUSEKEEPING_H

#include "worker.h"

/* One short transaction of its own; returns how many rows went. */
extern int64 obx_outbox_purge(void);
/* Purges on the worker that purges, when due. */
extern void obx_housekeeping(ObxWorker *w);

#endif /* OBX_HOUSEKEEPING_H */
