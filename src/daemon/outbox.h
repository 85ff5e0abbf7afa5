/*-------------------------------------------------------------------------
 *
 * outbox.h
 *	  obx-relay's steps of the protocol but the claim (outbox.c): the
 *	  record of a batch, the renewal of its lease, the rotation, and the
 *	  logical replica check that holds back claims and rotation.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OBX_DAEMON_OUTBOX_H
#define OBX_DAEMON_OUTBOX_H

#include <stdbool.h>

#include "batch.h"
#include "database.h"

extern bool obx_record(Database *db, Batch *batch);
extern void obx_renew(Database *db, Batch *batch);
extern void obx_rotate(Database *db);
extern bool obx_replica_free(Database *db);

#endif
