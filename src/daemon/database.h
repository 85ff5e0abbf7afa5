/*-------------------------------------------------------------------------
 *
 * database.h
 *	  A database the relay serves (database.c): its state, its session
 *	  with the protocol's statements prepared, and how they are run.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OBX_DAEMON_DATABASE_H
#define OBX_DAEMON_DATABASE_H

#include <stdbool.h>
#include <time.h>

#include <libpq-fe.h>

#include "batch.h"

/* Batches out at once per database, as the in-database relay (OBX_PIPELINE). */
#define PIPELINE 2

/*
 * A database the relay serves: its session, its batches out (flights),
 * when it claims and rotates next, and what its claims leave the next.
 */
typedef struct Database
{
	const char *conninfo;
	PGconn *conn;
	time_t retry_at;
	time_t rotate_at;
	Batch flights[PIPELINE];
	int nflights;
	long long claim_at;   /* the next claim, in microseconds; 0: at once */
	long long claimed_at; /* the latest claim's start, in microseconds */
	char *idle_snap;      /* its snapshot (binary) if it took nothing, or NULL */
	int idle_snap_len;
	long long replica_check_at; /* obx._replica_problem's next reading; 0: at once */
	char *replica_problem;      /* its latest answer, or NULL */
	bool lease_seq_behind;      /* said (protocol.h's OBX_LEASE_SEQ_BEHIND) */
	long long complete_tick;    /* the latest claim's lease id if complete, else 0 */
} Database;

extern bool obx_db_connect(Database *db);
extern void obx_db_disconnect(Database *db, const char *why);
extern PGresult *obx_db_run(Database *db, const char *name, const char *const *params,
							int binary);
extern PGresult *obx_db_run_binary(Database *db, const char *name, const char *const *params,
								   const int *lengths, const int *formats, int binary);
extern bool obx_db_exec(Database *db, const char *sql);
extern const char *const *obx_claim_lock_key(void);

#endif
