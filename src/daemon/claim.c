/*-------------------------------------------------------------------------
 *
 * claim.c
 *	  obx-relay's claim: a batch of publishable events under a lease, in
 *	  one REPEATABLE READ transaction inside the claim lock (protocol.h's
 *	  statements, as src/relay/claim.c runs them), the claim's rows made
 *	  into the batch the producer sends; and, between claims, whether a
 *	  claim may find anything at all.
 *
 *-------------------------------------------------------------------------
 */
#include <arpa/inet.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "claim.h"
#include "daemon.h"
#include "protocol.h"
#include "settings.h"

/* A floor past every seq (src/relay/claim.c's OBX_FLOOR_NONE). */
#define FLOOR_NONE "9223372036854775807"

/* The longest an idle daemon goes without a claim (obx_anything_new). */
#define IDLE_CLAIM_US 1000000

static uint32_t
be32(const char *p)
{
	uint32_t v;

	memcpy(&v, p, 4);
	return ntohl(v);
}

static long long
be64(const char *p)
{
	return ((long long) be32(p) << 32) | be32(p + 4);
}

/* The claim's headers column: a text[n][2] in binary form, or NULL. */
static void
read_headers(Event *ev, const char *p, int len)
{
	int ndim;
	int n = 1;
	int i;
	const char *end = p + len;

	ev->nheaders = 0;
	if (len < 12)
		return;
	ndim = (int) be32(p);
	p += 12;
	for (i = 0; i < ndim; i++, p += 8)
		n *= (int) be32(p);
	ev->nheaders = n / 2;
	ev->header_names = obx_xcalloc(ev->nheaders, sizeof(char *));
	ev->header_values = obx_xcalloc(ev->nheaders, sizeof(char *));
	for (i = 0; i < n && p + 4 <= end; i++)
	{
		int elen = (int) be32(p);
		char *s;

		p += 4;
		s = obx_xcalloc(elen > 0 ? elen + 1 : 1, 1);
		if (elen > 0)
			memcpy(s, p, elen);
		p += elen > 0 ? elen : 0;
		if (i % 2 == 0)
			ev->header_names[i / 2] = s;
		else
			ev->header_values[i / 2] = s;
	}
}

/* The uuid's 16 bytes as its text, without printf: one per event. */
static void
format_uuid(char *out, const unsigned char *u)
{
	static const char hex[] = "0123456789abcdef";
	int i;

	for (i = 0; i < 16; i++)
	{
		if (i == 4 || i == 6 || i == 8 || i == 10)
			*out++ = '-';
		*out++ = hex[u[i] >> 4];
		*out++ = hex[u[i] & 0xf];
	}
	*out = '\0';
}

/*
 * The claim's rows (binary) into the batch, in seq order, until their
 * payloads pass OBX_BATCH_BYTES.  The last row, with no seq, is the new
 * tick; false (said) if there is none.
 */
static bool
take_batch(Batch *batch, PGresult *rows)
{
	int nrows = PQntuples(rows) - 1;
	long long bytes = 0;
	int n = 0;

	if (nrows < 0 || !PQgetisnull(rows, nrows, 0))
	{
		obx_say("ERROR", "the claim gave no tick row");
		return false;
	}
	batch->rows = rows;
	batch->events = obx_xcalloc(nrows, sizeof(Event));
	batch->max_seq = 0;
	batch->held = false;
	while (n < nrows && bytes < OBX_BATCH_BYTES)
	{
		Event *ev = &batch->events[n];

		ev->batch = batch;
		batch->max_seq = be64(PQgetvalue(rows, n, 0));
		if (n == 0)
			batch->min_seq = batch->max_seq;
		ev->uuid = PQgetvalue(rows, n, 1);
		format_uuid(ev->id, (const unsigned char *) ev->uuid);
		ev->topic = PQgetvalue(rows, n, 2);
		ev->key = PQgetvalue(rows, n, 3);
		if (PQgetisnull(rows, n, 4))
			ev->payload = NULL;
		else
		{
			/* jsonb in binary: a version byte, then the text. */
			ev->payload = PQgetvalue(rows, n, 4) + 1;
			ev->payload_len = PQgetlength(rows, n, 4) - 1;
		}
		ev->event_type = PQgetisnull(rows, n, 5) ? NULL : PQgetvalue(rows, n, 5);
		if (!PQgetisnull(rows, n, 7))
			read_headers(ev, PQgetvalue(rows, n, 7), PQgetlength(rows, n, 7));
		/* A bool in binary: one byte, 1 for true. */
		if (PQgetvalue(rows, n, OBX_CLAIM_HELD_COL - 1)[0] == 1)
			batch->held = true;
		bytes += ev->payload_len;
		n++;
	}
	batch->nevents = n;
	batch->full = nrows >= obx_config.batch_size || n < nrows;
	return true;
}

