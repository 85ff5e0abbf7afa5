/*-------------------------------------------------------------------------
 *
 * obx.c
 *	  Module entry: the obx.* GUCs, the shared memory that lets a committing
 *	  backend wake the relay workers (see turns.c), and the registration of
 *	  the launcher, which starts the workers (see launcher.c).
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
#include "utils/varlena.h"

#include "obx.h"
#include "protocol.h"
#include "compat.h"
#include "drop_guard.h"
#include "latency.h"

PG_MODULE_MAGIC;

char *obx_brokers = NULL;
char *obx_kafka_properties = NULL;
char *obx_kafka_properties_file = NULL;
char *obx_topics = NULL;
char *obx_database = NULL;
char *obx_databases = NULL;
char *obx_consumer_databases = NULL;
int obx_workers = 1;
int obx_lease_timeout_s = 60;
int obx_batch_size = 2000;
int obx_poll_interval_ms = 1000;
int obx_claim_gap_ms = 20;
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
int obx_consumer_workers = 2;
char *obx_consumer_database = NULL;
char *obx_worker_role = NULL;
bool obx_warn_without_relay = true;
bool obx_drop_unpublished = false;

char *obx_traceparent = NULL;
char *obx_tracestate = NULL;
bool obx_cloudevents = false;
char *obx_cloudevents_source = NULL;

ObxShared *obx_shared = NULL;

static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

void _PG_init(void);

StaticAssertDecl(OBX_MAX_WORKERS <= OBX_FIRST_DAEMON_OWNER,
				 "in-database relay workers must be numbered below obx-relay's relay_id");
static void obx_shmem_request(void);
static void obx_shmem_startup(void);
static void define_gucs(void);
static void obx_worker_register(void);

void
_PG_init(void)
{
	define_gucs();
	obx_drop_guard_install();

	if (!process_shared_preload_libraries_in_progress)
		return;

	obx_request_shmem(obx_shmem_request);
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = obx_shmem_startup;

	obx_worker_register();
}

/*
 * obx_worker_register
 *		Register the launcher (launcher.c), which starts obx.workers relay
 *		and obx.consumer_workers consumer workers per database; called while
 *		the shared_preload_libraries are loaded.  Restarted 1 s after it
 *		exits with status 1.  Not in a binary upgrade (pg_upgrade).
 */
static void
obx_worker_register(void)
{
	BackgroundWorker worker;

	if (obx_workers == 0 && obx_consumer_workers == 0)
		return;

	/*
	 * pg_upgrade starts both servers in binary-upgrade mode while it moves
	 * the catalogs: no worker may publish, consume or purge then.
	 */
	if (IsBinaryUpgrade)
		return;
	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_ConsistentState;
	worker.bgw_restart_time = 1;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "obx");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "obx_launcher_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "obx launcher");
	snprintf(worker.bgw_type, BGW_MAXLEN, "obx launcher");
	RegisterBackgroundWorker(&worker);
}

/* What the Kafka clients are built from, and what goes on the wire. */
static void
define_kafka_gucs(void)
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
	 * value of a setting changed by a reload.  See src/base/kafka_conf.c.
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

	DefineCustomIntVariable("obx.delivery_timeout",
							"How long librdkafka may try to deliver one event "
							"before the attempt counts as failed.",
							"Sets message.timeout.ms.",
							&obx_delivery_timeout_ms,
							30000, 1000, 3600000,
							PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomBoolVariable("obx.cloudevents",
							 "Whether the relay adds CloudEvents binary-mode "
							 "headers (ce_*) to every record.",
							 NULL,
							 &obx_cloudevents,
							 false,
							 PGC_SIGHUP, 0,
							 NULL, NULL, NULL);

	DefineCustomStringVariable("obx.cloudevents_source",
							   "The CloudEvents source (ce_source) of the "
							   "events this server publishes.",
							   NULL,
							   &obx_cloudevents_source,
							   "/obx",
							   PGC_SIGHUP, 0,
							   NULL, NULL, NULL);
}

