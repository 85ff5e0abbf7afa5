/*-------------------------------------------------------------------------
 *
 * obx.h
 *	  Declarations shared by the parts of obx: the GUC variables, the
 *	  shared-memory state of the relay workers, the in-memory batch a
 *	  worker publishes, and the entry points of each file.
 *
 * Files and what they own:
 *	  obx.c		module entry, GUCs, shared memory
 *	  worker.c	the base of both workers: registration, start-up, reload,
 *				the wait, steps and kept plans, housekeeping (worker.h)
 *	  turns.c	the claim-turn protocol: wake-up, changes, async commits,
 *				turns (turns.h)
 *	  relay.c	the relay worker's main loop
 *	  outbox.c	every SQL statement the relay runs against the outbox
 *	  kafka.c	everything librdkafka (no transaction calls in it)
 *	  enqueue.c	SQL-callable functions: enqueue and the commit wake-up
 *	  status.c	worker status in shared memory and its SQL view
 *	  consumer.c	the consumer worker's loop: messages, held partitions,
 *				offsets
 *	  consumer_group.c	its Kafka consumers, one per subscription
 *				(consumer_group.h)
 *	  inbox.c	every statement the consumer runs: one transaction per message;
 *				every handler call (obx_call_handler, obx._replay_handler)
 *	  kafka_conf.c	who may set which librdkafka property; the properties file
 *	  consumer_sql.c	subscribe, unsubscribe, mark_processed: who calls
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

/* How often worker 0 (relay, or consumer in a database without one) purges. */
#define OBX_PURGE_INTERVAL_MS 10000

/*
 * A claim stops taking events once their payloads reach this many bytes
 * (the event that crosses it included), whatever obx.batch_size says: a
 * worker holds up to two batches, payloads included, and librdkafka a
 * copy of them.
 */
#define OBX_BATCH_BYTES (16 * 1024 * 1024)

/* GUC variables (obx.c) */
extern char *obx_brokers;
extern char *obx_kafka_properties;
extern char *obx_kafka_properties_file;
extern char *obx_topics;
extern char *obx_database;
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
	/* events published in two consecutive windows, for events/s */
	TimestampTz window_start;
	int64 window_published;
	TimestampTz prev_window_start;
	int64 prev_window_published;
} ObxWorkerSlot;

/*
 * The message whose handler a consumer worker is running, so that its
 * successor knows when a handler ended the worker (see inbox.c).  Written
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

typedef struct ObxShared
{
	int nworkers;
	pg_atomic_uint32 next_wake; /* round robin of obx_wake_workers */

	/*
	 * Asynchronous commits of transactions that changed events through
	 * obx's functions: how many are between their pre-commit and commit
	 * callbacks, and the end of the latest one's commit record (see
	 * obx_async_commits_settled).
	 */
	pg_atomic_uint32 async_committing;
	pg_atomic_uint64 async_commit_end;

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
	 * When the latest claim of any relay worker started, or 0 if it took
	 * a full batch: the workers' turns under obx.claim_gap (see
	 * obx_turn_take in turns.c).
	 */
	pg_atomic_uint64 last_claim_at;
	ObxWorkerSlot workers[OBX_MAX_WORKERS];
	ObxHandlerSlot handlers[OBX_MAX_WORKERS]; /* per consumer worker */
} ObxShared;

extern ObxShared *obx_shared;

/*
 * How a publish attempt ended for one event.
 */
typedef enum ObxOutcome
{
	OBX_OUTCOME_UNSENT = 0, /* not handed to Kafka; release, no attempt */
	OBX_OUTCOME_IN_FLIGHT,  /* handed to librdkafka, no report yet */
	OBX_OUTCOME_DELIVERED,  /* acknowledged by the broker */
	OBX_OUTCOME_FAILED      /* failed; see err and error class */
} ObxOutcome;

/*
 * Error classes recorded in last_error_class and used for the decision
 * between backing off and quarantining.
 */
typedef enum ObxErrorClass
{
	OBX_ERROR_TRANSIENT, /* broker or network trouble: retry forever */
	OBX_ERROR_PERMANENT, /* this event can never be accepted as is */
	OBX_ERROR_OTHER      /* unknown: retry up to obx.max_attempts */
} ObxErrorClass;

/*
 * One claimed event.  Strings live in the worker's per-batch memory context.
 */
typedef struct ObxEvent
{
	pg_uuid_t id;
	char id_text[37];
	char *topic;
	char *key;
	char *payload;
	int payload_len;
	char *event_type; /* NULL when not set */
	int nheaders;     /* the caller's headers, as name/value pairs */
	char **header_names;
	char **header_values;
	int attempts; /* including this one */

	struct ObxBatch *batch; /* the batch it belongs to, for its reports */
	ObxOutcome outcome;
	int err; /* rd_kafka_resp_err_t when FAILED */
	ObxErrorClass error_class;
	bool refused_locally; /* FAILED by librdkafka at produce, never sent */
	int32 partition;      /* where it landed, or was refused */
	int64 offset;
	/*
	 * When librdkafka received Kafka's acknowledgement, set on its broker
	 * thread (0 until then; if still 0, when the worker served the report).
	 */
	TimestampTz acked_at;
} ObxEvent;

typedef struct ObxBatch
{
	int64 lease_id;
	int nevents;
	int in_flight;
	bool full; /* the claim stopped at obx.batch_size or OBX_BATCH_BYTES */
	ObxEvent *events;
	TimestampTz retry_at; /* set by obx_outbox_record: when the last of its
						   * failed, not quarantined events is due again,
						   * or 0 if none waits for a retry */
} ObxBatch;