/* The lease's arrays of the batch's ids, topics and keys (binary). */
static void
lease_arrays(Batch *batch, Buf *ids, Buf *topics, Buf *keys)
{
	int i;

	obx_array_start(ids, UUIDOID, batch->nevents);
	obx_array_start(topics, TEXTOID, batch->nevents);
	obx_array_start(keys, TEXTOID, batch->nevents);
	for (i = 0; i < batch->nevents; i++)
	{
		obx_array_item(ids, batch->events[i].uuid, 16);
		obx_array_item(topics, batch->events[i].topic, strlen(batch->events[i].topic));
		obx_array_item(keys, batch->events[i].key, strlen(batch->events[i].key));
	}
}

/* The batch's events and the claim's rows they point into, freed: unused again. */
void
obx_batch_free(Batch *batch)
{
	int i;
	int j;

	for (i = 0; i < batch->nevents; i++)
	{
		for (j = 0; j < batch->events[i].nheaders; j++)
		{
			free(batch->events[i].header_names[j]);
			free(batch->events[i].header_values[j]);
		}
		free(batch->events[i].header_names);
		free(batch->events[i].header_values);
	}
	free(batch->events);
	PQclear(batch->rows);
	memset(batch, 0, sizeof(*batch));
}

static bool
claim_lock_session(Database *db, bool lock)
{
	PGresult *res = PQexecParams(db->conn,
								 lock ? OBX_SQL_CLAIM_LOCK_SESSION : OBX_SQL_CLAIM_UNLOCK_SESSION,
								 2, NULL, obx_claim_lock_key(), NULL, NULL, 0);
	bool ok = PQresultStatus(res) == PGRES_TUPLES_OK;

	if (!ok)
		obx_say("ERROR", "could not %s the claim lock: %s", lock ? "take" : "release",
				PQresultErrorMessage(res));
	PQclear(res);
	return ok;
}

/*
 * Whether the lease id drawn is above the latest claim's (protocol.h's
 * OBX_SQL_TICK).  If not, the claim takes nothing; said once, until a
 * claim goes through.
 */
static bool
lease_seq_ok(Database *db, const char *lease_id, const char *tick)
{
	if (atoll(lease_id) > atoll(tick))
	{
		db->lease_seq_behind = false;
		return true;
	}
	if (!db->lease_seq_behind)
		obx_say("WARNING", "claims nothing in database \"%s\": " OBX_LEASE_SEQ_BEHIND ". %s",
				PQdb(db->conn), atoll(lease_id), atoll(tick), OBX_LEASE_SEQ_BEHIND_HINT);
	db->lease_seq_behind = true;
	return false;
}

/*
 * The claim's row (protocol.h's OBX_SQL_LEASE): the new tick, as the
 * claim gave it in binary, and the lease of the events taken, if any.
 */
