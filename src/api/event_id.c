/*-------------------------------------------------------------------------
 *
 * event_id.c
 *	  One event per given id, across the outbox's generations: the insert
 *	  of an event whose id the caller gave (obx.enqueue, obx.enqueue_many,
 *	  obx.enqueue_tombstone with event_id).
 *
 * obx.events has a unique index on id per partition, one partition per
 * generation (obx--1.0--1.1.sql), so no index sees an id inserted into
 * another generation's partition by a transaction still open.  Here the
 * id is looked up in every partition and in obx.event_states with a dirty
 * snapshot, which sees such a row, under a lock on the id that is held
 * only from the look-up to the insert: a call that finds the id inserted
 * by an open transaction waits for that transaction, as a unique index
 * makes it wait, and looks again.  docs/internals.md ("One event per id")
 * gives the reasoning; docs/sql.md ("Repeated event id") the rules.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "common/hashfn.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

#include "enqueue.h"

/*
 * The lock on a given id: an advisory lock tag of obx's own class, which
 * no pg_advisory_lock call can take (those use classes 1 and 2); it shows
 * in pg_locks as an advisory lock with objsubid 0x6f62 ("ob").
 */
#define OBX_LOCKTAG_EVENT_ID 0x6f62

/* What a look-up of one id found. */
typedef enum IdFound
{
	ID_NONE,      /* in no partition and no state: the id is free */
	ID_WAIT,      /* inserted by a transaction still open: wait for it */
	ID_SAME,      /* the same event */
	ID_DIFFERENT, /* another event */
	ID_SKIPPED,   /* given up on by obx.skip, still retained */
	ID_UNSEEN     /* committed after this transaction's snapshot was taken */
} IdFound;

/* The tables a given id is looked up in, and the index on id of each. */
static const char *const id_tables[][2] = {
	{"event_states", "event_states_pkey"},
	{"events_0", "events_0_id_idx"},
	{"events_1", "events_1_id_idx"},
	{"events_2", "events_2_id_idx"},
};

/* The named column of a row found into *value; returns whether it is null. */
static bool
column_value(HeapTuple tup, TupleDesc desc, const char *name, Datum *value)
{
	int attno = SPI_fnumber(desc, name);
	bool isnull;

	if (attno <= 0)
		elog(ERROR, "obx table has no column \"%s\"", name);
	*value = heap_getattr(tup, attno, desc, &isnull);
	return isnull;
}

static bool
same_text_column(HeapTuple tup, TupleDesc desc, const char *name, const char *expected)
{
	Datum value;
	bool isnull = column_value(tup, desc, name, &value);

	if (isnull || expected == NULL)
		return isnull && expected == NULL;
	return strcmp(TextDatumGetCString(value), expected) == 0;
}

static bool
same_jsonb_column(HeapTuple tup, TupleDesc desc, const char *name, Jsonb *expected)
{
	Datum value;
	bool isnull = column_value(tup, desc, name, &value);

	if (isnull || expected == NULL)
		return isnull && expected == NULL;
	return DatumGetBool(DirectFunctionCall2(jsonb_eq, value, JsonbPGetDatum(expected)));
}

/*
 * Whether a row found holds the event ev: the same topic, key, payload (as
 * jsonb), aggregate id (the key when not given), event type and headers.
 */
static bool
same_event(HeapTuple tup, TupleDesc desc, const EnqueueEvent *ev)
{
	return same_text_column(tup, desc, "topic", ev->topic) &&
		   same_text_column(tup, desc, "event_key", ev->key) &&
		   same_text_column(tup, desc, "aggregate_id",
							ev->aggregate_id ? ev->aggregate_id : ev->key) &&
		   same_text_column(tup, desc, "event_type", ev->event_type) &&
		   same_jsonb_column(tup, desc, "headers", ev->headers) &&
		   same_jsonb_column(tup, desc, "payload", ev->payload);
}

/*
 * Whether the transaction that inserted a committed row is one this
 * transaction's snapshot cannot see: only at REPEATABLE READ and above,
 * where the snapshot is the transaction's; at READ COMMITTED the next
 * statement would see it.
 */
static bool
committed_unseen(HeapTuple tup)
{
	TransactionId xmin;

	if (!IsolationUsesXactSnapshot() || HeapTupleHeaderXminFrozen(tup->t_data))
		return false;
	xmin = HeapTupleHeaderGetRawXmin(tup->t_data);
	if (TransactionIdIsCurrentTransactionId(xmin))
		return false;
	return XidInMVCCSnapshot(xmin, GetTransactionSnapshot());
}

/*
 * find_in
 *		Look the id up in one table, through its unique index on id, with a
 *		dirty snapshot: a row inserted by an open transaction counts
 *		(ID_WAIT, *wait_for its transaction), one deleted or rolled back
 *		does not.  The row is compared while the table is locked, and the
 *		lock is released at once: holding it to the end of the transaction
 *		would keep a generation from being truncated (obx._rotate).
 */
