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
 * Any unexpected error ends the worker and the launcher starts it again
 * a second later; the new process releases the leases its
 * predecessor held, so those events are re-sent at once with the same ids.
 *
 * Start-up, reload, the wait and exit are the worker base's (worker.c),
 * the purges housekeeping.c's; when to claim is the claim-turn protocol's
 * (turns.c).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xlog.h"
#include "miscadmin.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/proc.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "obx.h"
#include "housekeeping.h"
#include "kafka.h"
#include "outbox.h"
#include "protocol.h"
#include "status.h"
#include "turns.h"
#include "worker.h"

#define OBX_PRODUCER_RETRY_MS 5000

/* While claims come back full, refresh the outbox's statistics this often. */
#define OBX_ANALYZE_INTERVAL_MS 60000

#define OBX_PIPELINE 2

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

/*
 * Everything the relay worker keeps between two passes of its loop.
 */
typedef struct RelayState
{
	ObxWorker w;
	MemoryContext loop_cxt; /* reset every pass */
	bool ready;             /* extension found, running as its role */
	bool orphans_released;  /* the previous run's leases, at the first claim */
	ObxProducer *producer;
	bool rebuild_producer; /* Kafka settings changed */
	TimestampTz next_producer_try;
	Flight flights[OBX_PIPELINE];
	int nflights;

	/*
	 * When this worker claims next even if no change was heard of since the
	 * latest claim (obx_claim_pointless): after obx.poll_interval, and at
	 * once after a claim that stopped at the batch's limits or after
	 * recording a batch.
	 */
	TimestampTz next_poll;
	bool claim_again;
	TimestampTz give_up_at;    /* shutting down: stop waiting then */
	TimestampTz backoff_until; /* retry time of this worker's failed events */
	TimestampTz next_analyze;
} RelayState;

static RelayState relay;

static void
detach_slot(int code, Datum arg)
{
	ObxWorkerSlot *slot = &obx_shared->workers[relay.w.number];

	SpinLockAcquire(&slot->mutex);
	slot->pid = 0;
	slot->latch = NULL;
	slot->state = OBX_STATE_STOPPING;
	SpinLockRelease(&slot->mutex);
}

static void
attach_slot(void)
{
	ObxWorkerSlot *slot = &obx_shared->workers[relay.w.number];

	SpinLockAcquire(&slot->mutex);
	slot->pid = MyProcPid;
	slot->latch = MyLatch;
	slot->state = OBX_STATE_STARTING;
	slot->started_at = GetCurrentTimestamp();
	SpinLockRelease(&slot->mutex);
	on_shmem_exit(detach_slot, (Datum) 0);
}

static void
set_state(ObxWorkerState state)
{
	obx_status_set_state(relay.w.number, state);
}

/*
 * Reload the configuration on SIGHUP.  A change of anything the producer
 * is built from marks it for rebuilding: the batches in flight are purged
 * and released (serve_flights), and the next claim uses a new producer.
 */
static void
relay_reload(void)
{
	if (!obx_worker_reload(&relay.w))
		return;
	relay.rebuild_producer = true;
	ereport(LOG,
			(errmsg("obx relay %d: Kafka settings changed, rebuilding the producer",
					relay.w.number)));
}

/* Destroy the producer (see obx_kafka_destroy); the wait leaves its pipe. */
static void
drop_producer(void)
{
	obx_kafka_destroy(relay.producer, 0);
	relay.producer = NULL;
	obx_worker_watch_fd(&relay.w, PGINVALID_SOCKET);
}

/*
 * Sleep until the latch is set, the producer has something to serve, or
 * timeout_ms passes.  Serves the producer and the signals on the way out.
 *
 * Between two turns (obx_turn_quiet_ms) the latch is left out and the sleep
 * ends with the quiet at the latest: a commit's wake-up then costs the
 * committing backend a flag and this worker nothing, and its events are
 * claimed when the quiet ends.  Shutdown and reload requests are seen then
 * too, at most a turn late.
 */
