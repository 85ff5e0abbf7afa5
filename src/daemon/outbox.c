/*-------------------------------------------------------------------------
 *
 * outbox.c
 *	  obx-relay's other steps of the protocol (protocol.h's statements, as
 *	  src/relay/outbox.c runs them): the record of what Kafka said about
 *	  a batch, the renewal of a lease, the rotation, and the check that no
 *	  logical subscription writes into obx's tables.
 *
 *-------------------------------------------------------------------------
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libpq-fe.h>

#include "daemon.h"
#include "kafka_errors.h"
#include "outbox.h"
#include "protocol.h"
#include "settings.h"

/* Seconds from the Unix epoch to PostgreSQL's (2000-01-01). */
#define PG_EPOCH_OFFSET 946684800LL

static void
buf_str(Buf *b, const char *s)
{
	obx_buf_add(b, s, strlen(s));
}

/* An element of an array literal, double-quoted with " and \ escaped. */
static void
buf_quoted(Buf *b, const char *s)
{
	obx_buf_add(b, "\"", 1);
	for (; *s; s++)
	{
		if (*s == '"' || *s == '\\')
			obx_buf_add(b, "\\", 1);
		obx_buf_add(b, s, 1);
	}
	obx_buf_add(b, "\"", 1);
}

static void
buf_be64(Buf *b, uint64_t v)
{
	obx_buf_be32(b, (uint32_t) (v >> 32));
	obx_buf_be32(b, (uint32_t) v);
}

static void
array_item_be32(Buf *b, uint32_t v)
{
	obx_buf_be32(b, 4);
	obx_buf_be32(b, v);
}

static void
array_item_be64(Buf *b, uint64_t v)
{
	obx_buf_be32(b, 8);
	buf_be64(b, v);
}

/* The array literal of a field of the events picked, as text. */
static char *
uuid_literal(Event **events, int n)
{
	Buf b = {0};
	int i;

	buf_str(&b, "{");
	for (i = 0; i < n; i++)
	{
		if (i > 0)
			buf_str(&b, ",");
		buf_str(&b, events[i]->id);
	}
	buf_str(&b, "}");
	return b.data;
}

/*
 * The failed events: held in obx.event_states with their error, a backoff
 * or a quarantine, but only while the batch's lease is live (checked under
 * the claim lock, as src/relay/outbox.c does), or another relay may have them
 * already.  In the record's transaction; false if the database failed.
 */
static bool
record_failed(Database *db, Event **failed, int nfailed, const char *lease_id)
{
	const char *live_params[1] = {lease_id};
	Buf classes = {0};
	Buf messages = {0};
	Buf timed_out = {0};
	char attempts[16];
	char bmin[16];
	char bmax[16];
	char *fids;
	const char *params[7];
	PGresult *res;
	bool live;
	bool ok;
	int i;

	if ((res = obx_db_run(db, "obx_claim_lock", obx_claim_lock_key(), 0)) == NULL)
		return false;
	PQclear(res);
	if ((res = obx_db_run(db, "obx_live", live_params, 0)) == NULL)
		return false;
	live = PQntuples(res) == 1;
	PQclear(res);
	if (!live)
	{
		obx_say("LOG", "lost the lease of %d failed events before recording them", nfailed);
		return true;
	}

	buf_str(&classes, "{");
	buf_str(&messages, "{");
	buf_str(&timed_out, "{");
	for (i = 0; i < nfailed; i++)
	{
		char msg[1024];

		if (i > 0)
		{
			buf_str(&classes, ",");
			buf_str(&messages, ",");
			buf_str(&timed_out, ",");
		}
		buf_str(&classes, obx_error_class_name(obx_kafka_classify(failed[i]->err)));
		snprintf(msg, sizeof(msg), "%s: %s%s", obx_kafka_error_name(failed[i]->err),
				 obx_kafka_error_text(failed[i]->err),
				 failed[i]->refused_locally ? " (refused by librdkafka, not sent)" : "");
		buf_quoted(&messages, msg);
		buf_str(&timed_out, obx_kafka_timed_out(failed[i]->err) ? "t" : "f");
		if (i < 10)
			obx_say("WARNING", "could not publish event %s to topic %s: %s", failed[i]->id,
					failed[i]->topic, msg);
	}
	buf_str(&classes, "}");
	buf_str(&messages, "}");
	buf_str(&timed_out, "}");
	fids = uuid_literal(failed, nfailed);
	snprintf(attempts, sizeof(attempts), "%d", obx_config.max_attempts);
	snprintf(bmin, sizeof(bmin), "%d", obx_config.backoff_min_ms);
	snprintf(bmax, sizeof(bmax), "%d", obx_config.backoff_max_ms);
	params[0] = fids;
	params[1] = attempts;
	params[2] = bmin;
	params[3] = bmax;
	params[4] = classes.data;
	params[5] = messages.data;
	params[6] = timed_out.data;
	ok = (res = obx_db_run(db, "obx_hold", (const char *const[]){fids}, 0)) != NULL;
	PQclear(res);
	ok = ok && (res = obx_db_run(db, "obx_failed", params, 0)) != NULL;
	if (ok)
		PQclear(res);
	free(fids);
	free(classes.data);
	free(messages.data);
	free(timed_out.data);
	return ok;
}

