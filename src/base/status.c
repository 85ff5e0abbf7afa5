/*-------------------------------------------------------------------------
 *
 * status.c
 *	  Relay worker status: the workers write their state and counters into
 *	  their shared-memory slot, and obx.worker_status() (the obx.workers
 *	  view) reads them; and whether a relay serves this database.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_authid.h"
#include "commands/dbcommands.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "obx.h"
#include "compat.h"
#include "launcher.h"
#include "status.h"

PG_FUNCTION_INFO_V1(obx_worker_status);
PG_FUNCTION_INFO_V1(obx_relay_problem);
PG_FUNCTION_INFO_V1(obx_warn_unserved);

/* events/s is measured over the last one to two windows of this length */
#define OBX_RATE_WINDOW_MS 10000

/*
 * What obx.workers shows for a slot.  A worker's exit leaves its slot
 * without a pid (detach_slot in relay.c): "stopped", until the postmaster
 * starts it again; a slot never attached since the server started is "not
 * started".  OBX_STATE_STOPPING with a pid is a live worker shutting down.
 */
static const char *
state_name(const ObxWorkerSlot *slot)
{
	if (slot->pid == 0 && slot->problem[0] != '\0')
		return slot->problem;
	if (slot->pid == 0)
		return slot->started_at == 0 ? "not started" : "stopped";
	switch (slot->state)
	{
		case OBX_STATE_STARTING:
			return "starting";
		case OBX_STATE_IDLE:
			return "idle";
		case OBX_STATE_PRODUCING:
			return "producing";
		case OBX_STATE_BACKING_OFF:
			return "backing off";
		case OBX_STATE_BROKER_DOWN:
			return "broker down";
		case OBX_STATE_STANDBY:
			return "standby";
		case OBX_STATE_WAITING_FOR_EXTENSION:
			return "waiting for extension";
		case OBX_STATE_WAITING_FOR_ROLE:
			return "waiting for role";
		case OBX_STATE_LOGICAL_REPLICA:
			return "logical replica";
		case OBX_STATE_STOPPING:
			return "stopping";
	}
	return "unknown";
}

void
obx_status_set_state(int worker, ObxWorkerState state)
{
	ObxWorkerSlot *slot = &obx_shared->workers[worker];

	SpinLockAcquire(&slot->mutex);
	slot->state = state;
	SpinLockRelease(&slot->mutex);
}

/*
 * obx_status_error
 *		Record an error that is not about a batch (the producer could not be
 *		built, obx.worker_role cannot be taken).
 */
void
obx_status_error(int worker, const char *error)
{
	ObxWorkerSlot *slot = &obx_shared->workers[worker];

	SpinLockAcquire(&slot->mutex);
	slot->last_error_at = GetCurrentTimestamp();
	strlcpy(slot->last_error, error, sizeof(slot->last_error));
	SpinLockRelease(&slot->mutex);
}

/*
 * obx_status_batch_done
 *		Count a finished batch; error (may be NULL) describes the last
 *		failure in it.
 */
void
obx_status_batch_done(int worker, int published, int failed, const char *error)
{
	ObxWorkerSlot *slot = &obx_shared->workers[worker];
	TimestampTz now = GetCurrentTimestamp();

	SpinLockAcquire(&slot->mutex);
	if (slot->window_start == 0)
		slot->window_start = now;
	if (TimestampDifferenceExceeds(slot->window_start, now, OBX_RATE_WINDOW_MS))
	{
		slot->prev_window_start = slot->window_start;
		slot->prev_window_published = slot->window_published;
		slot->window_start = now;
		slot->window_published = 0;
	}
	slot->window_published += published;
	slot->batches++;
	slot->published += published;
	slot->errors += failed;
	if (published > 0)
		slot->last_success_at = now;
	if (error != NULL)
	{
		slot->last_error_at = now;
		strlcpy(slot->last_error, error, sizeof(slot->last_error));
	}
	SpinLockRelease(&slot->mutex);
}

