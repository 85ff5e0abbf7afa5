/*-------------------------------------------------------------------------
 *
 * turns.c
 *	  The claim-turn protocol: how committing backends and the relay
 *	  workers agree on when a claim is worth running, all in the atomics of
 *	  ObxShared.
 *
 * Wake-up: a commit of obx's functions sets the latch of one relay worker,
 * an idle one if there is one.  One is enough: a worker claims everything
 * claimable up to a batch, and a busy worker claims again as soon as it
 * has room in its pipeline; waking every worker made all but one claim
 * for nothing.
 *
 * Changes: events become claimable through a change the workers hear of
 * (obx_note_change: a commit of obx.enqueue or an operator function, leases
 * released or expired, a stopping worker's records), through a worker's
 * own record (after which that worker claims next, see relay.c), or
 * through time (a backoff or lease running out, a prepared transaction's
 * commit, a row written directly), which each worker's poll covers.  A
 * claim reads the count of changes before its snapshot and, if it took
 * everything it could, publishes that count before its commit releases the
 * claim lock: until the count moves again another claim would find
 * nothing, and is skipped (obx_claim_pointless).
 *
 * Asynchronous commits (synchronous_commit = off) are visible before their
 * WAL is flushed, and the relay must not publish an event a crash could
 * take back.  The committing backend announces the commit before it
 * (obx_async_commit_starting) and, once it is visible, publishes where its
 * commit record ends and withdraws the announcement (obx_async_commit_done).
 * A claim that finds no commit announced after taking its snapshot knows
 * that flushing up to async_commit_end makes every such commit it sees
 * durable.  Synchronous commits never show up here.
 *
 * Turns: left to themselves, workers fall into step (they claim together
 * at start-up or at a poll, then each a gap later), and an event committed
 * just after their claims waits a whole gap.  So obx.claim_gap is shared
 * out among the workers as turns: at most one claim per turn, taken by
 * whichever worker is free, so that a worker busy recording a batch does
 * not hold the others back, and an event waits about a gap divided by the
 * number of workers at most.  A claim that took a full batch (a backlog)
 * ends the turns: the next claim comes at once.
 *
 * Each served database has all of this but the asynchronous commits in a
 * state of its own (ObxDbTurns, the database slot the launcher gave it,
 * found by MyDatabaseId with obx_relay_dbslot): a commit in one
 * database wakes a relay worker of that database and counts as a change
 * there only, and the turns of one database's workers do not space out
 * another's.  Asynchronous commits stay server-wide: a claim that waits for
 * another database's commit to settle only flushes a little more WAL.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/latch.h"
#include "utils/timestamp.h"

#include "obx.h"
#include "launcher.h"
#include "turns.h"

/* The turn state of the current database, or NULL. */
static ObxDbTurns *
my_turns(void)
{
	int i = obx_relay_dbslot(MyDatabaseId);

	return i < 0 ? NULL : &obx_shared->dbs[i];
}

/*
 * obx_wake_workers
 *		Note a change in the current database and set the latch of one of
 *		its running relay workers: an idle one if there is one, taken in
 *		turn.
 *
 * Called from a commit callback, so it must not fail: it only reads the
 * slots (state without the lock: a stale read wakes a busy worker, which
 * is harmless) and sets a latch.
 */