static IdFound
find_in(Oid nsp, int table, Datum id, const EnqueueEvent *ev, TransactionId *wait_for)
{
	Oid relid = get_relname_relid(id_tables[table][0], nsp);
	Oid indexid = get_relname_relid(id_tables[table][1], nsp);
	SnapshotData dirty;
	ScanKeyData key;
	SysScanDesc scan;
	Relation rel;
	HeapTuple tup;
	IdFound found = ID_NONE;

	if (!OidIsValid(relid) || !OidIsValid(indexid))
		elog(ERROR, "obx table obx.%s or its index %s is missing",
			 id_tables[table][0], id_tables[table][1]);
	InitDirtySnapshot(dirty);
	ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_UUID_EQ, id);
	rel = table_open(relid, AccessShareLock);
	scan = systable_beginscan(rel, indexid, true, &dirty, 1, &key);
	if ((tup = systable_getnext(scan)) != NULL)
	{
		TupleDesc desc = RelationGetDescr(rel);
		int skipped = SPI_fnumber(desc, "skipped_at");

		if (TransactionIdIsValid(dirty.xmin))
		{
			*wait_for = dirty.xmin;
			found = ID_WAIT;
		}
		else if (committed_unseen(tup))
			found = ID_UNSEEN;
		else if (skipped > 0 && !heap_attisnull(tup, skipped, desc))
			found = ID_SKIPPED;
		else
			found = same_event(tup, desc, ev) ? ID_SAME : ID_DIFFERENT;
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return found;
}

/*
 * find_id
 *		Look the id up in obx.event_states (a held event outlives its
 *		generation; a skipped one keeps its state there until then) and in
 *		each generation's partition; the first table that has it decides.
 */
static IdFound
find_id(Datum id, const EnqueueEvent *ev, TransactionId *wait_for)
{
	Oid nsp = get_namespace_oid("obx", false);
	int table;

	for (table = 0; table < lengthof(id_tables); table++)
	{
		IdFound found = find_in(nsp, table, id, ev, wait_for);

		if (found != ID_NONE)
			return found;
	}
	return ID_NONE;
}

static void
report_found(IdFound found, Datum id)
{
	char *id_text = DatumGetCString(DirectFunctionCall1(uuid_out, id));

	switch (found)
	{
		case ID_DIFFERENT:
			ereport(ERROR,
					(errcode(ERRCODE_UNIQUE_VIOLATION),
					 errmsg("obx event id %s already exists with different content", id_text),
					 errdetail("Enqueueing an existing event id is a no-op only when topic, key, payload, aggregate id, event type and headers are the same."),
					 errhint("Give a new event its own id, or omit the id to have one generated.")));
			break;
		case ID_SKIPPED:
			ereport(ERROR,
					(errcode(ERRCODE_UNIQUE_VIOLATION),
					 errmsg("obx event id %s was skipped", id_text),
					 errdetail("obx.skip gave up on the event with this id; it is in obx.skipped_events, and the id stays in use for as long as the outbox retains the event."),
					 errhint("Give a new event its own id, or omit the id to have one generated.")));
			break;
		case ID_UNSEEN:
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("could not serialize access due to concurrent update"),
					 errdetail("obx event id %s was enqueued by a transaction that committed after this transaction's snapshot was taken.", id_text),
					 errhint("Retry the transaction.")));
			break;
		default:
			break;
	}
}

/*
 * obx_enqueue_given
 *		Insert ev, whose id the caller gave, with the plan given (its
 *		parameters values and nulls), unless an event with that id is
 *		retained already: then a no-op if it is the same event, an error
 *		otherwise (report_found).  Returns whether it inserted.  Assumes
 *		SPI is connected.
 *
 * The lock on the id is taken before the look-up and released after the
 * insert, so that two calls cannot both find the id free; a call that
 * finds it inserted by an open transaction releases the lock, waits for
 * that transaction and looks again.
 */
bool
obx_enqueue_given(const EnqueueEvent *ev, SPIPlanPtr plan, Datum *values, const char *nulls)
{
	Datum id = UUIDPGetDatum(ev->id);
	uint64 hash = hash_bytes_extended(ev->id->data, UUID_LEN, 0);
	LOCKTAG tag;

	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, (uint32) (hash >> 32), (uint32) hash,
						 OBX_LOCKTAG_EVENT_ID);
	for (;;)
	{
		TransactionId wait_for = InvalidTransactionId;
		IdFound found;
		int rc;

		(void) LockAcquire(&tag, ExclusiveLock, false, false);
		found = find_id(id, ev, &wait_for);
		if (found == ID_WAIT)
		{
			LockRelease(&tag, ExclusiveLock, false);
			XactLockTableWait(wait_for, NULL, NULL, XLTW_None);
			continue;
		}
		if (found != ID_NONE)
		{
			LockRelease(&tag, ExclusiveLock, false);
			report_found(found, id);
			return false;
		}
		rc = SPI_execute_plan(plan, values, nulls, false, 0);
		if (rc != SPI_OK_INSERT || SPI_processed != 1)
			elog(ERROR, "obx enqueue insert failed: %s", SPI_result_code_string(rc));
		LockRelease(&tag, ExclusiveLock, false);
		return true;
	}
}