/*
 * check_database_list
 *		GUC check hook of obx.databases and obx.consumer_databases: a
 *		comma-separated list of database names.
 */
static bool
check_database_list(char **newval, void **extra, GucSource source)
{
	char *raw = pstrdup(*newval);
	List *names;

	if (!SplitGUCList(raw, ',', &names))
	{
		GUC_check_errdetail("List syntax is invalid.");
		return false;
	}
	return true;
}

/* Which databases are served, by how many workers, and how they wait and stop. */
static void
define_worker_gucs(void)
{
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
								   "Used when obx.databases is empty.",
								   &obx_database,
								   "postgres",
								   PGC_POSTMASTER, 0,
								   NULL, NULL, NULL);

		DefineCustomIntVariable("obx.workers",
								"Number of relay background workers.",
								NULL,
								&obx_workers,
								1, 0, OBX_MAX_WORKERS,
								PGC_POSTMASTER, 0,
								NULL, NULL, NULL);

		DefineCustomStringVariable("obx.consumer_database",
								   "Database whose subscriptions the consumer workers serve.",
								   "Used when obx.consumer_databases is empty; empty means the relay's databases.",
								   &obx_consumer_database,
								   "",
								   PGC_POSTMASTER, 0,
								   NULL, NULL, NULL);

		DefineCustomStringVariable("obx.worker_role",
								   "Role whose rights the relay and consumer workers' statements run with.",
								   "Not a superuser: CREATE EXTENSION obx creates obx_worker "
								   "and grants it what the workers need; another role needs "
								   "GRANT obx_worker TO it.",
								   &obx_worker_role,
								   "obx_worker",
								   PGC_POSTMASTER, 0,
								   NULL, NULL, NULL);

		DefineCustomIntVariable("obx.consumer_workers",
								"Number of consumer background workers.",
								"Each serves every subscription; the workers of a "
								"subscription share its partitions as one Kafka "
								"consumer group.",
								&obx_consumer_workers,
								2, 0, OBX_MAX_WORKERS,
								PGC_POSTMASTER, 0,
								NULL, NULL, NULL);
	}

	DefineCustomStringVariable("obx.databases",
							   "Databases whose outboxes the relay workers publish, comma-separated.",
							   "Each gets obx.workers relay workers.  Empty means obx.database.",
							   &obx_databases,
							   "",
							   PGC_SIGHUP, GUC_LIST_INPUT,
							   check_database_list, NULL, NULL);

	DefineCustomStringVariable("obx.consumer_databases",
							   "Databases whose subscriptions the consumer workers serve, comma-separated.",
							   "Each gets obx.consumer_workers consumer workers.  Empty means "
							   "obx.consumer_database, or if that is empty too the relay's databases.",
							   &obx_consumer_databases,
							   "",
							   PGC_SIGHUP, GUC_LIST_INPUT,
							   check_database_list, NULL, NULL);

	DefineCustomIntVariable("obx.poll_interval",
							"How often a worker looks for events it was not "
							"told about.",
							"Commits of obx.enqueue wake the workers at once; this "
							"is the fallback.",
							&obx_poll_interval_ms,
							1000, 10, 3600000,
							PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("obx.shutdown_timeout",
							"How long a stopping worker waits for in-flight "
							"deliveries.",
							NULL,
							&obx_shutdown_timeout_ms,
							5000, 0, 600000,
							PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);
}

