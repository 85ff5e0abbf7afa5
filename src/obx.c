/*-------------------------------------------------------------------------
 *
 * obx.c
 *	  Module entry: the obx.* GUCs, the shared memory that lets a committing
 *	  backend wake the relay workers, and the registration of those workers.
 *
 * The relay runs only when obx is in shared_preload_libraries.  Loaded
 * any other way (a backend calling obx.enqueue in a server without the
 * preload) the GUCs exist and enqueue works; events then wait in the outbox
 * until a server with the relay publishes them.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "fmgr.h"
#include "miscadmin.h"
#include "postmaster/bgworker.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/guc.h"

#include "obx.h"

PG_MODULE_MAGIC;

char *obx_brokers = NULL;
char *obx_kafka_properties = NULL;
char *obx_kafka_properties_file = NULL;
char *obx_topics = NULL;
char *obx_database = NULL;
int obx_workers = 2;
int obx_lease_timeout_s = 60;
int obx_batch_size = 2000;
int obx_poll_interval_ms = 1000;
int obx_claim_gap_ms = 10;
int obx_max_attempts = 10;
int obx_backoff_min_ms = 100;
int obx_backoff_max_ms = 60000;
int obx_delivery_timeout_ms = 30000;
int obx_retention_s = 7 * 24 * 3600;
int obx_processed_retention_s = 0;
int obx_dead_letter_retention_s = 14 * 24 * 3600;
int obx_max_payload_size = 900000;
bool obx_quarantine_blocks_key = true;
int obx_shutdown_timeout_ms = 5000;
int obx_consumer_workers = 1;
char *obx_consumer_database = NULL;

ObxShared *obx_shared = NULL;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

void _PG_init(void);
static void obx_shmem_request(void);
static void obx_shmem_startup(void);
static void define_gucs(void);
static void register_workers(void);

void
_PG_init(void)
{
	define_gucs();

	if (!process_shared_preload_libraries_in_progress)
		return;

	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = obx_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = obx_shmem_startup;

	register_workers();
}

static void
define_gucs(void)
{
	DefineCustomStringVariable("obx.brokers",
							   "Kafka bootstrap servers the relay produces to.",
							   "A comma-separated host:port list.",
							   &obx_brokers,
							   "localhost:9092",
							   PGC_SIGHUP, 0,
							   NULL, NULL, NULL);

	DefineCustomStringVariable("obx.kafka_properties",
							   "Extra librdkafka producer properties.",
							   "Semicolon-separated key=value pairs, e.g. "
							   "security.protocol=SASL_SSL;sasl.username=u.",
							   &obx_kafka_properties,
							   "",
							   PGC_SIGHUP,
							   GUC_SUPERUSER_ONLY | GUC_NO_SHOW_ALL,
							   NULL, NULL, NULL);

	/*
	 * Secrets go here, not in obx.kafka_properties: PostgreSQL logs the new
	 * value of a setting changed by a reload.  See src/kafka_conf.c.
	 */
	DefineCustomStringVariable("obx.kafka_properties_file",
							   "librdkafka client properties file for secrets.",
							   "name=value lines, # comments; applied after "
							   "obx.kafka_properties by every producer and consumer. "
							   "Must be readable by the server's OS user only.",
							   &obx_kafka_properties_file,
							   "",
							   PGC_SIGHUP,
							   GUC_SUPERUSER_ONLY | GUC_NO_SHOW_ALL,
							   NULL, NULL, NULL);

	DefineCustomStringVariable("obx.topics",
							   "Topics obx.enqueue accepts.",
							   "Comma-separated topic names; an entry ending in * "
							   "is a prefix; * alone allows any valid topic name.",
							   &obx_topics,
							   "*",
							   PGC_SIGHUP, 0,
							   NULL, NULL, NULL);

	/*
	 * PostgreSQL accepts postmaster-context settings only while the
	 * shared_preload_libraries are loaded; defining them later (CREATE
	 * EXTENSION or obx.enqueue in a server without the preload) is a FATAL
	 * error.  Those two settings only matter to the relay, which runs only
	 * when preloaded.
	 */
	if (process_shared_preload_libraries_in_progress)
	{
		DefineCustomStringVariable("obx.database",
								   "Database whose outbox the relay workers publish.",
								   NULL,
								   &obx_database,
								   "postgres",
								   PGC_POSTMASTER, 0,
								   NULL, NULL, NULL);

		DefineCustomIntVariable("obx.workers",
								"Number of relay background workers.",
								NULL,
								&obx_workers,
								2, 0, OBX_MAX_WORKERS,
								PGC_POSTMASTER, 0,
								NULL, NULL, NULL);

		DefineCustomStringVariable("obx.consumer_database",
								   "Database whose subscriptions the consumer workers serve.",
								   "Empty means obx.database.",
								   &obx_consumer_database,
								   "",
								   PGC_POSTMASTER, 0,
								   NULL, NULL, NULL);

		DefineCustomIntVariable("obx.consumer_workers",
								"Number of consumer background workers.",
								"Each serves every subscription; the workers of a "
								"subscription share its partitions as one Kafka "
								"consumer group.",
								&obx_consumer_workers,
								1, 0, OBX_MAX_WORKERS,
								PGC_POSTMASTER, 0,
								NULL, NULL, NULL);
	}

	DefineCustomIntVariable("obx.lease_timeout",
							"How long a claimed batch stays leased to its worker.",
							"A live worker renews its lease while it waits on Kafka; "
							"the lease of a dead or stalled worker expires and "
							"another worker re-sends the events.",
							&obx_lease_timeout_s,
							60, 1, 86400,
							PGC_SIGHUP, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("obx.batch_size",
							"Most events one worker claims at a time.",
							NULL,
							&obx_batch_size,
							2000, 1, 100000,
							PGC_SIGHUP, 0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("obx.poll_interval",
							"How often a worker looks for events it was not "
							"told about.",
							"Commits of obx.enqueue wake the workers at once; this "
							"is the fallback.",
							&obx_poll_interval_ms,
							1000, 10, 3600000,
							PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("obx.claim_gap",
							"Least time between two claims of the relay, times "
							"obx.workers: claims start at least this divided by "
							"obx.workers apart.",
							"A claim that took a full batch ends the wait. Commits "
							"that come sooner wait and are claimed together, by "
							"whichever worker is free.",
							&obx_claim_gap_ms,
							10, 0, 1000,
							PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("obx.max_attempts",
							"Attempts before an event failing with an unclassified "
							"error is quarantined.",
							"Broker and network trouble is retried without limit.",
							&obx_max_attempts,
							10, 1, 1000000,
							PGC_SIGHUP, 0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("obx.backoff_min",
							"First retry delay after a failed publish.",
							NULL,
							&obx_backoff_min_ms,
							100, 1, 3600000,
							PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("obx.backoff_max",
							"Longest retry delay after repeated failures.",
							NULL,
							&obx_backoff_max_ms,
							60000, 1, 86400000,
							PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("obx.delivery_timeout",
							"How long librdkafka may try to deliver one event "
							"before the attempt counts as failed.",
							"Sets message.timeout.ms.",
							&obx_delivery_timeout_ms,
							30000, 1000, 3600000,
							PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("obx.retention",
							"How long published events stay in the outbox.",
							"0 keeps them forever.",
							&obx_retention_s,
							7 * 24 * 3600, 0, INT_MAX,
							PGC_SIGHUP, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("obx.processed_retention",
							"How long obx.processed_events keeps dedupe history.",
							"0 keeps it forever.  Must exceed the topic retention "
							"plus the replay window you promise.",
							&obx_processed_retention_s,
							0, 0, INT_MAX,
							PGC_SIGHUP, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("obx.dead_letter_retention",
							"How long obx.dead_letters keeps a dead letter.",
							"Counted from when it failed, or was replayed; "
							"0 keeps them forever.",
							&obx_dead_letter_retention_s,
							14 * 24 * 3600, 0, INT_MAX,
							PGC_SIGHUP, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("obx.max_payload_size",
							"Largest payload obx.enqueue accepts, in bytes of "
							"JSON text (payload and headers together).",
							"The default leaves room under librdkafka's "
							"message.max.bytes (1000000) for key, headers and "
							"record overhead.",
							&obx_max_payload_size,
							900000, 1, 100000000,
							PGC_SUSET, GUC_UNIT_BYTE,
							NULL, NULL, NULL);

	DefineCustomBoolVariable("obx.quarantine_blocks_key",
							 "Whether a quarantined event holds back the later "
							 "events of its topic and key.",
							 "On keeps per-key order strict until the event is "
							 "retried or skipped.",
							 &obx_quarantine_blocks_key,
							 true,
							 PGC_SIGHUP, 0,
							 NULL, NULL, NULL);

	DefineCustomIntVariable("obx.shutdown_timeout",
							"How long a stopping worker waits for in-flight "
							"deliveries.",
							NULL,
							&obx_shutdown_timeout_ms,
							5000, 0, 600000,
							PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);

	MarkGUCPrefixReserved("obx");
}

/*
 * Register count workers of one kind: "obx relay N" or "obx consumer N",
 * restarted 1 s after they exit with status 1.
 */
static void
register_kind(const char *kind, const char *function, int count)
{
	BackgroundWorker worker;
	int i;

	for (i = 0; i < count; i++)
	{
		memset(&worker, 0, sizeof(worker));
		worker.bgw_flags = BGWORKER_SHMEM_ACCESS |
						   BGWORKER_BACKEND_DATABASE_CONNECTION;
		worker.bgw_start_time = BgWorkerStart_ConsistentState;
		worker.bgw_restart_time = 1;
		snprintf(worker.bgw_library_name, BGW_MAXLEN, "obx");
		snprintf(worker.bgw_function_name, BGW_MAXLEN, "%s", function);
		snprintf(worker.bgw_name, BGW_MAXLEN, "%s %d", kind, i);
		snprintf(worker.bgw_type, BGW_MAXLEN, "%s", kind);
		worker.bgw_main_arg = Int32GetDatum(i);
		worker.bgw_notify_pid = 0;
		RegisterBackgroundWorker(&worker);
	}
}

static void
register_workers(void)
{
	register_kind("obx relay", "obx_relay_main", obx_workers);
	register_kind("obx consumer", "obx_consumer_main", obx_consumer_workers);
}

static void
obx_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(MAXALIGN(sizeof(ObxShared)));
}

static void
obx_shmem_startup(void)
{
	bool found;
	int i;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	obx_shared = ShmemInitStruct("obx", sizeof(ObxShared), &found);
	if (!found)
	{
		memset(obx_shared, 0, sizeof(ObxShared));
		obx_shared->nworkers = obx_workers;
		for (i = 0; i < OBX_MAX_WORKERS; i++)
			SpinLockInit(&obx_shared->workers[i].mutex);
		pg_atomic_init_u32(&obx_shared->next_wake, 0);
		pg_atomic_init_u32(&obx_shared->async_committing, 0);
		pg_atomic_init_u64(&obx_shared->async_commit_end, 0);
		pg_atomic_init_u64(&obx_shared->changes, 0);
		/* Unequal, so that the first claim is not skipped. */
		pg_atomic_init_u64(&obx_shared->claimed_changes, PG_UINT64_MAX);
		pg_atomic_init_u64(&obx_shared->last_claim_at, 0);
	}
	LWLockRelease(AddinShmemInitLock);
}

/*
 * obx_wake_workers
 *		Set the latch of one running relay worker: an idle one if there is
 *		one, taken in turn.
 *
 * One is enough: a worker claims everything claimable up to a batch, and a
 * busy worker claims again as soon as it has room in its pipeline.  Waking
 * all of them for every commit made them all run a claim, all but one for
 * nothing.  Called from a commit callback, so it must not fail: it only
 * reads the slots (state without the lock: a stale read wakes a busy
 * worker, which is harmless) and sets a latch.
 */
void
obx_wake_workers(void)
{
	int n;
	int start;
	int i;
	Latch *fallback = NULL;

	if (obx_shared == NULL || obx_shared->nworkers == 0)
		return;

	obx_note_change();
	n = obx_shared->nworkers;
	start = (int) (pg_atomic_fetch_add_u32(&obx_shared->next_wake, 1) % n);
	for (i = 0; i < n; i++)
	{
		ObxWorkerSlot *slot = &obx_shared->workers[(start + i) % n];
		Latch *latch = slot->latch;

		if (latch == NULL)
			continue;
		if (slot->state == OBX_STATE_IDLE)
		{
			SetLatch(latch);
			return;
		}
		if (fallback == NULL)
			fallback = latch;
	}
	if (fallback != NULL)
		SetLatch(fallback);
}

/*
 * Asynchronous commits (synchronous_commit = off) of transactions that
 * changed events through obx's functions.
 *
 * Such a commit is visible before its WAL is flushed, and the relay must
 * not publish an event a crash could still take back (see
 * obx_outbox_claim).  The committing backend announces the commit in its
 * pre-commit callback (obx_async_commit_starting) and, in its commit
 * callback, which runs after the commit became visible, publishes where
 * its commit record ends and withdraws the announcement
 * (obx_async_commit_done).  A claim that finds no commit announced after
 * taking its snapshot knows that every such commit it sees ends at or
 * before async_commit_end: flushing up to there makes them durable.
 * Synchronous commits never show up here: they are flushed before they
 * are visible.
 */
void
obx_async_commit_starting(void)
{
	if (obx_shared != NULL)
		pg_atomic_fetch_add_u32(&obx_shared->async_committing, 1);
}

/* commit_end: where the transaction's commit record ends, or an earlier position. */
void
obx_async_commit_done(XLogRecPtr commit_end)
{
	uint64 seen;

	if (obx_shared == NULL)
		return;
	seen = pg_atomic_read_u64(&obx_shared->async_commit_end);
	while (seen < commit_end &&
		   !pg_atomic_compare_exchange_u64(&obx_shared->async_commit_end, &seen, commit_end))
		;
	pg_atomic_fetch_sub_u32(&obx_shared->async_committing, 1);
}

/*
 * obx_async_commits_settled
 *		Whether no asynchronous commit is between its two callbacks; if so,
 *		*commit_end is where the latest one's commit record ends.  Called
 *		after the caller's snapshot is taken.
 */
bool
obx_async_commits_settled(XLogRecPtr *commit_end)
{
	if (obx_shared == NULL)
		return false;
	pg_memory_barrier();
	if (pg_atomic_read_u32(&obx_shared->async_committing) != 0)
		return false;
	pg_read_barrier();
	*commit_end = pg_atomic_read_u64(&obx_shared->async_commit_end);
	return true;
}

/*
 * Skipping claims that would find nothing.
 *
 * At a steady rate a worker claims again as soon as it has room in its
 * pipeline, and the other worker has often just taken everything: about a
 * fifth of the claims at 2,000 events/s came back empty, each a
 * transaction, the claim lock and a scan.  Events become claimable only
 * through a change the workers hear of (obx_note_change: a commit of
 * obx.enqueue or an operator function, which runs after the commit is
 * visible; leases released or expired, a stopping worker's records), through
 * a worker's own record (after which that worker claims next, see relay.c)
 * or through time (a backoff or a lease running out, a prepared
 * transaction's commit, a row written directly), which each worker's poll
 * (a claim at least every obx.poll_interval) covers as before.  A claim
 * reads the count of changes before its snapshot and, if it took
 * everything it could, publishes that count before its commit releases the
 * claim lock: until the count moves again, another claim would find
 * nothing.
 */
void
obx_note_change(void)
{
	if (obx_shared != NULL)
		pg_atomic_fetch_add_u64(&obx_shared->changes, 1);
}

/* The count of changes, read before a claim's snapshot. */
uint64
obx_changes(void)
{
	pg_memory_barrier();
	return pg_atomic_read_u64(&obx_shared->changes);
}

/* A committed claim took everything claimable as of changes. */
void
obx_claimed_changes(uint64 changes)
{
	uint64 seen = pg_atomic_read_u64(&obx_shared->claimed_changes);

	while ((seen == PG_UINT64_MAX || seen < changes) &&
		   !pg_atomic_compare_exchange_u64(&obx_shared->claimed_changes, &seen, changes))
		;
}

/* Whether nothing happened since a claim took everything claimable. */
bool
obx_claim_pointless(void)
{
	pg_memory_barrier();
	return pg_atomic_read_u64(&obx_shared->changes) ==
		   pg_atomic_read_u64(&obx_shared->claimed_changes);
}
