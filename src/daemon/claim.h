/*-------------------------------------------------------------------------
 *
 * claim.h
 *	  obx-relay's claim (claim.c): a batch of publishable events under a
 *	  lease, the batch freed once recorded, and whether a claim is worth
 *	  running.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OBX_DAEMON_CLAIM_H
#define OBX_DAEMON_CLAIM_H

#include <stdbool.h>

#include "batch.h"
#include "database.h"

extern int obx_claim(Database *db, Batch *batch);
extern void obx_batch_free(Batch *batch);
extern bool obx_anything_new(Database *db, long long now);
extern void obx_remember_idle(Database *db, Batch *batch, int taken);

#endif
