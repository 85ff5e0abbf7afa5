/*-------------------------------------------------------------------------
 *
 * worker.c
 *	  What every obx background worker needs, written once for the relay
 *	  (relay.c) and the consumer (consumer.c), which are only their loops.
 *
 * The worker_spi skeleton: SIGHUP reloads, SIGTERM sets
 * ShutdownRequestPending, and the loop waits on its latch (and one
 * descriptor its Kafka client signals on) until the request is seen.  The
 * wait set is built once and kept, not built and freed around every wait
 * as WaitLatchOrSocket does: the workers wait very often.
 *
 * Every database step is a short transaction of its own (obx_step_begin,
 * obx_step_end), with statements prepared once and kept for the life of
 * the process (obx_prepare_kept), under settings pinned at start-up, as
 * obx.worker_role once obx is installed (take_worker_role).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "obx.h"
#include "kafka_conf.h"
#include "worker.h"
#include "protocol.h"

/* A consumer worker's exit: its slot is free for the launcher to fill. */
static void
detach_consumer(int code, Datum arg)
{
	obx_shared->consumer_pids[DatumGetInt32(arg)] = 0;
}

/*
 * Fix, for the life of the worker, every setting its own statements depend
 * on, whatever the database's or the role's defaults say.
 *
 * Set at PGC_S_OVERRIDE, above ALTER DATABASE/ROLE ... SET and the
 * configuration file, they become the reset values too: a reload leaves
 * them, and RESET returns to them.  A handler cannot change them either: it
 * runs inside a GUC nest level that is unwound afterwards (see
 * obx_call_handler).
 *
 * search_path: obx's statements name obx's objects with their schema and
 * PostgreSQL's functions with pg_catalog; with only pg_catalog and pg_temp
 * on the path, no function, operator or type of another schema can be
 * picked instead.  The rest keeps each step a short, writable
 * read-committed transaction that no timeout of the database's choosing can
 * cut short: a claim or a record step cancelled after Kafka acknowledged
 * its events means a re-send, and a read-only default would stop the relay.
 * synchronous_commit: steps commit durably unless they say otherwise (a
 * claim flushes itself, see obx_outbox_claim); a consumer stores a
 * message's offset only after its transaction commits, and a crash must not
 * lose an effect whose offset Kafka already has.  jit: every statement of
 * a step is short, and a plan costed high (the claim's, see claim.c) must
 * not be compiled on every run.  max_parallel_workers_per_gather: nor
 * start parallel workers on every run (docs/configuration.md).
 */
static void
pin_settings(void)
{
	static const char *const pinned[][2] = OBX_PINNED_SETTINGS;
	int i;

	for (i = 0; i < lengthof(pinned); i++)
		SetConfigOption(pinned[i][0], pinned[i][1], PGC_SUSET, PGC_S_OVERRIDE);
}

/*
 * What the worker's Kafka clients are built from: a change on reload means
 * rebuilding them.  The relay's producer also takes obx.delivery_timeout.
 */
static char *
kafka_settings(ObxWorker *w)
{
	if (w->kind == OBX_WORKER_RELAY)
		return psprintf("%s|%s|%s|%d", obx_brokers, obx_kafka_properties,
						obx_kafka_file_signature(), obx_delivery_timeout_ms);
	return psprintf("%s|%s|%s", obx_brokers, obx_kafka_properties,
					obx_kafka_file_signature());
}

/*
 * obx_worker_start
 *		Set up the worker process for kind, number main_arg: signals, the
 *		database connection, pinned settings, its application name, and the
 *		"started" log line.
 *
 * The launcher passes the database in bgw_extra and the worker's slot in
 * main_arg.  Worker 0 of a database's relay purges; consumer worker 0 too
 * when no relay serves its database (the dedupe history lives there; see
 * obx_housekeeping in housekeeping.c).
 */
void
obx_worker_start(ObxWorker *w, ObxWorkerKind kind, Datum main_arg)
{
	bool relay = (kind == OBX_WORKER_RELAY);

	memset(w, 0, sizeof(ObxWorker));
	w->kind = kind;
	w->number = DatumGetInt32(main_arg);
	w->local = w->number % Max(1, relay ? obx_workers : obx_consumer_workers);
	w->name = relay ? "obx relay" : "obx consumer";
	w->database = MemoryContextStrdup(TopMemoryContext, MyBgworkerEntry->bgw_extra);
	w->purges = w->local == 0;
	w->wait_fd = PGINVALID_SOCKET;
	if (!relay)
	{
		obx_shared->consumer_pids[w->number] = MyProcPid;
		on_shmem_exit(detach_consumer, Int32GetDatum(w->number));
	}

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
	BackgroundWorkerUnblockSignals();

	BackgroundWorkerInitializeConnection(w->database, NULL, 0);
	pin_settings();
	pgstat_report_appname(w->name);
	w->kafka_settings = MemoryContextStrdup(TopMemoryContext, kafka_settings(w));

	ereport(LOG,
			(errmsg("%s %d started for database \"%s\"", w->name, w->number,
					w->database)));
}

