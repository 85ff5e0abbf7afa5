# bench/drain.sh: sourced by bench/run.  Benchmark 1, drain rate.
#
# DRAIN_EVENTS events (~180-byte payloads, 10,000 keys drawn at random) are
# enqueued while the relay is paused (obx.workers = 0).  Then, on the same
# rows:
#   - UPDATE baseline: a copy of the pending rows is marked published by a
#     plpgsql loop of one UPDATE ... FROM unnest(ids) per obx.batch_size
#     rows in seq order, one commit per batch (bench.mark_published_baseline);
#   - the insert-only bound: bench.insert_only_ceiling reads the same
#     events in batches of obx.batch_size in seq order, payloads as text,
#     and writes one record row per batch, one commit each: no lease, no
#     per-key order, no check of what is published or in flight, no Kafka;
#   - librdkafka baseline: bench/produce_baseline produces the same
#     messages (key, payload, event_id header) to the same stand-in with
#     obx's producer settings, and waits for every delivery report;
#   - obx: the server restarts with obx's defaults (one relay worker); the
#     time runs from the relay workers' start (obx.workers.started_at) to
#     the first 50 ms poll that finds every event published.
#
# The outbox is analyzed before the drain (as autovacuum would have done
# during a long outage).  DRAIN_STALE_STATS=1 instead starts from an outbox
# of published rows analyzed before the backlog built up, and does not
# analyze it again: recovery from a backlog the statistics have not seen.

