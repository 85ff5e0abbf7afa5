/*-------------------------------------------------------------------------
 *
 * status.h
 *	  Relay worker status (status.c): what a worker writes into its
 *	  shared-memory slot for the obx.workers view; whether a relay serves
 *	  the current database (the warning of CREATE EXTENSION and of a
 *	  session's first obx.enqueue); and the limit on repeated log lines
 *	  that every worker uses.
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
/* obx_log_allowed lets the same line through once per this many ms. */
#define OBX_LOG_REPEAT_MS 60000
extern bool obx_log_allowed(const char *what, int64 *suppressed);

#endif /* OBX_STATUS_H */
