/*-------------------------------------------------------------------------
 *
 * check.h
 *	  obx-relay --check (check.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef OBX_DAEMON_CHECK_H
#define OBX_DAEMON_CHECK_H

extern int obx_check(void);

#endif