/*
 * The batch's record: the delivered events, where they landed and when
 * Kafka acknowledged each (none for a release), which ends the lease; those
 * held in obx.event_states are marked published there.  In the record's
 * transaction; false if the database failed.
 */
static bool
record_delivered(Database *db, Event **done, int ndone, const char *lease_id,
				 const char *max_seq, const char *min_seq)
{
	Buf ids = {0};
	Buf parts = {0};
	Buf offsets = {0};
	Buf acked = {0};
	Buf topics = {0};
	const char *params[8];
	int lengths[8];
	int formats[8] = {1, 1, 1, 1, 0, 0, 0, 1};
	PGresult *res;
	bool ok;
	int i;

	obx_array_start(&ids, UUIDOID, ndone);
	obx_array_start(&parts, INT4OID, ndone);
	obx_array_start(&offsets, INT8OID, ndone);
	obx_array_start(&acked, TIMESTAMPTZOID, ndone);
	obx_array_start(&topics, TEXTOID, ndone);
	for (i = 0; i < ndone; i++)
	{
		obx_array_item(&ids, done[i]->uuid, 16);
		array_item_be32(&parts, (uint32_t) done[i]->partition);
		array_item_be64(&offsets, (uint64_t) done[i]->offset);
		/* timestamptz: microseconds since 2000-01-01 UTC */
		array_item_be64(&acked, (uint64_t) (done[i]->acked_us - PG_EPOCH_OFFSET * 1000000));
		obx_array_item(&topics, done[i]->topic, strlen(done[i]->topic));
	}
	params[0] = ids.data;
	params[1] = parts.data;
	params[2] = offsets.data;
	params[3] = acked.data;
	params[4] = lease_id;
	params[5] = max_seq;
	params[6] = min_seq;
	params[7] = topics.data;
	lengths[0] = (int) ids.len;
	lengths[1] = (int) parts.len;
	lengths[2] = (int) offsets.len;
	lengths[3] = (int) acked.len;
	lengths[4] = lengths[5] = lengths[6] = 0;
	lengths[7] = (int) topics.len;
	ok = (res = obx_db_run_binary(db, "obx_record", params, lengths, formats, 0)) != NULL;
	PQclear(res);
	if (ok && ndone > 0)
	{
		const char *held_params[2] = {ids.data, acked.data};
		int held_lengths[2] = {(int) ids.len, (int) acked.len};
		int held_formats[2] = {1, 1};

		ok = (res = obx_db_run_binary(db, "obx_held_published", held_params, held_lengths,
									  held_formats, 0)) != NULL;
		PQclear(res);
	}
	free(ids.data);
	free(parts.data);
	free(offsets.data);
	free(acked.data);
	free(topics.data);
	return ok;
}

/*
 * obx_record
 *		Write what Kafka said about the batch, in one short transaction
 *		(asynchronously committed: a lost record means a re-send with the
 *		same ids): failures first, since the record ends the lease they are
 *		written under.  False if the database failed.
 */
bool
obx_record(Database *db, Batch *batch)
{
	Event **done = obx_xcalloc(batch->nevents, sizeof(Event *));
	Event **failed = obx_xcalloc(batch->nevents, sizeof(Event *));
	int ndone = 0;
	int nfailed = 0;
	char lease_id[32];
	char max_seq[32];
	char min_seq[32];
	bool ok;
	int i;

	for (i = 0; i < batch->nevents; i++)
	{
		if (batch->events[i].outcome == DELIVERED)
			done[ndone++] = &batch->events[i];
		else if (batch->events[i].outcome == FAILED)
			failed[nfailed++] = &batch->events[i];
	}
	snprintf(lease_id, sizeof(lease_id), "%lld", batch->lease_id);
	snprintf(max_seq, sizeof(max_seq), "%lld", batch->max_seq);
	snprintf(min_seq, sizeof(min_seq), "%lld", batch->min_seq);
	ok = obx_db_exec(db, "BEGIN; SET LOCAL synchronous_commit = off") &&
		 (nfailed == 0 || record_failed(db, failed, nfailed, lease_id)) &&
		 record_delivered(db, done, ndone, lease_id, max_seq, min_seq) &&
		 obx_db_exec(db, "COMMIT");
	if (!ok && PQstatus(db->conn) == CONNECTION_OK)
		(void) obx_db_exec(db, "ROLLBACK");
	/* The next claim reads from the floor (obx_claim). */
	if (!ok || ndone < batch->nevents)
		db->complete_tick = 0;
	free(done);
	free(failed);
	return ok;
}

/*
 * Extend the batch's lease while its deliveries take long, if it is still
 * live: checked under the claim lock against the clock, as the in-database
 * relay does, so that a lease a claim saw run out is never live again
 * (docs/internals.md, the claim since a complete tick).  A lease lost so
 * (the daemon was stalled past lease_timeout) is said once; what is still
 * in the producer may reach the broker as copies, and is recorded.
 */
