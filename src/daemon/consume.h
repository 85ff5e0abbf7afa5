/*-------------------------------------------------------------------------
 *
 * consume.h
 *	  The subscriptions obx-relay runs (consume.c, setting
 *	  "subscriptions"): for the consumer process's loop (process.c) and
 *	  for --check (check.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef OBX_DAEMON_CONSUME_H
#define OBX_DAEMON_CONSUME_H

#include <stdbool.h>

#include <libpq-fe.h>

extern bool obx_consume_enabled(void);
extern long long obx_consume_serve(void);
extern void obx_consume_stop(void);
extern bool obx_consume_check(PGconn *conn);

#endif