/* How the relay claims, retries, quarantines and purges. */
static void
define_relay_gucs(void)
{
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

	DefineCustomIntVariable("obx.claim_gap",
							"Least time between two claims of the relay, times "
							"obx.workers: claims start at least this divided by "
							"obx.workers apart.",
							"A claim that took a full batch ends the wait. Commits "
							"that come sooner wait and are claimed together, by "
							"whichever worker is free.",
							&obx_claim_gap_ms,
							20, 0, 1000,
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

	DefineCustomBoolVariable("obx.quarantine_blocks_key",
							 "Whether a quarantined event holds back the later "
							 "events of its topic and key.",
							 "On keeps per-key order strict until the event is "
							 "retried or skipped.",
							 &obx_quarantine_blocks_key,
							 true,
							 PGC_SIGHUP, 0,
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
}

/* How a consumer worker batches messages into one transaction. */
static void
define_consumer_gucs(void)
{
	DefineCustomIntVariable("obx.consumer_batch_size",
							"Most Kafka messages a consumer worker applies in "
							"one transaction.",
							"Messages are applied in groups, each group in a "
							"subtransaction; 1 gives one transaction per message.",
							&obx_consumer_batch_size,
							500, 1, 10000,
							PGC_SIGHUP, 0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("obx.consumer_batch_time",
							"Longest a consumer worker spends gathering the "
							"ready messages of one transaction.",
							"Only messages already fetched are gathered: no "
							"transaction is open meanwhile, and the worker "
							"never waits on the network for a batch to fill.",
							&obx_consumer_batch_time_ms,
							5, 1, 10000,
							PGC_SIGHUP, GUC_UNIT_MS,
							NULL, NULL, NULL);
}

/* What obx.enqueue checks and adds to an event. */
static void
define_enqueue_gucs(void)
{
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

	DefineCustomBoolVariable("obx.warn_without_relay",
							 "Whether CREATE EXTENSION and a session's first "
							 "obx.enqueue warn when no relay publishes this "
							 "database's outbox.",
							 "Turn it off where events are enqueued on purpose "
							 "for a relay that is not running yet.",
							 &obx_warn_without_relay,
							 true,
							 PGC_USERSET, 0,
							 NULL, NULL, NULL);

	DefineCustomBoolVariable("obx.drop_unpublished",
							 "Whether DROP EXTENSION obx may delete events not "
							 "yet published and dead letters not replayed.",
							 "Off: such a drop is refused (in a backend that has "
							 "obx loaded, as every backend does with the preload).",
							 &obx_drop_unpublished,
							 false,
							 PGC_SUSET, 0,
							 NULL, NULL, NULL);

	DefineCustomStringVariable("obx.traceparent",
							   "W3C traceparent that obx.enqueue stores with the "
							   "events of this session or transaction.",
							   "Set it with SET LOCAL; a traceparent in the event's "
							   "headers wins over it.",
							   &obx_traceparent,
							   "",
							   PGC_USERSET, 0,
							   NULL, NULL, NULL);

	DefineCustomStringVariable("obx.tracestate",
							   "W3C tracestate that goes with obx.traceparent.",
							   NULL,
							   &obx_tracestate,
							   "",
							   PGC_USERSET, 0,
							   NULL, NULL, NULL);
}

static void
define_gucs(void)
{
	define_kafka_gucs();
	define_worker_gucs();
	define_relay_gucs();
	define_consumer_gucs();
	define_enqueue_gucs();
	MarkGUCPrefixReserved("obx");
}

static void
obx_shmem_request(void)
{
	RequestAddinShmemSpace(MAXALIGN(sizeof(ObxShared)));
	obx_latency_shmem_request();
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
		for (i = 0; i < OBX_MAX_WORKERS; i++)
			SpinLockInit(&obx_shared->workers[i].mutex);
		pg_atomic_init_u32(&obx_shared->async_committing, 0);
		pg_atomic_init_u64(&obx_shared->async_commit_end, 0);
		/* no database served yet (see launcher.c's relay_db_set), no claim */
		for (i = 0; i < OBX_MAX_WORKERS; i++)
		{
			ObxDbTurns *db = &obx_shared->dbs[i];

			pg_atomic_init_u32(&db->next_wake, 0);
			pg_atomic_init_u64(&db->changes, 0);
			pg_atomic_init_u64(&db->claimed_changes, 0);
			pg_atomic_init_u64(&db->last_claim_at, 0);
			obx_turns_reset(db);
		}
	}
	obx_latency_shmem_init();
	LWLockRelease(AddinShmemInitLock);
}