static bool
write_lease(Database *db, Batch *batch, const char *lease_id)
{
	int tick_row = PQntuples(batch->rows) - 1;
	bool leased = batch->nevents > 0;
	Buf ids = {0};
	Buf topics = {0};
	Buf keys = {0};
	char lease_s[16];
	char max_seq[32];
	char relay_id[16];
	const char *params[10];
	int lengths[10] = {0};
	int formats[10] = {0, 0, 0, 1, 1, 0, 1, 1, 1, 0};
	PGresult *res;
	bool ok;

	lease_arrays(batch, &ids, &topics, &keys);
	snprintf(lease_s, sizeof(lease_s), "%d", leased ? obx_config.lease_timeout_s : 0);
	snprintf(max_seq, sizeof(max_seq), "%lld", batch->max_seq);
	snprintf(relay_id, sizeof(relay_id), "%d", obx_config.relay_id);
	params[0] = lease_id;
	params[1] = relay_id;
	params[2] = lease_s;
	params[3] = PQgetvalue(batch->rows, tick_row, OBX_CLAIM_SNAP_COL - 1);
	lengths[3] = PQgetlength(batch->rows, tick_row, OBX_CLAIM_SNAP_COL - 1);
	params[4] = PQgetvalue(batch->rows, tick_row, OBX_CLAIM_FLOOR_COL - 1);
	lengths[4] = 8;
	params[5] = leased ? max_seq : NULL;
	params[6] = leased ? ids.data : NULL;
	lengths[6] = (int) ids.len;
	params[7] = leased ? topics.data : NULL;
	lengths[7] = (int) topics.len;
	params[8] = leased ? keys.data : NULL;
	lengths[8] = (int) keys.len;
	params[9] = batch->held ? "t" : "f";
	res = obx_db_run_binary(db, "obx_lease", params, lengths, formats, 0);
	ok = res != NULL;
	PQclear(res);
	free(ids.data);
	free(topics.data);
	free(keys.data);
	return ok;
}

/*
 * obx_claim
 *		Lease up to batch_size publishable events; returns how many, or -1
 *		if the database failed.
 *
 * Inside the claim lock (held by the session around the transaction, so
 * that the transaction's snapshot, taken by its first statement, sees
 * every claim before it), in one REPEATABLE READ transaction: the tick
 * and the lease id, the claim with the new tick, the claim's row.  Its
 * commit is synchronous: it flushes the WAL past every commit it saw, and
 * waits for the synchronous standbys, before anything of it is produced.
 * With no batch of the database's out (each recorded with every event
 * delivered, else obx_record forgets it), a claim from the daemon's own complete
 * tick reads only what that tick did not see (OBX_SQL_CLAIM_SINCE), as
 * the in-database relay's does.
 */
