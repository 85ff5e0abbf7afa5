/*-------------------------------------------------------------------------
 *
 * obx.h
 *	  What every part of obx shares: the GUC variables and the state in
 *	  shared memory (worker slots, handler slots, the claim-turn counters).
 *	  Each module declares what other modules call in a header of its own.
 *
 * Which file owns what: the file map of docs/internals.md ("The files").
 *
 *-------------------------------------------------------------------------
 */
#ifndef OBX_H
#define OBX_H

#include "postgres.h"

#include "access/xlogdefs.h"
#include "datatype/timestamp.h"
#include "port/atomics.h"
#include "storage/latch.h"
#include "storage/spin.h"
#include "utils/uuid.h"

#define OBX_MAX_WORKERS 32

/* The schema version (obx.control's default_version) this library serves. */
#define OBX_SCHEMA_VERSION "1.2"

/* The role CREATE EXTENSION grants what the workers' statements need. */
#define OBX_WORKER_GRANTS_ROLE "obx_worker"

/* How often worker 0 (relay, or consumer in a database without one) purges. */
#define OBX_PURGE_INTERVAL_MS 10000

/* GUC variables (obx.c) */
extern char *obx_brokers;
extern char *obx_kafka_properties;
extern char *obx_kafka_properties_file;
extern char *obx_topics;
extern char *obx_database;
extern char *obx_databases;
extern char *obx_consumer_databases;
extern int obx_workers;
extern int obx_lease_timeout_s;
extern int obx_batch_size;
extern int obx_poll_interval_ms;
extern int obx_claim_gap_ms;
extern int obx_max_attempts;
extern int obx_backoff_min_ms;
extern int obx_backoff_max_ms;
extern int obx_delivery_timeout_ms;
extern int obx_retention_s;
extern int obx_processed_retention_s;
extern int obx_dead_letter_retention_s;
extern int obx_max_payload_size;
extern bool obx_quarantine_blocks_key;
extern int obx_shutdown_timeout_ms;
extern int obx_consumer_workers;
extern char *obx_consumer_database;
extern char *obx_worker_role;
extern bool obx_warn_without_relay;
extern bool obx_drop_unpublished;
extern int obx_consumer_batch_size;
extern int obx_consumer_batch_time_ms;
extern char *obx_traceparent;
extern char *obx_tracestate;
extern bool obx_cloudevents;
extern char *obx_cloudevents_source;

/*
 * What a relay worker is doing, as shown by obx.workers.
 */
typedef enum ObxWorkerState
{
	OBX_STATE_STARTING = 0,
	OBX_STATE_IDLE,
	OBX_STATE_PRODUCING,
	OBX_STATE_BACKING_OFF,
	OBX_STATE_BROKER_DOWN,
	OBX_STATE_STANDBY,
	OBX_STATE_WAITING_FOR_EXTENSION,
	OBX_STATE_WAITING_FOR_ROLE,
	OBX_STATE_LOGICAL_REPLICA, /* obx._replica_problem: claims nothing */
	OBX_STATE_STOPPING
} ObxWorkerState;

/*
 * One relay worker's slot in shared memory.  The worker writes it; backends
 * read it (status) or set its latch (wake-up at commit).  Counters and times
 * are protected by the spinlock; latch and pid are written only by the owner
 * and read without the lock (a stale read merely wakes nobody).
 */
typedef struct ObxWorkerSlot
{
	slock_t mutex;
	int pid;
	Latch *latch;
	ObxWorkerState state;
	int64 batches;
	int64 published;
	int64 errors;
	TimestampTz started_at;
	TimestampTz last_success_at;
	TimestampTz last_error_at;
	char last_error[256];
	/* written by the launcher: the database served, why no worker runs */
	char database[NAMEDATALEN];
	char problem[64];
	/* events published in two consecutive windows, for events/s */
	TimestampTz window_start;
	int64 window_published;
	TimestampTz prev_window_start;
	int64 prev_window_published;
} ObxWorkerSlot;

/*
 * The message whose handler a consumer worker is running, so that its
 * successor knows when a handler ended the worker (see handler.c).  Written
 * only by the worker of that number; read by every consumer worker.
 */
typedef struct ObxHandlerMessage
{
	char consumer[201];
	char topic[250];
	int32 partition;
	int64 offset;
} ObxHandlerMessage;

typedef struct ObxHandlerSlot
{
	bool active;               /* a handler call is under way on current */
	ObxHandlerMessage current; /* the message of that call */
	bool killed;               /* the previous worker ended during a call */
	ObxHandlerMessage victim;  /* the message of that call */
} ObxHandlerSlot;

/*
 * The claim-turn state of one database that relay workers serve (turns.c).
 * The launcher gives each served database one of these and the relay slots
 * dbslot * obx.workers .. + obx.workers - 1; dboid 0 means free
 * (launcher.c: relay_db_set, obx_relay_dbslot).
 */
typedef struct ObxDbTurns
{
	Oid dboid;
	int nworkers;
	pg_atomic_uint32 next_wake; /* round robin of obx_wake_workers */

	/*
	 * What can make events claimable, counted: commits of obx's functions,
	 * leases released or expired, a stopping worker's records (a running
	 * worker claims next after its own).  claimed_changes is the count a claim
	 * read before its snapshot, published when that claim took everything
	 * it could (see obx_claim_pointless).
	 */
	pg_atomic_uint64 changes;
	pg_atomic_uint64 claimed_changes;

	/*
	 * When the latest claim of any relay worker of this database started,
	 * or 0 if it took a full batch: the workers' turns under obx.claim_gap
	 * (see obx_turn_take in turns.c).
	 */
	pg_atomic_uint64 last_claim_at;
} ObxDbTurns;

/*
 * Start db's claim turns afresh: no change counted, claimed_changes unequal
 * to changes so that the first claim is not skipped, no claim yet.  At
 * start-up and whenever the slot is given to a database (relay_db_set).
 */
static inline void
obx_turns_reset(ObxDbTurns *db)
{
	pg_atomic_write_u64(&db->changes, 0);
	pg_atomic_write_u64(&db->claimed_changes, PG_UINT64_MAX);
	pg_atomic_write_u64(&db->last_claim_at, 0);
}

typedef struct ObxShared
{
	/*
	 * Asynchronous commits of transactions that changed events through
	 * obx's functions: how many are between their pre-commit and commit
	 * callbacks, and the end of the latest one's commit record (see
	 * obx_async_commits_settled).
	 */
	pg_atomic_uint32 async_committing;
	pg_atomic_uint64 async_commit_end;

	ObxDbTurns dbs[OBX_MAX_WORKERS];          /* per served database */
	ObxWorkerSlot workers[OBX_MAX_WORKERS];   /* per relay worker */
	ObxHandlerSlot handlers[OBX_MAX_WORKERS]; /* per consumer worker */
	int consumer_pids[OBX_MAX_WORKERS];       /* per consumer worker */
} ObxShared;

extern ObxShared *obx_shared;

#endif /* OBX_H */