/*
 * obx_worker_reload
 *		On a pending SIGHUP, reload the configuration and the Kafka
 *		properties file.  Returns whether what the worker's Kafka clients
 *		are built from changed; the loop rebuilds them then.
 */
bool
obx_worker_reload(ObxWorker *w)
{
	char *now;
	bool changed;

	if (!ConfigReloadPending)
		return false;
	ConfigReloadPending = false;
	ProcessConfigFile(PGC_SIGHUP);
	obx_kafka_file_reread();
	now = kafka_settings(w);
	changed = strcmp(now, w->kafka_settings) != 0;
	if (changed)
	{
		pfree(w->kafka_settings);
		w->kafka_settings = MemoryContextStrdup(TopMemoryContext, now);
	}
	pfree(now);
	return changed;
}

/*
 * obx_worker_watch_fd
 *		From the next wait on, watch fd (or nothing, PGINVALID_SOCKET)
 *		besides the latch.  Call it whenever the descriptor is replaced or
 *		closed, even by one of the same number.
 */
void
obx_worker_watch_fd(ObxWorker *w, pgsocket fd)
{
	if (w->wait_set != NULL)
		FreeWaitEventSet(w->wait_set);
	w->wait_set = NULL;
	w->wait_fd = fd;
}

/*
 * obx_worker_wait
 *		Sleep until the latch is set (if heed_latch), the watched descriptor
 *		is readable, the postmaster dies (exit), or timeout_ms passes.
 *
 * Without heed_latch a SetLatch does not end the sleep and the latch stays
 * set for the next wait: the relay's quiet between two turns.
 */
void
obx_worker_wait(ObxWorker *w, long timeout_ms, bool heed_latch)
{
	WaitEvent occurred;

	if (w->wait_set == NULL)
	{
		w->wait_set = obx_create_wait_event_set(3);
		AddWaitEventToSet(w->wait_set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, NULL);
		AddWaitEventToSet(w->wait_set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, NULL, NULL);
		if (w->wait_fd != PGINVALID_SOCKET)
			AddWaitEventToSet(w->wait_set, WL_SOCKET_READABLE, w->wait_fd, NULL, NULL);
	}
	if (heed_latch)
	{
		(void) WaitEventSetWait(w->wait_set, timeout_ms, &occurred, 1, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
	else
	{
		ModifyWaitEvent(w->wait_set, 0, WL_LATCH_SET, NULL);
		(void) WaitEventSetWait(w->wait_set, timeout_ms, &occurred, 1, PG_WAIT_EXTENSION);
		ModifyWaitEvent(w->wait_set, 0, WL_LATCH_SET, MyLatch);
	}
	CHECK_FOR_INTERRUPTS();
}

/*
 * The version of obx installed in this database (extversion, palloc'd in
 * the caller's context), NULL when CREATE EXTENSION obx has not been run.
 */
static char *
extension_version(void)
{
	MemoryContext caller = obx_step_begin("obx: checking for the extension");
	char *version = NULL;
	int rc;

	rc = SPI_execute("SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'obx'",
					 true, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "obx extension check failed: %s", SPI_result_code_string(rc));
	if (SPI_processed == 1)
	{
		char *v = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);

		version = MemoryContextStrdup(caller, v);
	}
	obx_step_end(caller);
	return version;
}

/*
 * What keeps obx.worker_role from being the workers' role (palloc'd in the
 * caller's context), or NULL when it can be; its OID into *role.  It must
 * exist, must not be a superuser, and must have obx_worker's privileges
 * (be it, or a member of it).
 */
static char *
role_problem(Oid *role)
{
	MemoryContext caller = obx_step_begin("obx: looking up obx.worker_role");
	Oid granted = get_role_oid(OBX_WORKER_GRANTS_ROLE, true);
	char *problem = NULL;

	*role = get_role_oid(obx_worker_role, true);
	if (!OidIsValid(*role))
		problem = psprintf("role \"%s\" (obx.worker_role) does not exist", obx_worker_role);
	else if (superuser_arg(*role))
		problem = psprintf("role \"%s\" (obx.worker_role) is a superuser", obx_worker_role);
	else if (!OidIsValid(granted) || !has_privs_of_role(*role, granted))
		problem = psprintf("role \"%s\" (obx.worker_role) does not have the privileges of role \"%s\"",
						   obx_worker_role, OBX_WORKER_GRANTS_ROLE);
	if (problem != NULL)
		problem = MemoryContextStrdup(caller, problem);
	obx_step_end(caller);
	return problem;
}

/*
 * Take on obx.worker_role for every statement from now on, and for good:
 * the current user, not the session user (the worker connected as the
 * bootstrap superuser), in a local user-id change, which forbids SET ROLE
 * and SET SESSION AUTHORIZATION, so no statement can return to the
 * superuser.  Outside any transaction: each transaction starts as this
 * user and an aborted one returns to it.  Returns false, with the reason
 * logged once and in w->role_problem, when the role cannot be taken.
 */
static bool
take_worker_role(ObxWorker *w)
{
	Oid role;
	char *problem = role_problem(&role);

	if (problem != NULL)
	{
		if (w->role_problem == NULL || strcmp(w->role_problem, problem) != 0)
			ereport(WARNING,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s %d is waiting: %s", w->name, w->number, problem),
					 errhint("CREATE EXTENSION obx creates role \"%s\" with the workers' grants; "
							 "a role named in obx.worker_role needs GRANT %s TO it.",
							 OBX_WORKER_GRANTS_ROLE, OBX_WORKER_GRANTS_ROLE)));
		if (w->role_problem != NULL)
			pfree(w->role_problem);
		w->role_problem = MemoryContextStrdup(TopMemoryContext, problem);
		return false;
	}
	Assert(!IsTransactionState());
	SetUserIdAndSecContext(role, SECURITY_LOCAL_USERID_CHANGE);
	if (w->role_problem != NULL)
		pfree(w->role_problem);
	w->role_problem = NULL;
	w->as_role = true;
	ereport(LOG,
			(errmsg("%s %d runs its statements as role \"%s\"", w->name, w->number,
					obx_worker_role)));
	return true;
}