static void
wait_for_work(long timeout_ms)
{
	long quiet = obx_turn_quiet_ms();

	if (quiet > 0)
		obx_worker_wait(&relay.w, Min(timeout_ms, quiet), false);
	else
		obx_worker_wait(&relay.w, timeout_ms, true);
	if (relay.producer != NULL)
		obx_kafka_serve(relay.producer);
	relay_reload();
}

/*
 * Whether this worker may claim now: not within a turn of any worker's
 * latest claim (unless that claim took a full batch), not when nothing
 * changed since a claim took everything (unless its poll is due), and only
 * if it wins the turn.  Sets *force for a claim that must not be skipped.
 */
static bool
claim_due(TimestampTz now, bool *force)
{
	if (obx_turn_quiet_ms() > 0)
		return false;
	*force = relay.claim_again || now >= relay.next_poll;
	if (!*force && obx_claim_pointless())
		return false;
	if (!obx_turn_take(now))
		return false;
	if (*force)
		relay.next_poll = TimestampTzPlusMilliseconds(now, obx_poll_interval_ms);
	relay.claim_again = false;
	return true;
}

/*
 * Claim a batch into a free flight and produce it.  Returns the flight, or
 * NULL when there is no room, no producer to take it, no turn, or nothing
 * to claim.  A claim and its record cost two transactions whatever the
 * batch's size, so the commits of a turn wait and go out together.
 */
static Flight *
launch_flight(void)
{
	Flight *f = NULL;
	MemoryContext old;
	bool force;
	TimestampTz now = GetCurrentTimestamp();
	int i;

	if (relay.nflights >= OBX_PIPELINE || relay.rebuild_producer ||
		obx_kafka_broken(relay.producer) || !claim_due(now, &force))
		return NULL;
	for (i = 0; i < OBX_PIPELINE && f == NULL; i++)
		if (!relay.flights[i].used)
			f = &relay.flights[i];
	Assert(f != NULL);

	f->cxt = AllocSetContextCreate(TopMemoryContext, "obx relay batch",
								   ALLOCSET_DEFAULT_SIZES);
	old = MemoryContextSwitchTo(f->cxt);
	f->claimed_since = now;
	if (!obx_outbox_claim(&f->batch, relay.w.number, force, relay.nflights == 0))
	{
		MemoryContextSwitchTo(old);
		MemoryContextDelete(f->cxt);
		return NULL;
	}
	f->used = true;
	relay.nflights++;
	relay.claim_again = f->batch.full;
	if (f->batch.full)
		obx_turns_end(f->claimed_since);
	set_state(OBX_STATE_PRODUCING);
	f->produced_since = GetCurrentTimestamp();
	obx_kafka_produce(relay.producer, &f->batch);
	f->renew_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
											  obx_lease_timeout_s * 1000L / 3);
	MemoryContextSwitchTo(old);
	return f;
}

/* The last failure of a batch, for obx.workers, and how many failed. */
static const char *
last_failure(ObxBatch *batch, int *failed)
{
	const char *last_error = NULL;
	int i;

	*failed = 0;
	for (i = 0; i < batch->nevents; i++)
	{
		ObxEvent *ev = &batch->events[i];

		if (ev->outcome != OBX_OUTCOME_FAILED)
			continue;
		(*failed)++;
		last_error = psprintf("event %s topic %s: %s (%s)", ev->id_text,
							  ev->topic, obx_kafka_error_name(ev->err),
							  obx_error_class_name(ev->error_class));
	}
	return last_error;
}

/*
 * Record what Kafka said about a flight whose reports are all in (or that
 * was given up on, with the producer destroyed), and free it.
 *
 * The lease's keys, and its events not sent, are free again afterwards:
 * this worker claims next whatever the count of changes says (counting the
 * record as a change sent the other workers to claim too, mostly for
 * nothing).  A worker that is stopping tells the others.
 */
