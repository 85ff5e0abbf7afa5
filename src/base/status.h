/*-------------------------------------------------------------------------
 *
 * status.h
 *	  Relay worker status (status.c): what a worker writes into its
 *	  shared-memory slot for the obx.workers view; whether a relay serves
 *	  the current database (the warning of CREATE EXTENSION and of a
 *	  session's first obx.enqueue).
 *
 *-------------------------------------------------------------------------
 */
#ifndef OBX_STATUS_H
#define OBX_STATUS_H

#include "obx.h" /* ObxWorkerState, the slots in shared memory */

extern void obx_status_set_state(int worker, ObxWorkerState state);
extern void obx_status_batch_done(int worker, int published, int failed,
								  const char *error);
extern void obx_status_error(int worker, const char *error);
extern void obx_warn_if_unserved(void);
extern void obx_warn_unserved_now(void);

#endif /* OBX_STATUS_H */
