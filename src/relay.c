/*-------------------------------------------------------------------------
 *
 * relay.c
 *	  The relay worker: claim a batch (a short transaction), produce it to
 *	  Kafka, wait for the delivery reports while serving the latch, SIGHUP
 *	  and SIGTERM, then record the outcome (another short transaction).
 *
 * Up to OBX_PIPELINE batches are in flight at once: while one batch waits
 * for its acknowledgements, the worker claims and produces the next, and
 * records the first when its reports are in.  A batch is claimed while the
 * leases of the worker's other batches are live, so it never holds an
 * event of their keys: per-key order does not depend on which batch is
 * acknowledged first.
 *
 * No transaction is open while the worker waits on Kafka; the only database
 * work during the wait is a lease renewal, itself a short transaction.
 * Any unexpected error ends the worker with exit status 1 and the
 * postmaster starts it again; the new process releases the leases its
 * predecessor held, so those events are re-sent at once with the same ids.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xlog.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "obx.h"

#define OBX_PRODUCER_RETRY_MS 5000

/* While claims come back full, refresh the outbox's statistics this often. */
#define OBX_ANALYZE_INTERVAL_MS 60000

static int my_worker = -1;
static ObxProducer *producer = NULL;
static bool rebuild_producer = false;
static TimestampTz backoff_until = 0; /* retry time of this worker's failed events */

static void
detach_slot(int code, Datum arg)
{
	ObxWorkerSlot *slot = &obx_shared->workers[my_worker];

	SpinLockAcquire(&slot->mutex);
	slot->pid = 0;
	slot->latch = NULL;
	slot->state = OBX_STATE_STOPPING;
	SpinLockRelease(&slot->mutex);
}

static void
attach_slot(void)
{
	ObxWorkerSlot *slot = &obx_shared->workers[my_worker];

	SpinLockAcquire(&slot->mutex);
	slot->pid = MyProcPid;
	slot->latch = MyLatch;
	slot->state = OBX_STATE_STARTING;
	slot->started_at = GetCurrentTimestamp();
	SpinLockRelease(&slot->mutex);
	on_shmem_exit(detach_slot, (Datum) 0);
}

static char *
kafka_settings(void)
{
	return psprintf("%s|%s|%s|%d", obx_brokers, obx_kafka_properties,
					obx_kafka_file_signature(), obx_delivery_timeout_ms);
}

/*
 * Reload the configuration on SIGHUP.  A change of anything the producer
 * is built from marks it for rebuilding: the batch in flight is purged and
 * released (serve_flights), and the next claim uses a new producer.
 */
static void
process_reload(void)
{
	char *before;

	if (!ConfigReloadPending)
		return;
	ConfigReloadPending = false;
	before = kafka_settings();
	ProcessConfigFile(PGC_SIGHUP);
	obx_kafka_file_reread();
	if (strcmp(before, kafka_settings()) != 0)
	{
		rebuild_producer = true;
		ereport(LOG,
				(errmsg("obx relay %d: Kafka settings changed, rebuilding the producer",
						my_worker)));
	}
}

/*
 * What the worker sleeps on: its latch, postmaster death and, while it has
 * a producer, the pipe librdkafka signals its reports on.  Built once per
 * producer: WaitLatchOrSocket builds and frees an epoll set on every call,
 * five system calls around each wait, and the worker waits hundreds of
 * times a second.
 */
static WaitEventSet *wait_set = NULL;

static void
free_wait_set(void)
{
	if (wait_set != NULL)
		FreeWaitEventSet(wait_set);
	wait_set = NULL;
}

/* Destroy the producer (see obx_kafka_destroy) and the wait set on its pipe. */
static void
drop_producer(void)
{
	obx_kafka_destroy(producer, 0);
	producer = NULL;
	free_wait_set();
}

/*
 * The least time between two claims of the relay: obx.claim_gap shared out
 * among its workers, so that each worker claims about once a gap and the
 * claims come at even intervals.
 */
static TimestampTz
turn_us(void)
{
	return (TimestampTz) obx_claim_gap_ms * 1000 / Max(1, obx_shared->nworkers);
}

/*
 * Whether, at now, the next turn has come: a turn has passed since the
 * latest claim of any worker (latest), or that claim took a full batch
 * (latest is 0, see end_turns).  A latest claim in the future means the
 * system clock went back: the turn comes now rather than when the clock
 * is back where it was.
 */
static bool
turn_due(uint64 latest, TimestampTz now)
{
	return latest == 0 || (TimestampTz) latest > now ||
		   now >= (TimestampTz) latest + turn_us();
}