static void
land_flight(Flight *f)
{
	ObxBatch *batch = &f->batch;
	MemoryContext old = MemoryContextSwitchTo(f->cxt);
	int delivered;
	int failed;
	const char *last_error;
	TimestampTz recorded_since;
	int released;

	released = obx_kafka_blame_oversize(batch);
	if (released > 0)
		ereport(LOG,
				(errmsg("obx relay %d: %d events refused by the broker with a larger one (MSG_SIZE_TOO_LARGE) are sent again",
						relay.w.number, released),
				 errdetail("The broker refuses a whole record batch over the topic's max.message.bytes; only its largest event keeps the error.")));
	last_error = last_failure(batch, &failed);

	recorded_since = GetCurrentTimestamp();
	delivered = obx_outbox_record(batch);
	if (delivered < batch->nevents)
		obx_claim_forget();
	if (ShutdownRequestPending)
		obx_note_change();
	else
		relay.claim_again = true;
	relay.backoff_until = Max(relay.backoff_until, batch->retry_at);
	obx_status_batch_done(relay.w.number, delivered, failed, last_error);
	elog(DEBUG1, "obx relay %d: batch of %d events, %d published, %d failed; claim %.1f ms, Kafka %.1f ms, record %.1f ms",
		 relay.w.number, batch->nevents, delivered, failed,
		 (f->produced_since - f->claimed_since) / 1000.0,
		 (recorded_since - f->produced_since) / 1000.0,
		 (GetCurrentTimestamp() - recorded_since) / 1000.0);

	MemoryContextSwitchTo(old);
	MemoryContextDelete(f->cxt);
	f->used = false;
	relay.nflights--;
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
		if (relay.flights[i].used)
			land_flight(&relay.flights[i]);
	relay.give_up_at = 0;
}

/*
 * Wait for delivery reports: up to a second, until the next lease renewal
 * or the end of the shutdown wait, not at all when a flight is complete.
 */
static void
wait_for_reports(void)
{
	long timeout = 1000;
	int i;

	for (i = 0; i < OBX_PIPELINE; i++)
		if (relay.flights[i].used)
		{
			if (relay.flights[i].batch.in_flight == 0)
				timeout = 0;
			timeout = Min(timeout, Max(1, obx_ms_until(relay.flights[i].renew_at)));
		}
	if (relay.give_up_at != 0)
		timeout = Min(timeout, Max(1, obx_ms_until(relay.give_up_at)));
	if (timeout > 0)
		wait_for_work(timeout);
	else
	{
		obx_kafka_serve(relay.producer);
		relay_reload();
	}
}

/*
 * Renew each waiting flight's lease every third of obx.lease_timeout.  If a
 * renewal finds the lease lost (the worker stalled and another took the
 * events over), events not yet sent are purged.
 */
static void
renew_leases(void)
{
	TimestampTz now = GetCurrentTimestamp();
	int i;

	for (i = 0; i < OBX_PIPELINE; i++)
	{
		Flight *f = &relay.flights[i];

		if (!f->used || f->batch.in_flight == 0 || now < f->renew_at)
			continue;
		if (obx_outbox_renew(&f->batch) < f->batch.nevents)
		{
			ereport(WARNING,
					(errmsg("obx relay %d lost the lease on %d of %d events",
							relay.w.number, f->batch.nevents, f->batch.nevents),
					 errdetail("The worker was stalled for longer than obx.lease_timeout; another worker re-sends them.")));
			obx_kafka_purge(relay.producer);
		}
		f->renew_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
												  obx_lease_timeout_s * 1000L / 3);
	}
}

/*
 * Whether to stop waiting for the flights: at once on a change of Kafka
 * settings, after obx.shutdown_timeout when stopping.
 */
static bool
give_up_flights(void)
{
	if (relay.rebuild_producer)
		return true;
	if (!ShutdownRequestPending)
		return false;
	if (relay.give_up_at == 0)
		relay.give_up_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
													   obx_shutdown_timeout_ms);
	else if (GetCurrentTimestamp() >= relay.give_up_at)
		return true;
	return false;
}

/*
 * serve_flights
 *		Wait a little for delivery reports, renew leases, then record every
 *		flight whose reports are all in; or give the flights up (released,
 *		re-sent later) when give_up_flights says so.
 */