void
obx_renew(Database *db, Batch *batch)
{
	char lease_id[32];
	char secs[16];
	const char *params[2] = {lease_id, secs};
	PGresult *res;
	bool checked = false;
	bool live = false;

	snprintf(lease_id, sizeof(lease_id), "%lld", batch->lease_id);
	snprintf(secs, sizeof(secs), "%d", obx_config.lease_timeout_s);
	if (!obx_db_exec(db, "BEGIN"))
		return;
	if ((res = obx_db_run(db, "obx_claim_lock", obx_claim_lock_key(), 0)) != NULL)
	{
		PQclear(res);
		if ((res = obx_db_run(db, "obx_live", params, 0)) != NULL)
		{
			checked = true;
			live = PQntuples(res) == 1;
			PQclear(res);
		}
	}
	if (live && (res = obx_db_run(db, "obx_renew", params, 0)) != NULL)
		PQclear(res);
	if (!obx_db_exec(db, live ? "COMMIT" : "ROLLBACK") || !checked || live || batch->lost)
		return;
	batch->lost = true;
	obx_say("WARNING", "lost the lease on %d events in database \"%s\": the daemon was stalled past lease_timeout, and a claim may have taken them over",
			batch->nevents, PQdb(db->conn));
}

/*
 * Whether the daemon may claim and rotate in the connected database: not
 * while a logical subscription writes into obx's tables there
 * (obx._replica_problem, read at each new connection and then every
 * OBX_REPLICA_CHECK_MS, as the in-database relay does).  Says why once,
 * when the reason appears or changes, and when it goes.  The batches
 * already out are recorded all the same.
 */
bool
obx_replica_free(Database *db)
{
	PGresult *res;
	bool free_of_it;

	if (db->conn == NULL || obx_now_us() < db->replica_check_at)
		return db->replica_problem == NULL;
	db->replica_check_at = obx_now_us() + (long long) OBX_REPLICA_CHECK_MS * 1000;
	if ((res = obx_db_run(db, "obx_replica_problem", NULL, 0)) == NULL)
	{
		if (PQstatus(db->conn) != CONNECTION_OK)
			obx_db_disconnect(db, "the connection broke");
		return false;
	}
	free_of_it = obx_replica_note(&db->replica_problem, res, PQdb(db->conn), "claims nothing",
								  "its events are copies, published by the relay of the "
								  "database they come from",
								  "resumes");
	PQclear(res);
	return free_of_it;
}

/*
 * One purge statement (OBX_SQL_PURGE_*) with the retention given; returns
 * the number of rows it went through (deleted rows for the dedupe purge,
 * the first column, a count, for the dead letters'), and in *unreplayed
 * the second column, if any; -1 if it failed.
 */
static long
purge(Database *db, const char *name, int retention_s, long *unreplayed)
{
	char secs[16];
	char batch[16];
	const char *params[2] = {secs, batch};
	PGresult *res;
	long n;

	snprintf(secs, sizeof(secs), "%d", retention_s);
	snprintf(batch, sizeof(batch), "%d", OBX_PURGE_BATCH);
	if ((res = obx_db_run(db, name, params, 0)) == NULL)
		return -1;
	if (PQresultStatus(res) == PGRES_TUPLES_OK)
	{
		n = atol(PQgetvalue(res, 0, 0));
		*unreplayed = atol(PQgetvalue(res, 0, 1));
	}
	else
		n = atol(PQcmdTuples(res));
	PQclear(res);
	return n;
}

/*
 * The purges src/base/housekeeping.c runs in the database: one step of the
 * outbox's rotation (obx._rotate), then up to OBX_PURGE_BATCH dedupe rows
 * older than processed_retention and as many dead letters older than
 * dead_letter_retention.  Every 10 seconds, and again at the next turn
 * while a step did something.
 */
void
obx_rotate(Database *db)
{
	char secs[16];
	const char *params[1] = {secs};
	PGresult *res;
	long unreplayed = 0;
	bool again = false;

	if (db->conn == NULL || time(NULL) < db->rotate_at || !obx_replica_free(db))
		return;
	db->rotate_at = time(NULL) + 10;
	/* At every retention, 0 included: the rotation also sums the counts of published events. */
	snprintf(secs, sizeof(secs), "%d", obx_config.retention_s);
	if ((res = obx_db_run(db, "obx_rotate", params, 0)) != NULL)
	{
		again |= PQresultStatus(res) == PGRES_TUPLES_OK && !PQgetisnull(res, 0, 0);
		PQclear(res);
	}
	if (obx_config.processed_retention_s > 0)
		again |= purge(db, "obx_purge_dedupe", obx_config.processed_retention_s, &unreplayed) >=
				 OBX_PURGE_BATCH;
	if (obx_config.dead_letter_retention_s > 0)
	{
		again |= purge(db, "obx_purge_dead_letters", obx_config.dead_letter_retention_s,
					   &unreplayed) >= OBX_PURGE_BATCH;
		if (unreplayed > 0)
			obx_say("LOG", "database %s: purged %ld dead letters that were never replayed "
						   "(older than dead_letter_retention)",
					PQdb(db->conn), unreplayed);
	}
	if (again)
		db->rotate_at = 0;
}
