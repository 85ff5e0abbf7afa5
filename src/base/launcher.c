/*-------------------------------------------------------------------------
 *
 * launcher.c
 *	  The obx launcher: one static background worker that starts and stops
 *	  the relay and consumer workers of every database obx serves, as
 *	  dynamic background workers, and follows obx.databases and
 *	  obx.consumer_databases on reload.
 *
 * The launcher connects to no database (it reads only pg_database, a
 * shared catalog).  Each served database gets a database slot: for the
 * relay, the ObxDbTurns of that number (its claim turns, see turns.c) and
 * the relay worker slots dbslot * obx.workers .. + obx.workers - 1; for
 * the consumer, the handler slots of the same layout.  So at most
 * OBX_MAX_WORKERS / obx.workers databases get relays, and the list's first
 * ones win; the others are reported.
 *
 * A worker that stops is started again a second later (the old static
 * workers' restart time).  A listed database that does not exist or takes
 * no connections is not started at all (connecting would be FATAL and a
 * crash loop): it is reported once and looked up again every
 * obx.poll_interval.  A database leaving a list has its workers stopped
 * (SIGTERM: the relay lands its flights first); its slots are freed once
 * they are gone.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_database.h"
#include "commands/dbcommands.h"
#include "miscadmin.h"
#include "nodes/pg_list.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/varlena.h"

#include "obx.h"
#include "log_repeat.h"
#include "launcher.h"

#define OBX_RESTART_MS 1000

/* One served database of one kind of worker, as the launcher keeps it. */
typedef struct Served
{
	bool in_use;
	bool listed; /* in the list as of this pass */
	char name[NAMEDATALEN];
	Oid dboid;         /* as last found, or InvalidOid */
	bool said_missing; /* reported that it cannot be served */
	TimestampTz look_again_at;
	BackgroundWorkerHandle *handles[OBX_MAX_WORKERS];
	TimestampTz start_at[OBX_MAX_WORKERS];
} Served;

typedef struct Kind
{
	bool relay;
	const char *name;     /* "obx relay" */
	const char *function; /* its entry point */
	const char *setting;  /* the list it follows */
	int per_db;
	Served dbs[OBX_MAX_WORKERS];
} Kind;

static Kind kinds[2] = {
	{true, "obx relay", "obx_relay_main", "obx.databases"},
	{false, "obx consumer", "obx_consumer_main", "obx.consumer_databases"},
};

/* Split setting into a list of names (empty list for ""). */
static List *
split_list(const char *setting)
{
	List *names = NIL;

	if (setting != NULL)
		(void) SplitGUCList(pstrdup(setting), ',', &names);
	return names;
}

/*
 * obx_database_list
 *		The databases the relay (or the consumer) serves, in list order,
 *		before the capacity is applied: obx.databases, or obx.database; for
 *		the consumer obx.consumer_databases, else obx.consumer_database,
 *		else the relay's.  NIL when that kind has no workers.
 */
List *
obx_database_list(bool relay)
{
	if (relay ? obx_workers == 0 : obx_consumer_workers == 0)
		return NIL;
	if (!relay && obx_consumer_databases && obx_consumer_databases[0])
		return split_list(obx_consumer_databases);
	if (!relay && obx_consumer_database && obx_consumer_database[0])
		return list_make1(pstrdup(obx_consumer_database));
	if (obx_databases && obx_databases[0])
		return split_list(obx_databases);
	return list_make1(pstrdup(obx_database));
}

/*
 * obx_database_capacity
 *		How many databases get workers of this kind: the worker slots in
 *		shared memory divided among them.
 */
int
obx_database_capacity(bool relay)
{
	int per_db = relay ? obx_workers : obx_consumer_workers;

	return per_db <= 0 ? 0 : OBX_MAX_WORKERS / per_db;
}

/*
 * obx_relay_dbslot
 *		The database slot of the relay serving database dboid, or -1 when
 *		no relay serves it.  Any process may ask: it reads shared memory
 *		only.
 */
int
obx_relay_dbslot(Oid dboid)
{
	int i;

	if (obx_shared == NULL || !OidIsValid(dboid))
		return -1;
	for (i = 0; i < OBX_MAX_WORKERS; i++)
		if (obx_shared->dbs[i].dboid == dboid)
			return i;
	return -1;
}

/*
 * Give database slot dbslot to database dboid, served by nworkers relay
 * workers, or free it (dboid InvalidOid).  Its claim turns start afresh
 * (obx_turns_reset).
 */
static void
relay_db_set(int dbslot, Oid dboid, int nworkers)
{
	ObxDbTurns *db = &obx_shared->dbs[dbslot];

	db->dboid = InvalidOid;
	pg_write_barrier();
	db->nworkers = nworkers;
	obx_turns_reset(db);
	pg_write_barrier();
	db->dboid = dboid;
}

