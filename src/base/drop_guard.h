/*-------------------------------------------------------------------------
 *
 * drop_guard.h
 *	  The refusal of a DROP EXTENSION obx that would delete events not yet
 *	  published or dead letters not replayed (drop_guard.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef OBX_DROP_GUARD_H
#define OBX_DROP_GUARD_H

extern void obx_drop_guard_install(void);

#endif /* OBX_DROP_GUARD_H */