static void
serve_flights(void)
{
	bool all_done = true;
	int i;

	wait_for_reports();
	if (ShutdownRequestPending)
		set_state(OBX_STATE_STOPPING);
	else if (obx_kafka_brokers_down(relay.producer))
		set_state(OBX_STATE_BROKER_DOWN);
	else
		set_state(OBX_STATE_PRODUCING);
	if (give_up_flights())
	{
		abandon_flights();
		return;
	}
	renew_leases();
	for (i = 0; i < OBX_PIPELINE; i++)
		if (relay.flights[i].used && relay.flights[i].batch.in_flight == 0)
			land_flight(&relay.flights[i]);
		else if (relay.flights[i].used)
			all_done = false;

	if (all_done && relay.producer != NULL && obx_kafka_broken(relay.producer))
		drop_producer();
}

/*
 * What an idle worker is waiting for: brokers to come back, failed events'
 * backoff to pass (only while events this worker failed wait for their
 * retry: not after a failure that quarantined them, and not forever once
 * another worker has taken the retry over), or new events.
 */
static ObxWorkerState
idle_state(void)
{
	if (obx_kafka_brokers_down(relay.producer))
		return OBX_STATE_BROKER_DOWN;
	if (GetCurrentTimestamp() < relay.backoff_until)
		return OBX_STATE_BACKING_OFF;
	return OBX_STATE_IDLE;
}

/* Nothing in flight: wait for a commit's wake-up or the next poll. */
static void
idle_wait(void)
{
	set_state(idle_state());
	wait_for_work(Max(1, Min(obx_poll_interval_ms, obx_ms_until(relay.next_poll))));
}

/*
 * Whether obx is installed and the worker runs as obx.worker_role.  Until
 * then, wait a poll interval.
 */
static bool
relay_ready(void)
{
	if (relay.ready)
		return true;
	if (!obx_worker_extension_ready(&relay.w))
	{
		if (relay.w.role_problem != NULL)
		{
			set_state(OBX_STATE_WAITING_FOR_ROLE);
			obx_status_error(relay.w.number, relay.w.role_problem);
		}
		else
			set_state(OBX_STATE_WAITING_FOR_EXTENSION);
		wait_for_work(obx_poll_interval_ms);
		return false;
	}
	relay.ready = true;
	return true;
}

/* Read obx._replica_problem again when due; say its reason in obx.workers too. */
static void
check_replica(void)
{
	if (obx_worker_check_replica(&relay.w, "claims nothing",
								 "The events there are copies, published by the relay of the "
								 "database they come from."))
		obx_status_error(relay.w.number, relay.w.replica_problem);
}

/*
 * Whether the relay may claim, release and purge in this database: not
 * while a logical subscription writes into obx's tables
 * (obx._replica_problem, checked every OBX_REPLICA_CHECK_MS).  Meanwhile
 * the batches already out are recorded, and the worker shows state
 * "logical replica" with the reason as its last_error.  The first time it
 * may, release the leases this worker's previous run held, so those events
 * are re-sent at once.
 */
static bool
replica_guard(void)
{
	int64 released;

	check_replica();
	if (relay.w.replica_problem != NULL)
	{
		if (relay.nflights > 0)
			serve_flights();
		else
		{
			set_state(OBX_STATE_LOGICAL_REPLICA);
			wait_for_work(Max(1, Min(obx_poll_interval_ms, obx_ms_until(relay.w.next_replica_check))));
		}
		return false;
	}
	if (relay.orphans_released)
		return true;
	relay.orphans_released = true;
	released = obx_outbox_release_orphans(relay.w.number);
	if (released > 0)
		ereport(LOG,
				(errmsg("obx relay %d released %lld events leased by its previous run",
						relay.w.number, (long long) released),
				 errdetail("They are re-sent with the same event ids.")));
	return true;
}

/*
 * Whether there is a producer to claim for.  New Kafka settings: build
 * the next batch's producer from them, once the batches in flight are
 * given up.  A producer that cannot be built is tried again after
 * OBX_PRODUCER_RETRY_MS.
 */
