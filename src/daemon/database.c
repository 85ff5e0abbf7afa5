/*-------------------------------------------------------------------------
 *
 * database.c
 *	  The relay's session with a database: opened (obx_session_open) with
 *	  every statement of the protocol prepared (protocol.h's, by name,
 *	  with their parameters' types) and the backend's memory warmed up,
 *	  dropped when it broke, and the statements run by name.  The claim
 *	  (claim.c) and the other steps (outbox.c) run on it.
 *
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libpq-fe.h>

#include "daemon.h"
#include "database.h"
#include "protocol.h"

typedef struct Statement
{
	const char *name;
	const char *sql;
	int nparams;
	Oid types[10];
} Statement;

static const Statement statements[] = {
	{"obx_tick", OBX_SQL_TICK, 0, {0}},
	{"obx_claim", OBX_SQL_CLAIM, 6, {BOOLOID, INT4OID, INT8OID, PGSNAPSHOTOID, INT8OID, INT8OID}},
	{"obx_claim_since", OBX_SQL_CLAIM_SINCE, 6, {BOOLOID, INT4OID, INT8OID, PGSNAPSHOTOID, INT8OID, INT8OID}},
	{"obx_lease", OBX_SQL_LEASE, 10, {INT8OID, INT4OID, FLOAT8OID, PGSNAPSHOTOID, INT8OID, INT8OID, UUIDARRAYOID, TEXTARRAYOID, TEXTARRAYOID, BOOLOID}},
	{"obx_record", OBX_SQL_RECORD, 8, {UUIDARRAYOID, INT4ARRAYOID, INT8ARRAYOID, TSTZARRAYOID, INT8OID, INT8OID, INT8OID, TEXTARRAYOID}},
	{"obx_held_published", OBX_SQL_HELD_PUBLISHED, 2, {UUIDARRAYOID, TSTZARRAYOID}},
	{"obx_claim_lock", OBX_SQL_CLAIM_LOCK, 2, {INT4OID, INT4OID}},
	{"obx_live", OBX_SQL_LIVE, 1, {INT8OID}},
	{"obx_hold", OBX_SQL_HOLD, 1, {UUIDARRAYOID}},
	{"obx_failed", OBX_SQL_FAILED, 7, {UUIDARRAYOID, INT4OID, FLOAT8OID, FLOAT8OID, TEXTARRAYOID, TEXTARRAYOID, BOOLARRAYOID}},
	{"obx_renew", OBX_SQL_RENEW, 2, {INT8OID, FLOAT8OID}},
	{"obx_rotate", OBX_SQL_ROTATE, 1, {FLOAT8OID}},
	{"obx_purge_dedupe", OBX_SQL_PURGE_DEDUPE, 2, {FLOAT8OID, INT4OID}},
	{"obx_purge_dead_letters", OBX_SQL_PURGE_DEAD_LETTERS, 2, {FLOAT8OID, INT4OID}},
	{"obx_replica_problem", OBX_SQL_REPLICA_PROBLEM, 0, {0}},
	/* The daemon's own: its look for commits between claims (obx_anything_new). */
	{"obx_snapshot", "SELECT pg_catalog.pg_current_snapshot()", 0, {0}},
};

static const Statement *
statement(const char *name)
{
	size_t i;

	for (i = 0; i < sizeof(statements) / sizeof(statements[0]); i++)
		if (strcmp(statements[i].name, name) == 0)
			return &statements[i];
	obx_say("FATAL", "no statement %s", name);
	exit(1);
}

/*
 * A statement's result, or NULL (said why) when it failed.  Parameters are
 * text but where formats (when given) says 1: then binary, of lengths.
 */
PGresult *
obx_db_run_binary(Database *db, const char *name, const char *const *params, const int *lengths,
				  const int *formats, int binary)
{
	const Statement *st = statement(name);
	PGresult *res = PQexecPrepared(db->conn, st->name, st->nparams, params, lengths, formats,
								   binary);
	ExecStatusType status = PQresultStatus(res);

	if (status != PGRES_TUPLES_OK && status != PGRES_COMMAND_OK)
	{
		obx_say("ERROR", "%s failed: %s", name, PQresultErrorMessage(res));
		PQclear(res);
		return NULL;
	}
	return res;
}