/*
 * obx_worker_extension_ready
 *		Whether obx's schema is installed in the worker's database at the
 *		version this library serves (OBX_SCHEMA_VERSION), and the worker
 *		runs as obx.worker_role; logs once each time it is found missing or
 *		older, and each new reason the role cannot be taken.
 */
bool
obx_worker_extension_ready(ObxWorker *w)
{
	char *version = extension_version();
	bool ready = version != NULL && strcmp(version, OBX_SCHEMA_VERSION) == 0;

	if (!ready && !w->said_waiting)
	{
		if (version == NULL)
			ereport(LOG,
					(errmsg("%s %d is waiting for CREATE EXTENSION obx in database \"%s\"",
							w->name, w->number, w->database)));
		else
			ereport(LOG,
					(errmsg("%s %d is waiting for ALTER EXTENSION obx UPDATE in database \"%s\"",
							w->name, w->number, w->database),
					 errdetail("The database has obx %s; this server's library serves %s.",
							   version, OBX_SCHEMA_VERSION)));
	}
	w->said_waiting = !ready;
	if (ready && !w->as_role)
		return take_worker_role(w);
	return ready;
}

/*
 * obx_worker_exit
 *		Log that the worker stopped and exit with status 1.
 *
 * The launcher starts a stopped worker again a second later whatever its
 * status (launcher.c); 1 marks it as not meant to stay stopped.  At server
 * shutdown nothing is restarted.
 */
void
obx_worker_exit(ObxWorker *w)
{
	ereport(LOG, (errmsg("%s %d stopped", w->name, w->number)));
	proc_exit(1);
}

/*
 * Why a worker must not act in this database: a logical replication
 * subscription writes into obx's tables there, whose events and
 * subscriptions are copies of another database's (obx._replica_problem).
 * palloc'd in the caller's context, or NULL; a short transaction of its
 * own.
 */
static char *
replica_problem(void)
{
	MemoryContext caller = obx_step_begin("obx: checking for a logical subscription");
	char *problem = NULL;
	int rc;

	rc = SPI_execute(OBX_SQL_REPLICA_PROBLEM, true, 1);
	if (rc != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "obx could not check for a logical subscription: %s",
			 SPI_result_code_string(rc));
	problem = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
	if (problem != NULL)
		problem = MemoryContextStrdup(caller, problem);
	obx_step_end(caller);
	return problem;
}

