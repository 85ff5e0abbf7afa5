/*-------------------------------------------------------------------------
 *
 * process.h
 *	  obx-relay's two processes (process.c): the stop and reload its
 *	  signals ask for, and the consumer process, its loop and its
 *	  supervision from the relay's process.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OBX_DAEMON_PROCESS_H
#define OBX_DAEMON_PROCESS_H

#include <signal.h>
#include <stdbool.h>

/* Set by SIGTERM or SIGINT, and by SIGHUP; each loop clears the latter. */
extern volatile sig_atomic_t obx_stop_requested;
extern volatile sig_atomic_t obx_reload_requested;

extern void obx_signals_install(void);
extern int obx_consumer_process_run(void);
extern void obx_consumer_process_watch(void);
extern bool obx_consumer_process_stop(void);

#endif