static bool
producer_ready(void)
{
	char errbuf[512];

	if (relay.rebuild_producer && relay.producer != NULL && relay.nflights == 0)
		drop_producer();
	if (relay.producer != NULL)
		return true;
	if (GetCurrentTimestamp() < relay.next_producer_try)
	{
		wait_for_work(obx_ms_until(relay.next_producer_try));
		return false;
	}
	relay.producer = obx_kafka_create(relay.w.number, errbuf, sizeof(errbuf));
	relay.rebuild_producer = false;
	if (relay.producer != NULL)
	{
		obx_worker_watch_fd(&relay.w, obx_kafka_event_fd(relay.producer));
		return true;
	}
	obx_worker_watch_fd(&relay.w, PGINVALID_SOCKET);
	ereport(WARNING,
			(errcode(ERRCODE_CONFIG_FILE_ERROR),
			 errmsg("obx relay %d could not create a Kafka producer: %s",
					relay.w.number, errbuf),
			 errhint("Check obx.brokers and obx.kafka_properties, then reload.")));
	obx_status_error(relay.w.number, errbuf);
	set_state(OBX_STATE_BROKER_DOWN);
	relay.next_producer_try = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
														  OBX_PRODUCER_RETRY_MS);
	return false;
}

/*
 * A full batch means a backlog, which the statistics the relay's
 * statements are planned from may not have seen yet.  Worker 0 refreshes
 * them for all, at most every OBX_ANALYZE_INTERVAL_MS (an ANALYZE of a
 * large backlog costs as much as several batches).
 */
static void
analyze_backlog(Flight *launched)
{
	if (relay.w.local != 0 || !launched->batch.full ||
		GetCurrentTimestamp() < relay.next_analyze)
		return;
	obx_outbox_analyze();
	relay.next_analyze = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
													 OBX_ANALYZE_INTERVAL_MS);
}

/*
 * Start-up beyond the base: the worker's status slot, its loop memory,
 * and the TOAST compression of the rows it writes (OBX_TOAST_COMPRESSION).
 */
static void
relay_start(Datum main_arg)
{
	obx_worker_start(&relay.w, OBX_WORKER_RELAY, main_arg);
	attach_slot();
	relay.loop_cxt = AllocSetContextCreate(TopMemoryContext, "obx relay loop",
										   ALLOCSET_DEFAULT_SIZES);
#ifdef USE_LZ4
	SetConfigOption("default_toast_compression", OBX_TOAST_COMPRESSION, PGC_USERSET,
					PGC_S_OVERRIDE);
#endif
}

/*
 * obx_relay_main
 *		Entry point of relay worker number main_arg.  Each pass of the loop
 *		is a list of steps; a step that has to wait waits and starts the
 *		next pass.
 */
void
obx_relay_main(Datum main_arg)
{
	relay_start(main_arg);

	while (!ShutdownRequestPending || relay.nflights > 0)
	{
		Flight *launched;

		MemoryContextSwitchTo(relay.loop_cxt);
		MemoryContextReset(relay.loop_cxt);
		relay_reload();

		if (ShutdownRequestPending)
		{
			/* Stopping: no new claims, only the flights still out. */
			serve_flights();
			continue;
		}
		if (RecoveryInProgress())
		{
			set_state(OBX_STATE_STANDBY);
			wait_for_work(obx_poll_interval_ms);
			continue;
		}
		if (!relay_ready() || !replica_guard())
			continue;
		obx_housekeeping(&relay.w);
		if (!producer_ready())
			continue;

		/* Keep the pipeline full: claim while earlier batches are out. */
		launched = launch_flight();
		if (relay.nflights == 0)
		{
			idle_wait();
			continue;
		}
		if (launched != NULL)
		{
			analyze_backlog(launched);
			if (relay.nflights < OBX_PIPELINE)
				continue;
		}
		serve_flights();
	}

	set_state(OBX_STATE_STOPPING);
	drop_producer();
	obx_worker_exit(&relay.w);
}