int
obx_claim(Database *db, Batch *batch)
{
	PGresult *res;
	PGresult *rows = NULL;
	char lease_id[32];
	char floor[32];
	long long next_floor;
	int tick_row;
	char *snap = NULL;
	char tick[32];
	char batch_size[16];
	bool since;
	bool complete;
	bool wrote;
	bool ok = false;

	memset(batch, 0, sizeof(*batch));
	if (!claim_lock_session(db, true))
		return -1;
	if (!obx_db_exec(db, "BEGIN ISOLATION LEVEL REPEATABLE READ; SET LOCAL synchronous_commit = on;"
						 " SET LOCAL enable_seqscan = off; SET LOCAL plan_cache_mode = force_generic_plan"))
		goto done;
	if ((res = obx_db_run(db, "obx_tick", NULL, 0)) == NULL)
		goto done;
	snprintf(floor, sizeof(floor), "%s", PQgetvalue(res, 0, 0));
	snap = obx_xstrdup(PQgetvalue(res, 0, 1));
	snprintf(tick, sizeof(tick), "%s", PQgetvalue(res, 0, 2));
	snprintf(lease_id, sizeof(lease_id), "%s", PQgetvalue(res, 0, 3));
	PQclear(res);
	if (!lease_seq_ok(db, lease_id, tick))
		goto done;
	since = db->nflights == 0 && db->complete_tick != 0 && atoll(tick) == db->complete_tick;
	snprintf(batch_size, sizeof(batch_size), "%d", obx_config.batch_size);
	{
		const char *params[6] = {obx_config.quarantine_blocks_key ? "t" : "f", batch_size, floor,
								 snap, tick, FLOOR_NONE};

		if ((rows = obx_db_run(db, since ? "obx_claim_since" : "obx_claim", params, 1)) == NULL)
			goto done;
	}
	batch->lease_id = atoll(lease_id);
	if (!take_batch(batch, rows))
		goto done;
	rows = NULL;
	tick_row = PQntuples(batch->rows) - 1;
	/* A claim that took nothing leaves a tick only when its floor moved. */
	next_floor = be64(PQgetvalue(batch->rows, tick_row, OBX_CLAIM_FLOOR_COL - 1));
	complete = !PQgetisnull(batch->rows, tick_row, OBX_CLAIM_COMPLETE_COL - 1) &&
			   PQgetvalue(batch->rows, tick_row, OBX_CLAIM_COMPLETE_COL - 1)[0] == 1;
	wrote = batch->nevents > 0 || next_floor != atoll(floor);
	if (wrote && !write_lease(db, batch, lease_id))
		goto done;
	ok = obx_db_exec(db, "COMMIT");
	if (ok && wrote)
		db->complete_tick = complete && !batch->full ? atoll(lease_id) : 0;
done:
	if (!ok && PQstatus(db->conn) == CONNECTION_OK)
		(void) obx_db_exec(db, "ROLLBACK");
	if (PQstatus(db->conn) == CONNECTION_OK)
		ok &= claim_lock_session(db, false);
	/* A batch dropped here is not sent: its lease runs out. */
	if (!ok)
		db->complete_tick = 0;
	PQclear(rows);
	free(snap);
	if (!ok)
	{
		obx_batch_free(batch);
		return -1;
	}
	return batch->nevents;
}

/*
 * Whether a claim may find something: not when the latest claim took
 * nothing, less than IDLE_CLAIM_US ago, and the current snapshot is still
 * its snapshot.  Every transaction that ends moves the snapshot (it leaves
 * the running ones, or moves xmax), so no event, record, release or
 * operator's retry was committed since, in any database; what becomes
 * claimable with no commit (a lease or a backoff running out) waits for
 * the claim every IDLE_CLAIM_US (in-database workers claim every
 * obx.poll_interval for it).  An idle daemon reads a snapshot per poll_interval
 * instead of claiming.
 */
bool
obx_anything_new(Database *db, long long now)
{
	PGresult *res;
	bool same;

	if (db->idle_snap == NULL || now - db->claimed_at >= IDLE_CLAIM_US)
		return true;
	if ((res = obx_db_run(db, "obx_snapshot", NULL, 1)) == NULL)
		return true;
	same = PQgetlength(res, 0, 0) == db->idle_snap_len &&
		   memcmp(PQgetvalue(res, 0, 0), db->idle_snap, db->idle_snap_len) == 0;
	PQclear(res);
	return !same;
}

/*
 * Keep the snapshot of a committed claim that took nothing (its tick row,
 * the last of its rows) for obx_anything_new; forget it after any other.
 */
void
obx_remember_idle(Database *db, Batch *batch, int taken)
{
	int tick_row;

	free(db->idle_snap);
	db->idle_snap = NULL;
	if (taken != 0)
		return;
	tick_row = PQntuples(batch->rows) - 1;
	db->idle_snap_len = PQgetlength(batch->rows, tick_row, OBX_CLAIM_SNAP_COL - 1);
	db->idle_snap = obx_xcalloc(1, db->idle_snap_len);
	memcpy(db->idle_snap, PQgetvalue(batch->rows, tick_row, OBX_CLAIM_SNAP_COL - 1),
		   db->idle_snap_len);
}