/* Milliseconds (rounded up) until the next turn; 0 once it has come. */
static long
quiet_ms(void)
{
	uint64 latest;
	TimestampTz now;

	if (obx_claim_gap_ms <= 0)
		return 0;
	latest = pg_atomic_read_u64(&obx_shared->last_claim_at);
	now = GetCurrentTimestamp();
	if (turn_due(latest, now))
		return 0;
	return (long) (((TimestampTz) latest + turn_us() - now + 999) / 1000);
}

/*
 * Take the turn that is due, at now.  Returns false if another worker
 * took it since quiet_ms looked; this one then waits for the next.
 *
 * Why turns: left to themselves, workers fall into step (they claim
 * together at start-up or at a poll, then each a gap later), and an event
 * committed just after their claims waits a whole gap.  In turns, an event
 * waits about the gap divided by the number of workers at most.  Whichever
 * worker is free takes the turn: one that is busy recording a batch, or
 * has no CPU just then, does not hold the claims of the others back (when
 * each worker kept a gap of its own and they alternated, the p99 from
 * commit to acknowledgement at 2,000 events/s was about 4.5 ms longer).
 */
static bool
take_turn(TimestampTz now)
{
	uint64 latest;

	if (obx_claim_gap_ms <= 0)
		return true;
	latest = pg_atomic_read_u64(&obx_shared->last_claim_at);
	if (!turn_due(latest, now))
		return false;
	return pg_atomic_compare_exchange_u64(&obx_shared->last_claim_at, &latest, (uint64) now);
}

/*
 * A claim took a full batch (a backlog): the next claim, by any worker,
 * comes at once.
 */
static void
end_turns(TimestampTz claimed_since)
{
	uint64 mine = (uint64) claimed_since;

	(void) pg_atomic_compare_exchange_u64(&obx_shared->last_claim_at, &mine, 0);
}

/*
 * Sleep until the latch is set, the producer has something to serve, or
 * timeout_ms passes.  Serves the producer and the signals on the way out.
 *
 * While the worker is quiet (see launch_flight) the latch is left out and
 * the sleep ends with the quiet at the latest: a commit's wake-up then
 * costs the committing backend a flag and this worker nothing, and its
 * events are claimed when the quiet ends.  Shutdown and reload requests
 * are seen then too, at most a turn late.
 */
