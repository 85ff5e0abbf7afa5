/*-------------------------------------------------------------------------
 *
 * worker.h
 *	  The base both background worker kinds are built on (worker.c):
 *	  start-up, reload, the wait on the latch and one
 *	  descriptor, the extension-ready check, exit; and the
 *	  short-transaction steps and kept plans every worker statement uses.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OBX_WORKER_H
#define OBX_WORKER_H

#include "datatype/timestamp.h"
#include "compat.h"
#include "storage/latch.h"

typedef enum ObxWorkerKind
{
	OBX_WORKER_RELAY,
	OBX_WORKER_CONSUMER
} ObxWorkerKind;

/*
 * What the base keeps for one worker process.  Each loop embeds one in its
 * state struct and passes it to the functions below.
 */
typedef struct ObxWorker
{
	ObxWorkerKind kind;
	int number;           /* bgw_main_arg: its slot, 0 .. OBX_MAX_WORKERS - 1 */
	int local;            /* its number among its database's workers */
	const char *name;     /* "obx relay" or "obx consumer" */
	const char *database; /* the database it serves */
	bool purges;          /* this worker runs the purge */
	TimestampTz next_purge;
	char *kafka_settings;  /* what its Kafka clients are built from */
	bool said_waiting;     /* logged that the extension is missing */
	bool as_role;          /* runs as obx.worker_role (take_worker_role) */
	char *role_problem;    /* why it cannot, or NULL */
	char *replica_problem; /* obx._replica_problem's latest answer, or NULL */
	TimestampTz next_replica_check;
	WaitEventSet *wait_set; /* built at the first wait, kept */
	pgsocket wait_fd;       /* watched besides the latch, or none */
} ObxWorker;

/* Entry points, registered by name (launcher.c) */
extern PGDLLEXPORT void obx_relay_main(Datum main_arg);
extern PGDLLEXPORT void obx_consumer_main(Datum main_arg);

extern void obx_worker_start(ObxWorker *w, ObxWorkerKind kind, Datum main_arg);
extern bool obx_worker_reload(ObxWorker *w);
extern void obx_worker_watch_fd(ObxWorker *w, pgsocket fd);
extern void obx_worker_wait(ObxWorker *w, long timeout_ms, bool heed_latch);
extern bool obx_worker_extension_ready(ObxWorker *w);
pg_noreturn extern void obx_worker_exit(ObxWorker *w);
extern long obx_ms_until(TimestampTz t);
extern bool obx_worker_check_replica(ObxWorker *w, const char *idle, const char *detail);

/* Short-transaction steps and kept plans (relay, consumer, outbox, inbox) */
struct _SPI_plan;
extern MemoryContext obx_step_begin(const char *activity);
extern void obx_step_end(MemoryContext caller);
extern struct _SPI_plan *obx_prepare_kept(const char *sql, int nargs, Oid *argtypes);
extern struct _SPI_plan *obx_prepare_kept_generic(const char *sql, int nargs,
												  Oid *argtypes);
extern int obx_option_int(const char *option, int min, int max, int otherwise);
extern Datum obx_text_or_null(const char *s, char *null);

#endif /* OBX_WORKER_H */