bench_drain()
{
	local n=${DRAIN_EVENTS:-200000}
	local timeout=${DRAIN_TIMEOUT:-900}
	local batch enqueue_s avg_len

	echo
	echo "== 1. drain rate: $n events enqueued with the relay paused, then published (load average $(machine_load))"

	bench_topic bench.drain bench.drain.librdkafka
	pg_phase "obx.workers = 0"
	if [ "${DRAIN_STALE_STATS:-0}" = 1 ]; then
		# The outbox as production has it before an outage: published rows,
		# analyzed with nothing pending.  The backlog then builds up unseen
		# by the statistics.
		reset_outbox
		echo "DRAIN_STALE_STATS=1: the outbox holds ${BENCH_SEED_ROWS:-50000} published rows, analyzed before the backlog; not analyzed again before the drain"
	else
		sql -c "TRUNCATE obx.events, obx.claims, obx.records, obx.renewals, obx.event_states, bench.plain_outbox"
	fi
	sql -c "DROP TABLE IF EXISTS bench.update_baseline" -c "DELETE FROM bench.result" >/dev/null 2>&1
	batch=$(sql_value "SHOW obx.batch_size")

	enqueue_s=$(sql -tA -c "SELECT setseed(0.42)" -c "
		CREATE TEMP TABLE t AS SELECT clock_timestamp() AS t0;
		SELECT count(obx.enqueue('bench.drain', 'cus_' || lpad(k::text, 5, '0'), bench.make_payload(i, k)))
		  FROM (SELECT i, floor(random() * 10000)::int AS k FROM generate_series(1, $n) i) s;
		SELECT round(extract(epoch FROM clock_timestamp() - t0)::numeric, 2) FROM t" | tail -1)
	avg_len=$(sql_value "SELECT round(avg(length(payload::text))) || ' bytes, ' || count(DISTINCT event_key) || ' keys' FROM obx.events WHERE topic = 'bench.drain'")
	echo "enqueued $n events in ${enqueue_s}s (one statement); payload as sent: $avg_len"

	# The same rows, for the two baselines.
	sql -c "CREATE TABLE bench.update_baseline (LIKE bench.plain_outbox INCLUDING ALL)" \
		-c "CALL bench.copy_storage_parameters('bench.update_baseline')" \
		-c "INSERT INTO bench.update_baseline (id, seq, aggregate_id, topic, event_key, event_type, headers, payload, occurred_at) SELECT id, seq, aggregate_id, topic, event_key, event_type, headers, payload, occurred_at FROM obx.events WHERE topic = 'bench.drain' ORDER BY seq" \
		-c "\\copy (SELECT event_key, id, payload::text FROM obx.events WHERE topic = 'bench.drain' ORDER BY seq) TO '$work/messages.tsv'"
	if [ "${DRAIN_STALE_STATS:-0}" = 1 ]; then
		sql -c "VACUUM ANALYZE bench.update_baseline" -c "CHECKPOINT"
	else
		sql -c "VACUUM ANALYZE obx.events" -c "VACUUM ANALYZE bench.update_baseline" -c "CHECKPOINT"
	fi

	# Baseline 1: batched UPDATEs, no Kafka.  From a server just started,
	# as obx's run is (obx.workers takes effect at server start): the same
	# empty shared_buffers for both.
	pg_phase "obx.workers = 0"
	sql -c "CALL bench.mark_published_baseline($batch)"
	local upd_s
	upd_s=$(sql_value "SELECT seconds FROM bench.result WHERE name = 'update_baseline' AND events = $n")
	[ -n "$upd_s" ] || {
		echo "bench: the UPDATE baseline did not mark $n rows" >&2
		return 1
	}
	sql -c "CHECKPOINT"

	# Bound: the insert-only relay that checks nothing, no Kafka, from a
	# server just started too.
	pg_phase "obx.workers = 0"
	sql -c "CALL bench.insert_only_ceiling($batch, $(sql_value "SELECT min(seq) FROM obx.events WHERE topic = 'bench.drain'"))"
	local ceil_s
	ceil_s=$(sql_value "SELECT seconds FROM bench.result WHERE name = 'insert_only_ceiling' AND events = $n")
	[ -n "$ceil_s" ] || {
		echo "bench: the insert-only ceiling did not read $n events" >&2
		return 1
	}
	sql -c "TRUNCATE bench.ceiling_records" -c "CHECKPOINT"

	# Baseline 2: librdkafka alone, no database.
	local rk_out rk_s
	rk_out=$("$here/produce_baseline" -b "$brokers" -t bench.drain.librdkafka -f "$work/messages.tsv")
	rk_s=$(sed -n 's/.*seconds=\([0-9.]*\).*/\1/p' <<<"$rk_out")
	grep -q "delivered=$n failed=0" <<<"$rk_out" || {
		echo "bench: librdkafka baseline: $rk_out" >&2
		return 1
	}

	# obx: restart with the default relay and poll until nothing is pending.
	local broker0
	broker0=$(cpu_ms $(broker_pids))
	pg_phase
	statements_reset
	local t0 t_end line perf_pid=""
	if [ "${BENCH_PERF:-0}" = 1 ]; then
		# Until the drain ends; perf stops on SIGINT and writes its data.
		perf record -q -e cpu-clock -F 999 -g -o "$work/perf_drain.data" \
			-p "$(relay_pids | tr '\n' , | sed 's/,$//')" >/dev/null 2>&1 &
		perf_pid=$!
	fi
	t_end=$(drain_poll "$n" "$timeout") || {
		echo "bench: obx did not drain $n events within ${timeout}s; $(sql_value "$pending_sql") still pending" >&2
		return 1
	}
	if [ -n "$perf_pid" ]; then
		kill -INT "$perf_pid" 2>/dev/null || true
		wait "$perf_pid" || true
		perf_summary "$work/perf_drain.data" "the drain"
	fi
	# The relay workers' CPU since they started, the brokers' since the restart.
	drain_relay_per_k=$(per_k "$(cpu_ms $(relay_pids))" "$n")
	drain_broker_per_k=$(per_k "$(($(cpu_ms $(broker_pids)) - broker0))" "$n")
	t0=$(sql_value "SELECT extract(epoch FROM min(started_at)) FROM obx.workers")
	local obx_s relay_s
	obx_s=$(calc "$t_end - $t0" 3)
	relay_s=$(sql_value "SELECT round(extract(epoch FROM max(x.t))::numeric - $t0, 3) FROM obx.records r, unnest(r.published_at) AS x(t)")
	local check
	check=$(sql_value "SELECT count(*) || ' events recorded with a partition and offset, ' || count(DISTINCT (x.p, x.o)) || ' distinct places' FROM obx.records r, unnest(r.ids, r.partitions, r.offsets) AS x(id, p, o) JOIN obx.events e ON e.id = x.id WHERE e.topic = 'bench.drain'")

	local obx_rate upd_rate rk_rate ceil_rate
	obx_rate=$(calc "$n / $obx_s" 0)
	upd_rate=$(calc "$n / $upd_s" 0)
	rk_rate=$(calc "$n / $rk_s" 0)
	ceil_rate=$(calc "$n / $ceil_s" 0)

	{
		echo "measure | seconds | events/s | obx / measure (events/s)"
		echo "obx relay: workers start -> all published (50 ms poll) | $obx_s | $obx_rate | 1.00"
		echo "baseline: batched UPDATE ... FROM unnest, $batch rows/commit, no Kafka | $(calc "$upd_s" 3) | $upd_rate | $(calc "$obx_rate / $upd_rate")"
		echo "baseline: librdkafka alone (idempotent, acks=all), no database | $(calc "$rk_s" 3) | $rk_rate | $(calc "$obx_rate / $rk_rate")"
		echo "bound: an insert-only relay that checks nothing, one record row per batch, no Kafka | $(calc "$ceil_s" 3) | $ceil_rate | $(calc "$obx_rate / $ceil_rate")"
	} | table
	echo "obx check: $check; relay start -> last published_at: ${relay_s}s"
	echo "CPU per 1,000 events drained: relay workers $drain_relay_per_k ms$([ -n "$kafka_dir" ] && echo ", brokers $drain_broker_per_k ms")"
	local ratio
	ratio=$(calc "$obx_rate / $upd_rate")
	echo "target: obx drain ≥ 2x the UPDATE baseline (1.0's publish path, without Kafka): $(calc "$ratio")x — $(verdict "$(awk "BEGIN { print ($ratio >= 2.0) }")")"
	echo "what any relay could reach here, x the UPDATE baseline: $(calc "$rk_rate / $upd_rate")x with no database (librdkafka alone), $(calc "$ceil_rate / $upd_rate")x with no Kafka and no checks (the insert-only bound)"

	statements_print
	sql -c "DROP TABLE bench.update_baseline" >/dev/null
}

# drain_poll N TIMEOUT: poll every 50 ms until all N events are published;
# prints the server's clock (epoch seconds) at the poll that saw it.  The
# poll reads the relay's shared-memory counters (obx.workers, bumped after
# each batch's marking commits), which costs the server nothing; once they
# reach N, a count of the unpublished events (pending_sql) = 0
# confirms it (a re-sent event would count twice; then polling goes on).
drain_poll()
{
	local n=$1 timeout=$2
	local deadline=$((SECONDS + timeout))
	local poll_in poll_out poll_pid line count at seen pending
	coproc POLL { obx_as_postgres psql -X -qAt -h "$work" -p "$port" -U postgres -d bench 2>&1; }
	poll_pid=$POLL_PID
	poll_in=${POLL[1]}
	poll_out=${POLL[0]}
	bench_jobs="$bench_jobs $poll_pid"
	while [ $SECONDS -lt $deadline ]; do
		echo "SELECT coalesce(sum(published), 0), extract(epoch FROM clock_timestamp()) FROM obx.workers;" >&"$poll_in"
		read -r line <&"$poll_out"
		count=${line%%|*}
		at=${line##*|}
		if [ "$count" -ge "$n" ] 2>/dev/null; then
			seen=$at
			echo "$pending_sql;" >&"$poll_in"
			read -r pending <&"$poll_out"
			if [ "$pending" = 0 ]; then
				echo "$seen"
				exec {poll_in}>&-
				wait "$poll_pid" 2>/dev/null || true
				return 0
			fi
		fi
		sleep 0.05
	done
	exec {poll_in}>&-
	wait "$poll_pid" 2>/dev/null || true
	return 1
}
