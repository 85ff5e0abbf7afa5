/*-------------------------------------------------------------------------
 *
 * launcher.h
 *	  The launcher (launcher.c): which databases the relay and the consumer
 *	  serve, and the worker that starts and stops their workers.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OBX_LAUNCHER_H
#define OBX_LAUNCHER_H

#include "nodes/pg_list.h"
#include "utils/guc.h"

extern PGDLLEXPORT void obx_launcher_main(Datum main_arg);

extern List *obx_database_list(bool relay);
extern int obx_database_capacity(bool relay);
extern int obx_relay_dbslot(Oid dboid);

#endif /* OBX_LAUNCHER_H */