/*
 * Published events per second over the current and the previous window;
 * it falls toward zero while the worker publishes nothing.
 */
static double
events_per_second(const ObxWorkerSlot *slot, TimestampTz now)
{
	TimestampTz since = slot->prev_window_start ? slot->prev_window_start : slot->started_at;
	double seconds;

	if (since == 0 || now <= since)
		return 0.0;
	seconds = (now - since) / 1000000.0;
	return (slot->prev_window_published + slot->window_published) / seconds;
}

/*
 * obx.worker_status(): one row per relay worker slot the launcher gave a
 * database.  Error texts
 * can name brokers, topics and configuration: only superusers and members
 * of pg_monitor see them; everyone else gets NULL in last_error.
 */
Datum
obx_worker_status(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	bool see_errors = has_privs_of_role(GetUserId(), ROLE_PG_MONITOR);
	int i;

	obx_init_materialized_srf(fcinfo, false);
	if (obx_shared == NULL)
		return (Datum) 0;

	for (i = 0; i < OBX_MAX_WORKERS; i++)
	{
		ObxWorkerSlot *slot = &obx_shared->workers[i];
		ObxWorkerSlot copy;
		Datum values[12];
		bool nulls[12] = {0};

		SpinLockAcquire(&slot->mutex);
		memcpy(&copy, slot, sizeof(copy));
		SpinLockRelease(&slot->mutex);
		/* a slot the launcher gave no database is not in use */
		if (copy.database[0] == '\0')
			continue;

		values[0] = Int32GetDatum(i);
		values[1] = CStringGetTextDatum(copy.database);
		values[2] = Int32GetDatum(copy.pid);
		nulls[2] = (copy.pid == 0);
		values[3] = CStringGetTextDatum(state_name(&copy));
		values[4] = Int64GetDatum(copy.batches);
		values[5] = Int64GetDatum(copy.published);
		values[6] = Int64GetDatum(copy.errors);
		values[7] = TimestampTzGetDatum(copy.started_at);
		nulls[7] = (copy.started_at == 0);
		values[8] = TimestampTzGetDatum(copy.last_success_at);
		nulls[8] = (copy.last_success_at == 0);
		values[9] = TimestampTzGetDatum(copy.last_error_at);
		nulls[9] = (copy.last_error_at == 0);
		values[10] = CStringGetTextDatum(copy.last_error);
		nulls[10] = (copy.last_error[0] == '\0' || !see_errors);
		values[11] = Float8GetDatum(events_per_second(&copy, GetCurrentTimestamp()));
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

/*
 * Where database here stands in the relay's (or the consumer's) list,
 * from 0; -1 when it is not listed.  Only the first
 * obx_database_capacity() of the list are served.
 */
static int
list_position(bool relay, const char *here)
{
	int position = 0;
	ListCell *lc;

	foreach (lc, obx_database_list(relay))
	{
		if (strcmp((char *) lfirst(lc), here) == 0)
			return position;
		position++;
	}
	return -1;
}

/*
 * Whether database here is among the first obx_database_capacity()
 * databases of the relay's list; the reason if not.
 */
static const char *
list_problem(const char *here, char **detail, char **hint)
{
	int capacity = obx_database_capacity(true);
	int position = list_position(true, here);

	if (position >= 0)
	{
		if (position < capacity)
			return NULL;
		*detail = psprintf("Database \"%s\" is number %d in the relay's list, but only "
						   "%d databases get relay workers (%d worker slots, obx.workers = %d).",
						   here, position + 1, capacity, OBX_MAX_WORKERS, obx_workers);
		*hint = pstrdup("Lower obx.workers (a restart) or list fewer databases.");
		return "too many databases for the worker slots";
	}
	if (obx_databases && obx_databases[0])
	{
		*detail = psprintf("The relay workers publish the outboxes of obx.databases = '%s'.",
						   obx_databases);
		*hint = psprintf("Add '%s' to obx.databases and reload the configuration.", here);
		return "not in obx.databases";
	}
	*detail = psprintf("The relay workers publish the outbox of database \"%s\" (obx.database).",
					   obx_database);
	*hint = psprintf("Set obx.databases to '%s, %s' and reload the configuration, or use the "
					 "outbox of database \"%s\".",
					 obx_database, here, obx_database);
	return psprintf("obx.database is '%s'", obx_database);
}

/*
 * Whether a relay serves the current database.  A relay runs only when obx
 * was loaded by shared_preload_libraries (obx_shared is then set up by the
 * postmaster; a library loaded by CREATE EXTENSION or a call has none),
 * with obx.workers above 0, and it publishes the outboxes of the databases
 * in its list (obx.databases, or obx.database) that fit its worker slots.  Returns NULL when a relay serves this database; otherwise sets
 * *detail and *hint and returns a short reason, as obx.status shows it.
 */
static const char *
relay_problem(char **detail, char **hint)
{
	char *here = get_database_name(MyDatabaseId);

	if (obx_shared == NULL)
	{
		*detail = pstrdup("obx is not in shared_preload_libraries, so no relay worker runs on this server.");
		*hint = pstrdup("Add obx to shared_preload_libraries and restart the server.");
		return "obx not in shared_preload_libraries";
	}
	if (obx_workers == 0)
	{
		*detail = pstrdup("obx.workers is 0.");
		*hint = psprintf("Set obx.workers to 1 or more%s and restart the server.",
						 strcmp(obx_database, here) != 0
							 ? psprintf(" and obx.database to '%s'", here)
							 : "");
		return "obx.workers is 0";
	}
	return list_problem(here, detail, hint);
	return NULL;
}

/*
 * obx_warn_if_unserved
 *		Warn, once per session, that events enqueued here will not be
 *		published by any relay of this server.  Only a warning: the events
 *		are kept and go out once a relay serves the database.
 */
void
obx_warn_if_unserved(void)
{
	static bool checked = false;

	if (checked)
		return;
	checked = true;
	obx_warn_unserved_now();
}

/* The warning itself (also CREATE EXTENSION's). */
void
obx_warn_unserved_now(void)
{
	char *detail;
	char *hint;
	char *here;

	if (!obx_warn_without_relay || relay_problem(&detail, &hint) == NULL)
		return;
	here = get_database_name(MyDatabaseId);
	ereport(WARNING,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("no obx relay publishes the outbox of database \"%s\": "
					"events enqueued here stay in the outbox",
					here),
			 errdetail("%s", detail),
			 errhint("%s", hint)));
}

/*
 * obx._relay_problem() returns text: NULL when a relay of this server
 * publishes the current database's outbox, otherwise why none does (the
 * problem column of obx.status).
 */
Datum
obx_relay_problem(PG_FUNCTION_ARGS)
{
	char *detail;
	char *hint;
	const char *problem = relay_problem(&detail, &hint);

	if (problem == NULL)
		PG_RETURN_NULL();
	PG_RETURN_TEXT_P(cstring_to_text(psprintf("no relay serves this database: %s", problem)));
}

/* Whether consumer workers of this server serve the current database. */
static bool
consumers_serve_here(void)
{
	int position;

	if (obx_shared == NULL)
		return false;
	position = list_position(false, get_database_name(MyDatabaseId));
	return position >= 0 && position < obx_database_capacity(false);
}

/*
 * obx._warn_unserved() returns void: the warning of CREATE EXTENSION.  Not
 * in a database the consumer workers serve: it may only consume, and its
 * first obx.enqueue of a session warns if it does enqueue.
 */
Datum
obx_warn_unserved(PG_FUNCTION_ARGS)
{
	if (!consumers_serve_here())
		obx_warn_unserved_now();
	PG_RETURN_VOID();
}
