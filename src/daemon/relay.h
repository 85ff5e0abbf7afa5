/*-------------------------------------------------------------------------
 *
 * relay.h
 *	  obx-relay's relay (relay.c): the loop of its main process.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OBX_DAEMON_RELAY_H
#define OBX_DAEMON_RELAY_H

extern int obx_relay_run(void);

#endif