static void
wait_for_work(long timeout_ms)
{
	WaitEvent occurred;
	long quiet = quiet_ms();

	if (wait_set == NULL)
	{
		wait_set = CreateWaitEventSet(TopMemoryContext, 3);
		AddWaitEventToSet(wait_set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, NULL);
		AddWaitEventToSet(wait_set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, NULL, NULL);
		if (producer != NULL)
			AddWaitEventToSet(wait_set, WL_SOCKET_READABLE,
							  obx_kafka_event_fd(producer), NULL, NULL);
	}
	if (quiet > 0)
	{
		ModifyWaitEvent(wait_set, 0, WL_LATCH_SET, NULL);
		(void) WaitEventSetWait(wait_set, Min(timeout_ms, quiet), &occurred, 1,
								PG_WAIT_EXTENSION);
		ModifyWaitEvent(wait_set, 0, WL_LATCH_SET, MyLatch);
	}
	else
	{
		(void) WaitEventSetWait(wait_set, timeout_ms, &occurred, 1, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
	CHECK_FOR_INTERRUPTS();
	if (producer != NULL)
		obx_kafka_serve(producer);
	process_reload();
}

static long
ms_until(TimestampTz t)
{
	long secs;
	int usecs;

	TimestampDifference(GetCurrentTimestamp(), t, &secs, &usecs);
	return secs * 1000 + usecs / 1000;
}

/*
 * A claimed batch on its way to Kafka, with its own memory.
 */
typedef struct Flight
{
	bool used;
	MemoryContext cxt;
	ObxBatch batch;
	TimestampTz claimed_since;
	TimestampTz produced_since;
	TimestampTz renew_at;
} Flight;

#define OBX_PIPELINE 2

static Flight flights[OBX_PIPELINE];
static int nflights = 0;

/*
 * When this worker claims next even if no change was heard of since the
 * latest claim (obx_claim_pointless): after obx.poll_interval, and at once
 * after a claim that stopped at the batch's limits or after recording a
 * batch.
 */
static TimestampTz next_poll = 0;
static bool claim_again = false;
static TimestampTz give_up_at = 0; /* shutting down: stop waiting then */

/*
 * Claim a batch into a free flight and produce it.  Returns false when
 * there was nothing to claim, or when the worker is quiet: within a turn
 * of any worker's latest claim, unless that claim took a full batch (a
 * backlog).  A claim and its record cost two transactions whatever the
 * batch's size, so the commits of a turn wait and go out together.
 */
static bool
launch_flight(void)
{
	Flight *f = NULL;
	MemoryContext old;
	int i;
	bool force;
	TimestampTz now;

	if (quiet_ms() > 0)
		return false;
	now = GetCurrentTimestamp();
	force = claim_again || now >= next_poll;
	if (!force && obx_claim_pointless())
		return false;
	if (!take_turn(now))
		return false;
	if (force)
		next_poll = TimestampTzPlusMilliseconds(now, obx_poll_interval_ms);
	claim_again = false;

	for (i = 0; i < OBX_PIPELINE && f == NULL; i++)
		if (!flights[i].used)
			f = &flights[i];
	Assert(f != NULL);

	f->cxt = AllocSetContextCreate(TopMemoryContext, "obx relay batch",
								   ALLOCSET_DEFAULT_SIZES);
	old = MemoryContextSwitchTo(f->cxt);
	f->claimed_since = now;
	if (!obx_outbox_claim(&f->batch, my_worker, force))
	{
		MemoryContextSwitchTo(old);
		MemoryContextDelete(f->cxt);
		return false;
	}
	f->used = true;
	nflights++;
	claim_again = f->batch.full;
	if (f->batch.full)
		end_turns(f->claimed_since);
	obx_status_set_state(my_worker, OBX_STATE_PRODUCING);
	f->produced_since = GetCurrentTimestamp();
	obx_kafka_produce(producer, &f->batch);
	f->renew_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
											  obx_lease_timeout_s * 1000L / 3);
	MemoryContextSwitchTo(old);
	return true;
}

/*
 * Record what Kafka said about a flight whose reports are all in (or that
 * was given up on, with the producer destroyed), and free it.
 */
static void
land_flight(Flight *f)
{
	ObxBatch *batch = &f->batch;
	MemoryContext old = MemoryContextSwitchTo(f->cxt);
	int delivered;
	int failed = 0;
	const char *last_error = NULL;
	TimestampTz recorded_since;
	int released;
	int i;

	released = obx_kafka_blame_oversize(batch);
	if (released > 0)
		ereport(LOG,
				(errmsg("obx relay %d: %d events refused by the broker with a larger one (MSG_SIZE_TOO_LARGE) are sent again",
						my_worker, released),
				 errdetail("The broker refuses a whole record batch over the topic's max.message.bytes; only its largest event keeps the error.")));
	for (i = 0; i < batch->nevents; i++)
	{
		ObxEvent *ev = &batch->events[i];

		if (ev->outcome == OBX_OUTCOME_FAILED)
		{
			failed++;
			last_error = psprintf("event %s topic %s: %s (%s)", ev->id_text,
								  ev->topic, obx_kafka_error_name(ev->err),
								  obx_error_class_name(ev->error_class));
		}
	}

	recorded_since = GetCurrentTimestamp();
	delivered = obx_outbox_record(batch);

	/*
	 * The lease's keys, and its events not sent, are free again: this
	 * worker claims next whatever the count of changes says.  Counting the
	 * record as a change instead sent the other workers to claim too, and
	 * they mostly found nothing.  A worker that is stopping tells them.
	 */
	if (ShutdownRequestPending)
		obx_note_change();
	else
		claim_again = true;
	backoff_until = Max(backoff_until, batch->retry_at);
	obx_status_batch_done(my_worker, delivered, failed, last_error);
	elog(DEBUG1, "obx relay %d: batch of %d events, %d published, %d failed; claim %.1f ms, Kafka %.1f ms, record %.1f ms",
		 my_worker, batch->nevents, delivered, failed,
		 (f->produced_since - f->claimed_since) / 1000.0,
		 (recorded_since - f->produced_since) / 1000.0,
		 (GetCurrentTimestamp() - recorded_since) / 1000.0);

	MemoryContextSwitchTo(old);
	MemoryContextDelete(f->cxt);
	f->used = false;
	nflights--;
}

/*
 * Stop waiting for the flights: destroy the producer, which purges what
 * is still in librdkafka and serves every outstanding report, then record
 * them all.  Purged events are released and re-sent later with the same
 * ids (by a new producer, after a settings change).
 */
static void
abandon_flights(void)
{
	int i;

	drop_producer();
	for (i = 0; i < OBX_PIPELINE; i++)
		if (flights[i].used)
			land_flight(&flights[i]);
	give_up_at = 0;
}

/*
 * serve_flights
 *		Wait a little for delivery reports, then record every flight whose
 *		reports are all in.
 *
 * Renews each flight's lease every third of obx.lease_timeout.  If a
 * renewal finds the lease lost (the worker stalled and another took the
 * events over), events not yet sent are purged.  On shutdown it waits at
 * most obx.shutdown_timeout, and on a change of Kafka settings not at all;
 * whatever is still in flight then is released.
 */
static void
serve_flights(void)
{
	TimestampTz now;
	long timeout = 1000;
	bool all_done = true;
	int i;

	/* Nothing to wait for when a flight is already complete. */
	for (i = 0; i < OBX_PIPELINE; i++)
		if (flights[i].used)
		{
			if (flights[i].batch.in_flight == 0)
				timeout = 0;
			timeout = Min(timeout, Max(1, ms_until(flights[i].renew_at)));
		}
	if (give_up_at != 0)
		timeout = Min(timeout, Max(1, ms_until(give_up_at)));
	if (timeout > 0)
		wait_for_work(timeout);
	else
	{
		obx_kafka_serve(producer);
		process_reload();
	}

	obx_status_set_state(my_worker, obx_kafka_brokers_down(producer) ? OBX_STATE_BROKER_DOWN : OBX_STATE_PRODUCING);

	if (rebuild_producer)
	{
		abandon_flights();
		return;
	}
	if (ShutdownRequestPending)
	{
		if (give_up_at == 0)
			give_up_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
													 obx_shutdown_timeout_ms);
		else if (GetCurrentTimestamp() >= give_up_at)
		{
			abandon_flights();
			return;
		}
	}

	now = GetCurrentTimestamp();
	for (i = 0; i < OBX_PIPELINE; i++)
	{
		Flight *f = &flights[i];

		if (!f->used || f->batch.in_flight == 0 || now < f->renew_at)
			continue;
		if (obx_outbox_renew(&f->batch) < f->batch.nevents)
		{
			ereport(WARNING,
					(errmsg("obx relay %d lost the lease on %d of %d events",
							my_worker, f->batch.nevents, f->batch.nevents),
					 errdetail("The worker was stalled for longer than obx.lease_timeout; another worker re-sends them.")));
			obx_kafka_purge(producer);
		}
		f->renew_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
												  obx_lease_timeout_s * 1000L / 3);
	}

	for (i = 0; i < OBX_PIPELINE; i++)
		if (flights[i].used && flights[i].batch.in_flight == 0)
			land_flight(&flights[i]);
		else if (flights[i].used)
			all_done = false;

	if (all_done && producer != NULL && obx_kafka_broken(producer))
		drop_producer();
}