/*
 * obx_worker_check_replica
 *		Read obx._replica_problem again once OBX_REPLICA_CHECK_MS passed
 *		since the last reading (at once the first time) into
 *		w->replica_problem.  A WARNING says that the worker does nothing
 *		here (idle: "claims nothing", "consumes nothing"; detail: why the
 *		copies need nothing of it) when the reason appears or changes, a LOG
 *		line when it goes.  Returns whether the WARNING was said now.
 *		Meanwhile the relay claims nothing (relay.c) and the consumer
 *		consumes nothing (consumer.c).
 */
bool
obx_worker_check_replica(ObxWorker *w, const char *idle, const char *detail)
{
	char *problem;
	bool said = false;

	if (GetCurrentTimestamp() < w->next_replica_check)
		return false;
	problem = replica_problem();
	w->next_replica_check = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
														OBX_REPLICA_CHECK_MS);
	if (problem != NULL &&
		(w->replica_problem == NULL || strcmp(problem, w->replica_problem) != 0))
	{
		ereport(WARNING,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("%s %d %s in database \"%s\": %s", w->name, w->number, idle,
						w->database, problem),
				 errdetail_internal("%s", detail),
				 errhint("Drop the subscription, or publish only your own schemas; the worker "
						 "resumes by itself.")));
		said = true;
	}
	else if (problem == NULL && w->replica_problem != NULL)
		ereport(LOG,
				(errmsg("%s %d resumes in database \"%s\": no subscription replicates "
						"obx's tables any more",
						w->name, w->number, w->database)));
	if (w->replica_problem != NULL)
		pfree(w->replica_problem);
	w->replica_problem = problem ? MemoryContextStrdup(TopMemoryContext, problem) : NULL;
	return said;
}

/* Milliseconds (rounded up) from now until t; 0 if t has passed. */
long
obx_ms_until(TimestampTz t)
{
	return TimestampDifferenceMilliseconds(GetCurrentTimestamp(), t);
}

/*
 * obx_step_begin
 *		Start a short transaction with SPI connected and a snapshot pushed;
 *		returns the memory context the caller was in, for results that must
 *		outlive the transaction.
 */
MemoryContext
obx_step_begin(const char *activity)
{
	MemoryContext caller = CurrentMemoryContext;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "obx could not connect to SPI");
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, activity);
	return caller;
}

/*
 * obx_step_end
 *		Commit the step's transaction and go back to the caller's context.
 */
void
obx_step_end(MemoryContext caller)
{
	SPI_finish();
	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_stat(false);
	pgstat_report_activity(STATE_IDLE, NULL);
	MemoryContextSwitchTo(caller);
}

/* Prepare a statement once for the life of the worker, with these options. */
static SPIPlanPtr
prepare_kept(const char *sql, int nargs, Oid *argtypes, int cursor_options)
{
	SPIPlanPtr plan = SPI_prepare_cursor(sql, nargs, argtypes, cursor_options);

	if (plan == NULL)
		elog(ERROR, "obx could not prepare a statement: %s",
			 SPI_result_code_string(SPI_result));
	SPI_keepplan(plan);
	return plan;
}

/*
 * obx_prepare_kept
 *		Prepare a statement once for the life of the worker (inside a step).
 */
SPIPlanPtr
obx_prepare_kept(const char *sql, int nargs, Oid *argtypes)
{
	return prepare_kept(sql, nargs, argtypes, 0);
}

/*
 * obx_prepare_kept_generic
 *		The same, always with a generic plan: for a statement whose plan is
 *		the same whatever its parameters and costs about as much to plan as
 *		to run.
 */
SPIPlanPtr
obx_prepare_kept_generic(const char *sql, int nargs, Oid *argtypes)
{
	return prepare_kept(sql, nargs, argtypes, CURSOR_OPT_GENERIC_PLAN);
}

/*
 * obx_option_int
 *		A whole-number subscription option (options->>'name') as obx.subscribe
 *		accepts it, from min to max; NULL, or anything else (the row may
 *		have been written by hand), gives otherwise, so that a bad row does
 *		not stop the worker.
 */
int
obx_option_int(const char *option, int min, int max, int otherwise)
{
	char *end;
	double v;

	if (option == NULL)
		return otherwise;
	errno = 0;
	v = strtod(option, &end);
	if (errno != 0 || end == option || *end != '\0' || !(v >= min && v <= max))
		return otherwise;
	return (int) v;
}

/*
 * obx_text_or_null
 *		A kept plan's text argument: s, or SQL NULL when s is NULL (*null
 *		is its entry of SPI_execute_plan's nulls).
 */
Datum
obx_text_or_null(const char *s, char *null)
{
	*null = (s == NULL) ? 'n' : ' ';
	return s == NULL ? (Datum) 0 : CStringGetTextDatum(s);
}