/* Write what obx.workers shows for relay slot i before a worker runs it. */
static void
relay_slot_set(int i, const char *database, const char *problem)
{
	ObxWorkerSlot *slot = &obx_shared->workers[i];

	SpinLockAcquire(&slot->mutex);
	if (database != NULL && strcmp(slot->database, database) != 0)
	{
		/* a new database: nothing of the previous one's counters */
		slock_t keep = slot->mutex;

		memset(slot, 0, sizeof(*slot));
		slot->mutex = keep;
		strlcpy(slot->database, database, sizeof(slot->database));
	}
	strlcpy(slot->problem, problem ? problem : "", sizeof(slot->problem));
	SpinLockRelease(&slot->mutex);
}

/*
 * Whether worker slot i of this kind is run by a process the launcher has
 * no handle of: one a previous run of the launcher started.  A relay
 * slot's worker counts only while the slot still names db.
 */
static bool
slot_alive(Kind *kind, Served *db, int i)
{
	if (kind->relay)
		return obx_shared->workers[i].pid != 0 &&
			   strcmp(obx_shared->workers[i].database, db->name) == 0;
	return obx_shared->consumer_pids[i] != 0;
}

/* Report a problem of a database (or its workers) at most once a minute. */
static void
report(Kind *kind, Served *db, const char *problem, const char *hint)
{
	int64 suppressed;
	char *key = psprintf("%s %s %s", kind->name, db->name, problem);
	int k;

	if (kind->relay)
		for (k = 0; k < kind->per_db; k++)
			relay_slot_set((db - kind->dbs) * kind->per_db + k, db->name, problem);
	if (obx_log_allowed(key, &suppressed))
		ereport(WARNING,
				(errmsg("%s workers cannot serve database \"%s\" (%s): %s",
						kind->name, db->name, kind->setting, problem),
				 hint ? errhint("%s", hint) : 0));
}

/*
 * Look database db up in pg_database: its oid, or InvalidOid (reported)
 * when it does not exist or takes no connections.
 */
static Oid
look_up(Kind *kind, Served *db)
{
	Oid dboid = InvalidOid;
	bool allowed = false;
	Relation rel;
	TableScanDesc scan;
	HeapTuple tuple;

	/*
	 * A plain scan, as the logical replication launcher does: with no
	 * database selected, the shared catalogs' indexes may not be usable yet.
	 */
	StartTransactionCommand();
	(void) GetTransactionSnapshot();
	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while ((tuple = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		Form_pg_database form = (Form_pg_database) GETSTRUCT(tuple);

		if (strcmp(NameStr(form->datname), db->name) != 0)
			continue;
		dboid = form->oid;
		allowed = form->datallowconn;
		break;
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	CommitTransactionCommand();
	if (OidIsValid(dboid) && allowed)
	{
		db->said_missing = false;
		return dboid;
	}
	report(kind, db, OidIsValid(dboid) ? "database does not accept connections" : "database does not exist",
		   "It is looked up again every obx.poll_interval.");
	db->said_missing = true;
	return InvalidOid;
}

/* Register the dynamic worker of global slot i for database db. */
static void
start_worker(Kind *kind, Served *db, int k)
{
	BackgroundWorker worker;
	int i = (db - kind->dbs) * kind->per_db + k;
	MemoryContext old;
	bool registered;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_ConsistentState;
	worker.bgw_restart_time = BGW_NEVER_RESTART;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "obx");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "%s", kind->function);
	snprintf(worker.bgw_name, BGW_MAXLEN, "%s %d", kind->name, i);
	snprintf(worker.bgw_type, BGW_MAXLEN, "%s", kind->name);
	worker.bgw_main_arg = Int32GetDatum(i);
	strlcpy(worker.bgw_extra, db->name, BGW_EXTRALEN);
	worker.bgw_notify_pid = MyProcPid;

	/*
	 * The slot names its database before the worker can start: a worker
	 * attaches to its slot as soon as it runs, and writing the slot after
	 * registering could wipe what it has attached (its pid and latch).
	 */
	if (kind->relay)
		relay_slot_set(i, db->name, NULL);
	/* The handle outlives the pass, whose memory is reset. */
	old = MemoryContextSwitchTo(TopMemoryContext);
	registered = RegisterDynamicBackgroundWorker(&worker, &db->handles[k]);
	MemoryContextSwitchTo(old);
	if (!registered)
	{
		db->handles[k] = NULL;
		db->start_at[k] = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), obx_poll_interval_ms);
		report(kind, db, "no free background worker slot",
			   "Raise max_worker_processes (a restart) or serve fewer databases.");
		return;
	}
}

/*
 * Whether worker k of db runs (or is starting); forgets the handle of one
 * that stopped, to start it again after OBX_RESTART_MS.
 */
static bool
worker_running(Kind *kind, Served *db, int k)
{
	pid_t pid;

	if (db->handles[k] == NULL)
		return slot_alive(kind, db, (db - kind->dbs) * kind->per_db + k);
	if (GetBackgroundWorkerPid(db->handles[k], &pid) != BGWH_STOPPED)
		return true;
	pfree(db->handles[k]);
	db->handles[k] = NULL;
	db->start_at[k] = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), OBX_RESTART_MS);
	db->look_again_at = 0; /* dropped, perhaps: look before starting */
	return false;
}