PGresult *
obx_db_run(Database *db, const char *name, const char *const *params, int binary)
{
	return obx_db_run_binary(db, name, params, NULL, NULL, binary);
}

/* A plain statement (no parameters, no rows wanted); false if it failed. */
bool
obx_db_exec(Database *db, const char *sql)
{
	PGresult *res = PQexec(db->conn, sql);
	ExecStatusType status = PQresultStatus(res);
	bool ok = status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK;

	if (!ok)
		obx_say("ERROR", "%s: %s", sql, PQresultErrorMessage(res));
	PQclear(res);
	return ok;
}

/*
 * Drop the session (saying why, unless why is NULL), to connect again in
 * a second; what the claims kept of it goes with it: the idle snapshot
 * and the complete tick (claim.c).
 */
void
obx_db_disconnect(Database *db, const char *why)
{
	if (db->conn == NULL)
		return;
	if (why != NULL)
		obx_say("LOG", "disconnecting from the database (%s); connecting again in 1 s", why);
	PQfinish(db->conn);
	db->conn = NULL;
	db->retry_at = time(NULL) + 1;
	free(db->idle_snap);
	db->idle_snap = NULL;
	db->complete_tick = 0;
}

/*
 * One allocation of 8 MB in the new backend, freed at once.  A backend
 * whose every statement frees all it allocated gives the memory back to
 * the kernel after each claim (glibc's malloc trims the top of its heap
 * once more than M_TRIM_THRESHOLD, 128 kB, is free), and the next claim
 * faults it in again: in a drain, a page fault per 2 events, an eighth
 * of the backend's CPU (docs/benchmarks.md).  glibc raises its thresholds
 * when a block it mmapped is freed (mallopt(3), the dynamic mmap
 * threshold): to 8 MB for mmap and 16 MB for the trim, past what a claim
 * frees, so that the backend keeps its memory between claims.  The string
 * is built by kilobytes and not scanned (octet_length): about 12 ms, once
 * per connection.  On another allocator it changes nothing.
 */
#define BACKEND_MALLOC_WARMUP \
	"SELECT pg_catalog.octet_length(pg_catalog.repeat(pg_catalog.repeat('x', 1024), 8 * 1024))"

/* Connect and prepare the statements; false (said why) if not now. */
bool
obx_db_connect(Database *db)
{
	size_t i;

	if (db->conn != NULL)
		return true;
	if (time(NULL) < db->retry_at)
		return false;
	db->conn = obx_session_open(db->conninfo, "obx-relay", NULL);
	if (db->conn == NULL)
	{
		db->retry_at = time(NULL) + 1;
		return false;
	}
	for (i = 0; i < sizeof(statements) / sizeof(statements[0]); i++)
	{
		PGresult *res = PQprepare(db->conn, statements[i].name, statements[i].sql,
								  statements[i].nparams, statements[i].types);

		if (PQresultStatus(res) != PGRES_COMMAND_OK)
		{
			obx_say("ERROR", "could not prepare %s: %s", statements[i].name,
					PQresultErrorMessage(res));
			PQclear(res);
			obx_db_disconnect(db, "obx is not installed there, or this role lacks its grants");
			db->retry_at = time(NULL) + 5;
			return false;
		}
		PQclear(res);
	}
	(void) obx_db_exec(db, BACKEND_MALLOC_WARMUP);
	obx_say("LOG", "connected to database \"%s\" as role \"%s\"", PQdb(db->conn), PQuser(db->conn));
	db->replica_check_at = 0;
	return true;
}

/* The claim lock's key as the statements' two text parameters. */
const char *const *
obx_claim_lock_key(void)
{
	static char cls[16];
	static char obj[16];
	static const char *const key[2] = {cls, obj};

	if (cls[0] == '\0')
	{
		snprintf(cls, sizeof(cls), "%d", OBX_CLAIM_LOCK_CLASS);
		snprintf(obj, sizeof(obj), "%d", OBX_CLAIM_LOCK_OBJECT);
	}
	return key;
}