/*
 * What an idle worker is waiting for: brokers to come back, failed events'
 * backoff to pass, or new events.
 */
static ObxWorkerState
idle_state(void)
{
	if (obx_kafka_brokers_down(producer))
		return OBX_STATE_BROKER_DOWN;
	/*
	 * Only while events this worker failed wait for their retry: not after
	 * a failure that quarantined them, and not forever once another worker
	 * has taken the retry over.
	 */
	if (GetCurrentTimestamp() < backoff_until)
		return OBX_STATE_BACKING_OFF;
	return OBX_STATE_IDLE;
}

/*
 * obx_relay_main
 *		Entry point of relay worker number main_arg.
 */
void
obx_relay_main(Datum main_arg)
{
	MemoryContext loop_cxt;
	bool ready = false;
	int64 released;
	bool said_waiting = false;
	TimestampTz next_purge = 0;
	TimestampTz next_analyze = 0;
	TimestampTz next_producer_try = 0;

	my_worker = DatumGetInt32(main_arg);

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
	BackgroundWorkerUnblockSignals();

	BackgroundWorkerInitializeConnection(obx_database, NULL, 0);
	obx_worker_pin_settings();
	attach_slot();
	pgstat_report_appname("obx relay");

	loop_cxt = AllocSetContextCreate(TopMemoryContext, "obx relay loop",
									 ALLOCSET_DEFAULT_SIZES);

	/*
	 * Steps commit with synchronous_commit on unless they say otherwise.
	 * A claim commits asynchronously and then flushes (and waits for a
	 * synchronous standby) itself, past the commit records of every event
	 * it claimed, before anything is produced (see obx_outbox_claim).
	 */
	SetConfigOption("synchronous_commit", "on", PGC_SUSET, PGC_S_OVERRIDE);

#ifdef USE_LZ4

	/*
	 * A lease row holds its batch's ids, topics and keys (tens of kB for a
	 * full batch), which PostgreSQL compresses into TOAST: with pglz, the
	 * default, that was 6 % of a claim's time in a drain, inside the claim
	 * lock.  lz4 compresses several times faster.  Only values this worker
	 * writes are affected, and the server reads either kind.
	 */
	SetConfigOption("default_toast_compression", "lz4", PGC_USERSET, PGC_S_OVERRIDE);
#endif

	ereport(LOG,
			(errmsg("obx relay %d started for database \"%s\"", my_worker,
					obx_database)));

	while (!ShutdownRequestPending || nflights > 0)
	{
		bool launched = false;

		MemoryContextSwitchTo(loop_cxt);
		MemoryContextReset(loop_cxt);
		process_reload();

		/* Stopping: no new claims, only the flights still out. */
		if (ShutdownRequestPending)
		{
			serve_flights();
			continue;
		}

		if (RecoveryInProgress())
		{
			obx_status_set_state(my_worker, OBX_STATE_STANDBY);
			wait_for_work(obx_poll_interval_ms);
			continue;
		}

		if (!ready)
		{
			ready = obx_extension_exists();
			if (!ready)
			{
				if (!said_waiting)
					ereport(LOG,
							(errmsg("obx relay %d is waiting for CREATE EXTENSION obx in database \"%s\"",
									my_worker, obx_database)));
				said_waiting = true;
				obx_status_set_state(my_worker, OBX_STATE_WAITING_FOR_EXTENSION);
				wait_for_work(obx_poll_interval_ms);
				continue;
			}
			released = obx_outbox_release_orphans(my_worker);
			if (released > 0)
				ereport(LOG,
						(errmsg("obx relay %d released %lld events leased by its previous run",
								my_worker, (long long) released),
						 errdetail("They are re-sent with the same event ids.")));
		}

		if (my_worker == 0 && GetCurrentTimestamp() >= next_purge)
		{
			int64 purged = obx_outbox_purge();

			next_purge = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
													 purged > 0 ? 0 : OBX_PURGE_INTERVAL_MS);
		}

		/*
		 * New Kafka settings: build the next batch's producer from them
		 * (serve_flights gives the batches in flight up first).
		 */
		if (rebuild_producer && producer != NULL && nflights == 0)
			drop_producer();

		if (producer == NULL)
		{
			char errbuf[512];

			if (GetCurrentTimestamp() < next_producer_try)
			{
				wait_for_work(ms_until(next_producer_try));
				continue;
			}
			producer = obx_kafka_create(my_worker, errbuf, sizeof(errbuf));
			rebuild_producer = false;
			free_wait_set(); /* the next wait watches the new producer's pipe */
			if (producer == NULL)
			{
				ereport(WARNING,
						(errcode(ERRCODE_CONFIG_FILE_ERROR),
						 errmsg("obx relay %d could not create a Kafka producer: %s",
								my_worker, errbuf),
						 errhint("Check obx.brokers and obx.kafka_properties, then reload.")));
				obx_status_error(my_worker, errbuf);
				obx_status_set_state(my_worker, OBX_STATE_BROKER_DOWN);
				next_producer_try = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
																OBX_PRODUCER_RETRY_MS);
				continue;
			}
		}

		/* Keep the pipeline full: claim while earlier batches are out. */
		if (nflights < OBX_PIPELINE && !rebuild_producer && !obx_kafka_broken(producer))
			launched = launch_flight();

		if (nflights == 0)
		{
			obx_status_set_state(my_worker, idle_state());
			wait_for_work(Max(1, Min(obx_poll_interval_ms, ms_until(next_poll))));
			continue;
		}

		if (launched)
		{
			int i;
			bool full = false;

			for (i = 0; i < OBX_PIPELINE; i++)
				if (flights[i].used && flights[i].batch.nevents >= obx_batch_size)
					full = true;

			/*
			 * A full batch means a backlog, which the statistics the relay's
			 * statements are planned from may not have seen yet.  One
			 * worker refreshes them for all (an ANALYZE of a large backlog
			 * costs as much as several batches).
			 */
			if (my_worker == 0 && full && GetCurrentTimestamp() >= next_analyze)
			{
				obx_outbox_analyze();
				next_analyze = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
														   OBX_ANALYZE_INTERVAL_MS);
			}
			/* Another slot free: try to claim the next batch at once. */
			if (nflights < OBX_PIPELINE)
				continue;
		}

		serve_flights();
	}

	obx_status_set_state(my_worker, OBX_STATE_STOPPING);
	drop_producer();
	ereport(LOG, (errmsg("obx relay %d stopped", my_worker)));

	/*
	 * Exit status 1, not 0: the postmaster unregisters a worker that exits
	 * with 0, so a pg_terminate_backend() would stop the relay until the
	 * next server start.  With 1 it comes back after bgw_restart_time; at
	 * server shutdown nothing is restarted either way.
	 */
	proc_exit(1);
}