void
obx_wake_workers(void)
{
	int n;
	int start;
	int i;
	int dbslot = obx_relay_dbslot(MyDatabaseId);
	ObxDbTurns *db;
	Latch *fallback = NULL;

	if (dbslot < 0)
		return;
	db = &obx_shared->dbs[dbslot];
	n = db->nworkers;
	if (n <= 0)
		return;
	pg_atomic_fetch_add_u64(&db->changes, 1);
	start = (int) (pg_atomic_fetch_add_u32(&db->next_wake, 1) % n);
	for (i = 0; i < n; i++)
	{
		ObxWorkerSlot *slot = &obx_shared->workers[dbslot * n + (start + i) % n];
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

/* A transaction that changed events is about to commit asynchronously. */
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

/* Something may have made events claimable. */
void
obx_note_change(void)
{
	ObxDbTurns *db = my_turns();

	if (db != NULL)
		pg_atomic_fetch_add_u64(&db->changes, 1);
}

/* The count of changes, read before a claim's snapshot. */
uint64
obx_changes(void)
{
	ObxDbTurns *db = my_turns();

	pg_memory_barrier();
	return db == NULL ? 0 : pg_atomic_read_u64(&db->changes);
}

/* A committed claim took everything claimable as of changes. */
void
obx_claimed_changes(uint64 changes)
{
	ObxDbTurns *db = my_turns();
	uint64 seen;

	if (db == NULL)
		return;
	seen = pg_atomic_read_u64(&db->claimed_changes);
	while ((seen == PG_UINT64_MAX || seen < changes) &&
		   !pg_atomic_compare_exchange_u64(&db->claimed_changes, &seen, changes))
		;
}

/*
 * Whether nothing happened in this database since a claim took everything
 * claimable.  A worker whose database lost its turn state (the launcher
 * dropped it from the list) never skips.
 */
bool
obx_claim_pointless(void)
{
	ObxDbTurns *db = my_turns();

	pg_memory_barrier();
	return db != NULL && pg_atomic_read_u64(&db->changes) ==
							 pg_atomic_read_u64(&db->claimed_changes);
}

/* The least time between two claims of this database's relay: a turn. */
static TimestampTz
turn_us(ObxDbTurns *db)
{
	return (TimestampTz) obx_claim_gap_ms * 1000 / Max(1, db->nworkers);
}

/*
 * Whether, at now, the next turn has come: a turn has passed since the
 * latest claim of any worker (latest), or that claim took a full batch
 * (latest is 0).  A latest claim in the future means the system clock went
 * back: the turn comes now rather than when the clock is back there.
 */
static bool
turn_due(ObxDbTurns *db, uint64 latest, TimestampTz now)
{
	return latest == 0 || (TimestampTz) latest > now ||
		   now >= (TimestampTz) latest + turn_us(db);
}

/*
 * obx_turn_quiet_ms
 *		Milliseconds (rounded up) until the next turn; 0 once it has come.
 */
long
obx_turn_quiet_ms(void)
{
	ObxDbTurns *db = my_turns();
	uint64 latest;
	TimestampTz now;

	if (obx_claim_gap_ms <= 0 || db == NULL)
		return 0;
	latest = pg_atomic_read_u64(&db->last_claim_at);
	now = GetCurrentTimestamp();
	if (turn_due(db, latest, now))
		return 0;
	return (long) (((TimestampTz) latest + turn_us(db) - now + 999) / 1000);
}

/*
 * obx_turn_take
 *		Take the turn that is due, at now, for a claim starting then.
 *		Returns false if another worker took it since the caller looked; the
 *		caller then waits for the next.
 */
bool
obx_turn_take(TimestampTz now)
{
	ObxDbTurns *db = my_turns();
	uint64 latest;

	if (obx_claim_gap_ms <= 0 || db == NULL)
		return true;
	latest = pg_atomic_read_u64(&db->last_claim_at);
	if (!turn_due(db, latest, now))
		return false;
	return pg_atomic_compare_exchange_u64(&db->last_claim_at, &latest, (uint64) now);
}

/*
 * obx_turns_end
 *		The claim that took its turn at claimed_since took a full batch: the
 *		next claim, by any worker, comes at once.
 */
void
obx_turns_end(TimestampTz claimed_since)
{
	ObxDbTurns *db = my_turns();
	uint64 mine = (uint64) claimed_since;

	if (db != NULL)
		(void) pg_atomic_compare_exchange_u64(&db->last_claim_at, &mine, 0);
}
