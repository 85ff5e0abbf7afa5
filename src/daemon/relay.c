/*-------------------------------------------------------------------------
 *
 * relay.c
 *	  obx-relay's relay: the loop of its main process over the databases
 *	  of its settings, which runs the same claim / produce / record
 *	  protocol as the in-database relay, with the same statements
 *	  (src/protocol/protocol.h), over libpq.
 *
 * Per database, up to PIPELINE batches out at once, as the in-database
 * relay: claim (a REPEATABLE READ transaction inside the claim lock,
 * committed synchronously, which flushes the WAL past every commit it saw:
 * the events it took are durable before any is produced), produce with
 * librdkafka (idempotent, acks=all), and while the delivery reports come
 * in, with no transaction open, claim the next batch when it is due
 * (renewing a lease in a statement of its own when a wait is long); a batch
 * whose reports are all in is recorded (one short transaction).  A daemon
 * that dies leaves its leases to expire after lease_timeout; their events
 * are then claimed again and re-sent with the same ids.
 *
 *-------------------------------------------------------------------------
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>

#include "claim.h"
#include "daemon.h"
#include "database.h"
#include "outbox.h"
#include "process.h"
#include "producer.h"
#include "relay.h"
#include "settings.h"

/*
 * Record the database's batches whose every report is in, and renew the
 * leases of those still waiting.  A batch is recorded even when its
 * connection broke meanwhile (on a new one: its lease is still the
 * daemon's); when that fails too, its lease runs out and it is sent again.
 */
static void
land(Database *db)
{
	int i;

	for (i = 0; i < PIPELINE; i++)
	{
		Batch *batch = &db->flights[i];

		if (!batch->used)
			continue;
		if (batch->in_flight > 0)
		{
			if (obx_now_us() >= batch->renew_at && db->conn != NULL)
			{
				obx_renew(db, batch);
				batch->renew_at = obx_now_us() + (long long) obx_config.lease_timeout_s * 1000000 / 3;
			}
			continue;
		}
		/* Not connected (obx_db_disconnect forgot the complete claim): its lease runs out. */
		if (obx_db_connect(db) && !obx_record(db, batch) && PQstatus(db->conn) != CONNECTION_OK)
			obx_db_disconnect(db, "the connection broke; the batch's lease runs out and it is sent again");
		obx_batch_free(batch);
		db->nflights--;
	}
}

/*
 * Claim and produce the database's next batch when one is due and the
 * pipeline has room: at once after a full claim, claim_gap after the start
 * of one that took events (as the in-database relay's obx.claim_gap), and
 * poll_interval after one that took nothing or found nothing new (the time
 * a claim takes counts).  A batch is claimed while the leases of the
 * batches already out are live, so it holds no event of their keys:
 * per-key order does not depend on which batch is acknowledged first.
 */
static void
launch(Database *db, rd_kafka_t *rk)
{
	Batch *batch = NULL;
	long long started = obx_now_us();
	int taken;
	int i;

	if (db->nflights >= PIPELINE || started < db->claim_at)
		return;
	db->claim_at = started + (long long) obx_config.poll_interval_ms * 1000;
	if (!obx_db_connect(db) || !obx_replica_free(db) || !obx_anything_new(db, started))
		return;
	db->claimed_at = started;
	for (i = 0; i < PIPELINE && batch == NULL; i++)
		if (!db->flights[i].used)
			batch = &db->flights[i];
	taken = obx_claim(db, batch);
	obx_remember_idle(db, batch, taken);
	if (taken <= 0)
	{
		if (PQstatus(db->conn) != CONNECTION_OK)
			obx_db_disconnect(db, "the connection broke");
		obx_batch_free(batch);
		return;
	}
	batch->used = true;
	db->nflights++;
	db->claim_at = batch->full ? 0 : started + (long long) obx_config.claim_gap_ms * 1000;
	obx_produce(rk, batch);
	batch->renew_at = obx_now_us() + (long long) obx_config.lease_timeout_s * 1000000 / 3;
}

/* Microseconds until the first database's next claim is due, at most max. */
static long long
until_next_claim(Database *dbs, long long max)
{
	long long now = obx_now_us();
	long long wait = max;
	int i;

	for (i = 0; i < obx_config.ndatabases; i++)
	{
		if (dbs[i].nflights >= PIPELINE)
			continue;
		if (dbs[i].claim_at - now < wait)
			wait = dbs[i].claim_at > now ? dbs[i].claim_at - now : 0;
	}
	return wait;
}

/* The batches out, in every database. */
static int
in_flight(Database *dbs)
{
	int n = 0;
	int i;

	for (i = 0; i < obx_config.ndatabases; i++)
		n += dbs[i].nflights;
	return n;
}

/*
 * Serve every database until SIGTERM or SIGHUP, then land the batches
 * still out (their reports come within delivery_timeout) and stop, or
 * read the settings again and go on.  The subscriptions run in a process
 * of their own (process.c), started and watched from here.
 */
int
obx_relay_run(void)
{
	Database dbs[MAX_DATABASES];
	rd_kafka_t *rk;
	int i;

	for (;;)
	{
		memset(dbs, 0, sizeof(dbs));
		for (i = 0; i < obx_config.ndatabases; i++)
			dbs[i].conninfo = obx_config.databases[i];
		rk = obx_producer_new();
		if (rk == NULL)
			return 1;
		obx_say("LOG", "started: %d database(s), brokers %s", obx_config.ndatabases, obx_config.brokers);
		while ((!obx_stop_requested && !obx_reload_requested) || in_flight(dbs) > 0)
		{
			bool winding_down = obx_stop_requested || obx_reload_requested;
			long long wait;

			for (i = 0; i < obx_config.ndatabases; i++)
			{
				land(&dbs[i]);
				if (!winding_down)
					launch(&dbs[i], rk);
				obx_rotate(&dbs[i]);
			}
			obx_consumer_process_watch();
			/* Sleep in librdkafka until a report comes or a claim is due. */
			wait = winding_down ? 100000 : until_next_claim(dbs, 100000);
			rd_kafka_poll(rk, (int) ((wait + 999) / 1000));
		}
		obx_producer_close(rk);
		for (i = 0; i < obx_config.ndatabases; i++)
		{
			obx_db_disconnect(&dbs[i], NULL);
			free(dbs[i].replica_problem);
		}
		if (obx_stop_requested)
		{
			bool clean = obx_consumer_process_stop();

			obx_say("LOG", "stopped");
			return clean ? 0 : 1;
		}
		obx_reload_requested = 0;
		obx_config_reload();
	}
}