/* outbox.c: each call is one short transaction of its own */
extern bool obx_outbox_claim(ObxBatch *batch, int worker, bool force);
extern int obx_outbox_record(ObxBatch *batch);
extern int obx_outbox_renew(ObxBatch *batch);
extern int64 obx_outbox_release_orphans(int worker);
extern int64 obx_outbox_purge(void);
extern void obx_outbox_analyze(void);

/* kafka.c: no transaction or SPI calls in it */
typedef struct ObxProducer ObxProducer;
extern ObxProducer *obx_kafka_create(int worker, char *errbuf, size_t errlen);
extern void obx_kafka_destroy(ObxProducer *producer, int flush_ms);
extern int obx_kafka_event_fd(ObxProducer *producer);
extern void obx_kafka_produce(ObxProducer *producer, ObxBatch *batch);
extern int obx_kafka_blame_oversize(ObxBatch *batch);
extern void obx_kafka_serve(ObxProducer *producer);
extern void obx_kafka_purge(ObxProducer *producer);
extern bool obx_kafka_broken(ObxProducer *producer);
extern bool obx_kafka_brokers_down(ObxProducer *producer);
extern ObxErrorClass obx_kafka_classify(int err);
extern bool obx_kafka_timed_out(int err);
extern const char *obx_kafka_error_name(int err);
extern const char *obx_kafka_error_text(int err);
extern const char *obx_error_class_name(ObxErrorClass cls);

/* kafka.c, shared with consumer.c */
struct rd_kafka_conf_s;
extern bool obx_kafka_set(struct rd_kafka_conf_s *conf, const char *name,
						  const char *value, char *errbuf, size_t errlen);
extern bool obx_kafka_user_properties(struct rd_kafka_conf_s *conf,
									  char *errbuf, size_t errlen);
extern bool obx_kafka_file_properties(struct rd_kafka_conf_s *conf,
									  char *errbuf, size_t errlen);
extern const char *obx_kafka_file_signature(void);
extern void obx_kafka_file_reread(void);
extern bool obx_kafka_subscription_property_allowed(const char *name);
struct rd_kafka_s;
extern struct rd_kafka_s *obx_kafka_new(int type, struct rd_kafka_conf_s *conf,
										char *errbuf, size_t errlen);

/*
 * A subscription as the consumer workers read it from obx.subscriptions.
 * Allocated in the caller's memory context.
 */
typedef struct ObxSubscription
{
	char *name; /* consumer name = Kafka consumer group */
	int ntopics;
	char **topics;
	Oid handler;
	Oid owner;
	bool handler_missing;
	char *start; /* auto.offset.reset: earliest or latest */
	int nkafka;  /* options.kafka as name/value pairs */
	char **kafka_names;
	char **kafka_values;
	int nretry; /* options.retry_sqlstates, as error codes */
	int *retry_sqlstates;
	int handler_timeout_ms; /* options.handler_timeout_ms; 0: none */
	char *signature;        /* everything above, to notice a change */
	/* Why the workers cannot serve it (obx._subscription_problem), or NULL */
	char *problem;
} ObxSubscription;

/* One Kafka message, as the consumer hands it to the inbox. */
typedef struct ObxInbound
{
	const ObxSubscription *sub;
	const char *topic;
	int32 partition;
	int64 offset;
	const char *key; /* NULL when the message has none */
	size_t key_len;
	const char *value; /* NULL for a tombstone */
	size_t value_len;
	int nheaders;
	const char **header_names;
	const char **header_values; /* NULL for a null header value */
	size_t *header_lens;
	TimestampTz timestamp; /* 0 when the message has none */
} ObxInbound;

typedef enum ObxInboxResult
{
	OBX_INBOX_PROCESSED,   /* handler ran and committed */
	OBX_INBOX_DUPLICATE,   /* already processed: handler not called */
	OBX_INBOX_DEAD_LETTER, /* malformed or handler error: quarantined */
	OBX_INBOX_RETRY        /* transient: rolled back, offset must not move */
} ObxInboxResult;

/*
 * A handler runs at most this long unless its subscription says otherwise
 * (options.handler_timeout_ms).
 */
#define OBX_HANDLER_TIMEOUT_MS 30000

/*
 * An event id longer than this (in bytes) is malformed: it could not be
 * recorded in obx.processed_events, whose index has a size limit.
 */
#define OBX_MAX_EVENT_ID_LEN 512

/* inbox.c: each call is one transaction of its own */
extern ObxSubscription *obx_inbox_subscriptions(int *count);
extern ObxInboxResult obx_inbox_handle(const ObxInbound *msg,
									   char *errbuf, size_t errlen);
extern void obx_inbox_note_retry(const ObxInbound *msg, const char *error);
extern void obx_call_handler(Oid handler, Oid owner, Datum event,
							 int timeout_ms);
extern void obx_inbox_attach(int worker);
extern void obx_inbox_watermarks(const char *consumer, int n, char **topics,
								 int32 *partitions, int64 *lows, int64 *highs);

/* status.c */
extern void obx_status_set_state(int worker, ObxWorkerState state);
extern void obx_status_batch_done(int worker, int published, int failed,
								  const char *error);
extern void obx_status_error(int worker, const char *error);
extern bool obx_log_allowed(const char *what, int64 *suppressed);

/*
 * Until the header split is finished, every file including obx.h sees the
 * worker base and the claim-turn protocol too.
 */
#include "turns.h"
#include "worker.h"

#endif /* OBX_H */