/* Keep every worker of a listed database running. */
static void
serve(Kind *kind, Served *db)
{
	TimestampTz now = GetCurrentTimestamp();
	int i = db - kind->dbs;
	int k;

	if (!OidIsValid(db->dboid) || now >= db->look_again_at)
	{
		db->dboid = look_up(kind, db);
		db->look_again_at = TimestampTzPlusMilliseconds(now, obx_poll_interval_ms);
	}
	if (kind->relay && obx_shared->dbs[i].dboid != db->dboid)
		relay_db_set(i, db->dboid, kind->per_db);
	if (!OidIsValid(db->dboid))
		return;
	for (k = 0; k < kind->per_db; k++)
	{
		if (worker_running(kind, db, k) || now < db->start_at[k])
			continue;
		start_worker(kind, db, k);
	}
}

/*
 * Stop the workers of a database no longer listed; free its slots once
 * every one is gone.
 */
static void
retire(Kind *kind, Served *db)
{
	bool gone = true;
	int k;

	for (k = 0; k < kind->per_db; k++)
	{
		if (db->handles[k] != NULL)
			TerminateBackgroundWorker(db->handles[k]);
		if (worker_running(kind, db, k))
			gone = false;
	}
	if (!gone)
		return;
	ereport(LOG,
			(errmsg("%s workers of database \"%s\" stopped: it left %s",
					kind->name, db->name, kind->setting)));
	if (kind->relay)
	{
		relay_db_set(db - kind->dbs, InvalidOid, 0);
		for (k = 0; k < kind->per_db; k++)
			relay_slot_set((db - kind->dbs) * kind->per_db + k, "", NULL);
	}
	memset(db, 0, sizeof(*db));
}

/* The entry for name: the one serving it, or a free one; NULL if none. */
static Served *
entry_for(Kind *kind, const char *name, int capacity)
{
	Served *free_db = NULL;
	int i;

	for (i = 0; i < capacity; i++)
	{
		Served *db = &kind->dbs[i];

		if (db->in_use && strcmp(db->name, name) == 0)
			return db;
		if (!db->in_use && free_db == NULL)
			free_db = db;
	}
	if (free_db != NULL)
	{
		free_db->in_use = true;
		strlcpy(free_db->name, name, sizeof(free_db->name));
		ereport(LOG,
				(errmsg("%s: serving database \"%s\" with %d workers",
						kind->name, name, kind->per_db)));
	}
	return free_db;
}

/* One pass over one kind: match its list, start, stop. */
static void
launch_kind(Kind *kind)
{
	int capacity = Min(obx_database_capacity(kind->relay), OBX_MAX_WORKERS);
	List *names = obx_database_list(kind->relay);
	ListCell *lc;
	int i;
	int position = 0;

	for (i = 0; i < OBX_MAX_WORKERS; i++)
		kind->dbs[i].listed = false;
	foreach (lc, names)
	{
		const char *name = lfirst(lc);
		Served *db = position++ < capacity ? entry_for(kind, name, capacity) : NULL;
		int64 suppressed;

		if (db != NULL)
		{
			db->listed = true;
			continue;
		}
		if (obx_log_allowed(psprintf("%s capacity %s", kind->name, name), &suppressed))
			ereport(WARNING,
					(errmsg("%s workers cannot serve database \"%s\": %s lists more databases than %d",
							kind->name, name, kind->setting, capacity),
					 errdetail("obx has %d worker slots of each kind, and each database takes %d.",
							   OBX_MAX_WORKERS, kind->per_db),
					 errhint("Lower the workers per database (a restart) or list fewer databases.")));
	}
	for (i = 0; i < OBX_MAX_WORKERS; i++)
	{
		Served *db = &kind->dbs[i];

		if (db->in_use && db->listed)
			serve(kind, db);
		else if (db->in_use)
			retire(kind, db);
	}
}

/*
 * obx_launcher_main
 *		Entry point of the launcher: a pass over both kinds every second,
 *		at a reload, and whenever one of its workers stops.
 */
void
obx_launcher_main(Datum main_arg)
{
	MemoryContext pass_cxt;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	pgstat_report_appname("obx launcher");
	kinds[0].per_db = obx_workers;
	kinds[1].per_db = obx_consumer_workers;
	pass_cxt = AllocSetContextCreate(TopMemoryContext, "obx launcher pass",
									 ALLOCSET_DEFAULT_SIZES);
	ereport(LOG, (errmsg("obx launcher started")));

	while (!ShutdownRequestPending)
	{
		MemoryContextSwitchTo(pass_cxt);
		MemoryContextReset(pass_cxt);
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}
		launch_kind(&kinds[0]);
		launch_kind(&kinds[1]);
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 OBX_RESTART_MS, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
	ereport(LOG, (errmsg("obx launcher stopped")));
	proc_exit(1);
}
