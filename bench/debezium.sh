# bench/debezium.sh: sourced by bench/run.  Benchmark 7, obx beside
# Debezium (issues 27 and 58); with KAFKA=real only.
#
# Debezium 3.6.1's PostgreSQL connector (pgoutput, a logical replication
# slot) with its outbox EventRouter, in Kafka Connect standalone 4.3
# (tools/debezium/pom.xml, fetched by obx_install_debezium), and obx's
# relay with its defaults, one publisher at a time, on the same server and
# the same 3-node cluster (topics of DEBEZIUM_PARTITIONS, 6, partitions,
# RF 3, min.insync.replicas 2, LogAppendTime).  The server runs with
# wal_level = logical throughout, for both (Debezium needs it; obx does
# not).  Debezium as its best users tune it for latency: poll.interval.ms
# 10 (its default, 500, adds ~0.5 s to every event: issue 58 measured p99
# 817-941 ms), Connect's producer with acks=all and idempotence, its
# other producer settings Connect's defaults, offset.flush.interval.ms
# DEBEZIUM_OFFSET_FLUSH_MS (10,000, as Connect's standalone example).
# The application's transaction, on both sides, inserts an order row
# (bench.orders) and writes its event (~200-byte payload, 10,000 keys):
# obx.enqueue, or an INSERT into Debezium's outbox (bench.dbz_outbox, the
# columns EventRouter reads by default), which EventRouter routes by
# aggregatetype to a topic.
#
# The brokers are warm before the first round (bench/lib.sh,
# brokers_warm_up).  DEBEZIUM_RUNS (3) rounds; in each, both publishers
# in turn (obx first in odd rounds, Debezium first in even ones), each
# doing:
# 1. Drain: DEBEZIUM_EVENTS (100,000) events committed in one statement
#    while the publisher is stopped (obx: obx.workers = 0; Debezium:
#    Connect stopped, its slot kept), then the publisher started.  The
#    drain time is the span of the events' broker append times
#    (LogAppendTime), first to last, so that neither's start-up counts.
#    CPU per 1,000 events: obx's relay workers; Debezium's Connect JVM and
#    its walsender, from the moment it streams.
# 2. Warm-up: DEBEZIUM_WARMUP_SECONDS (10) at 2,000 events/s, not
#    measured (the JVM compiles its hot code; obx's producers learn the
#    topic), until all of it is published.
# 3. Latency: at each rate of DEBEZIUM_RATES ("500 2000"), one event per
#    transaction by pgbench --rate, DEBEZIUM_CLIENTS (4) clients, for
#    DEBEZIUM_SECONDS (20): commit -> broker append (LogAppendTime), commit
#    times from track_commit_timestamp; and from the load's start until
#    all is published, the CPU per 1,000 events of the brokers (all three
#    JVMs) and of the publisher.
# 4. The application's throughput: pgbench at full speed, DEBEZIUM_CLIENTS
#    clients for DEBEZIUM_TPS_SECONDS (15), the publisher running, then
#    (after it caught up) stopped.
# Each run's figures are printed, then their medians and the targets of
# issue 58.
#
# Unlike issue 58's own measurement: the brokers are Kafka
# $OBX_KAFKA_VERSION (tools/kafka-cluster's), not 4.3.0 (Connect's client
# jars are 4.3.0).

dbz_base=("wal_level = logical" "listen_addresses = '127.0.0.1'" "track_commit_timestamp = on")
dbz_pid=""
declare -A vs

bench_debezium()
{
	echo
	if [ -z "$kafka_dir" ]; then
		echo "== 7. obx beside Debezium: skipped (KAFKA=real bench/run debezium: Debezium publishes to a real cluster)"
		return 0
	fi
	obx_install_debezium >&2
	local runs=${DEBEZIUM_RUNS:-3} rates=${DEBEZIUM_RATES:-500 2000} run side rate
	echo "== 7. obx beside Debezium $OBX_DEBEZIUM_VERSION (Kafka Connect standalone, poll.interval.ms 10), wal_level = logical for both, $runs rounds (load average $(machine_load))"

	local topics=(bench.vs.obx.warm bench.vs.dbz.warm bench.vs.obx.tps bench.vs.dbz.tps)
	for rate in $rates; do
		topics+=("bench.vs.obx.r$rate" "bench.vs.dbz.r$rate")
	done
	for ((run = 1; run <= runs; run++)); do
		topics+=("bench.vs.obx.drain$run" "bench.vs.dbz.drain$run")
	done
	bench_partitions=${DEBEZIUM_PARTITIONS:-6} bench_topic "${topics[@]}"

	# Debezium's slot, made by its first start, before any event is written.
	pg_phase "${dbz_base[@]}" "obx.workers = 0"
	reset_outbox
	sql -q -c "TRUNCATE bench.dbz_outbox, bench.orders" >/dev/null
	dbz_start || return 1
	dbz_stop

	for ((run = 1; run <= runs; run++)); do
		if ((run % 2)); then
			vs_obx "$run" && vs_dbz "$run" || return 1
		else
			vs_dbz "$run" && vs_obx "$run" || return 1
		fi
	done
	vs_report "$runs" "$rates"
}

# vs_obx RUN: obx's round RUN (drain, warm-up, latency, throughput).
vs_obx()
{
	local run=$1 n=${DEBEZIUM_EVENTS:-100000} rate seq0
	pg_phase "${dbz_base[@]}" "obx.workers = 0"
	reset_outbox
	sql -q -c "SELECT setseed(0.42)" -c "
		SELECT count(obx.enqueue('bench.vs.obx.drain$run', 'cus_' || lpad(k::text, 5, '0'), bench.make_payload(i, k)))
		  FROM (SELECT i, floor(random() * 10000)::int AS k FROM generate_series(1, $n) i) s" >/dev/null
	pg_phase "${dbz_base[@]}"
	settle_relay 600 >/dev/null || return 1
	vs[obx,drain_cpu,$run]=$(per_k "$(cpu_ms $(relay_pids))" "$n")
	vs[obx,drain_rate,$run]=$(calc "$n / $(append_span "bench.vs.obx.drain$run")" 0)

	vs_script obx warm
	vs_load obx warm 2000 "${DEBEZIUM_WARMUP_SECONDS:-10}" >/dev/null || return 1
	settle_relay 120 >/dev/null || return 1
	for rate in $rates; do
		vs_script obx "r$rate"
		seq0=$(sql_value "$last_seq_sql")
		vs_measure obx "$run" "$rate" "bench.vs.obx.r$rate" "
			SELECT id, $payload_committed AS committed
			  FROM obx.events WHERE topic = 'bench.vs.obx.r$rate' AND seq > $seq0" || return 1
	done

	vs_script obx tps
	vs[obx,tps_on,$run]=$(vs_tps obx) || return 1
	vs[obx,backlog,$run]=$(sql_value "$pending_sql")
	settle_relay 600 >/dev/null || return 1
	pg_phase "${dbz_base[@]}" "obx.workers = 0"
	vs[obx,tps_off,$run]=$(vs_tps obx) || return 1
	echo "round $run, obx: drain ${vs[obx,drain_rate,$run]} events/s (${vs[obx,drain_cpu,$run]} ms CPU per 1,000); tps ${vs[obx,tps_on,$run]} with the relay running (backlog ${vs[obx,backlog,$run]}), ${vs[obx,tps_off,$run]} with it stopped"
}

# vs_dbz RUN: Debezium's round RUN, the same steps.  obx's relay is paused
# throughout, and Connect stopped at the end.
vs_dbz()
{
	local run=$1 n=${DEBEZIUM_EVENTS:-100000} rate n0 c0
	pg_phase "${dbz_base[@]}" "obx.workers = 0"
	sql -q -c "SELECT setseed(0.42)" -c "
		INSERT INTO bench.dbz_outbox (id, aggregatetype, aggregateid, type, payload)
		SELECT gen_random_uuid(), 'drain$run', 'cus_' || lpad(k::text, 5, '0'), 'OrderPlaced', bench.make_payload(i, k)
		  FROM (SELECT i, floor(random() * 10000)::int AS k FROM generate_series(1, $n) i) s" >/dev/null
	dbz_start || return 1
	c0=$(cpu_ms $(dbz_pids))
	wait_for 600 "Debezium's drain of $n events" topic_holds "bench.vs.dbz.drain$run" "$n" || return 1
	vs[dbz,drain_cpu,$run]=$(per_k "$(($(cpu_ms $(dbz_pids)) - c0))" "$n")
	vs[dbz,drain_rate,$run]=$(calc "$n / $(append_span "bench.vs.dbz.drain$run")" 0)

	vs_script dbz warm
	vs_load dbz warm 2000 "${DEBEZIUM_WARMUP_SECONDS:-10}" >/dev/null || return 1
	wait_for 120 "Debezium to publish the warm-up" dbz_caught_up warm || return 1
	for rate in $rates; do
		vs_script dbz "r$rate"
		n0=$(sql_value "SELECT coalesce(max(n), 0) FROM bench.dbz_outbox")
		vs_measure dbz "$run" "$rate" "bench.vs.dbz.r$rate" "
			SELECT id, $payload_committed AS committed
			  FROM bench.dbz_outbox WHERE aggregatetype = 'r$rate' AND n > $n0" || return 1
	done

	vs_script dbz tps
	vs[dbz,tps_on,$run]=$(vs_tps dbz) || return 1
	vs[dbz,backlog,$run]=$(dbz_backlog tps)
	wait_for 600 "Debezium to publish its backlog" dbz_caught_up tps || return 1
	dbz_stop
	vs[dbz,tps_off,$run]=$(vs_tps dbz) || return 1
	echo "round $run, Debezium: drain ${vs[dbz,drain_rate,$run]} events/s (${vs[dbz,drain_cpu,$run]} ms CPU per 1,000); tps ${vs[dbz,tps_on,$run]} with Connect running (backlog ${vs[dbz,backlog,$run]}), ${vs[dbz,tps_off,$run]} with it stopped"
}

# vs_script obx|dbz ROUTE: the application's transaction into
# $work/vs_SIDE_ROUTE.sql: obx's events to topic bench.vs.obx.ROUTE,
# Debezium's with aggregatetype ROUTE (topic bench.vs.dbz.ROUTE).
vs_script()
{
	local f=$work/vs_$1_$2.sql
	sed -e "s/TOPIC/bench.vs.obx.$2/" -e "s/ROUTE/$2/" "$here/pgbench/order_$1.sql" >"$f"
	chmod 644 "$f"
}

# vs_load obx|dbz ROUTE RATE SECONDS: the application's transaction at RATE.
vs_load()
{
	local clients=${DEBEZIUM_CLIENTS:-4}
	run_pgbench -c "$clients" -j "$(pgbench_threads "$clients")" -R "$3" -T "$4" -M prepared \
		-f "$work/vs_$1_$2.sql" >"$work/vs_$1_$2.log" 2>&1 || {
		cat "$work/vs_$1_$2.log" >&2
		return 1
	}
}

# vs_tps obx|dbz: the application's tps at full speed (DEBEZIUM_CLIENTS
# clients for DEBEZIUM_TPS_SECONDS) with the side's transaction.
vs_tps()
{
	full_speed "$work/vs_$1_tps.sql" "${DEBEZIUM_CLIENTS:-4}" "${DEBEZIUM_TPS_SECONDS:-15}"
}

# vs_measure obx|dbz RUN RATE TOPIC COMMITS_SQL: one latency run at RATE,
# from the load's start until its events are all published: commit ->
# broker append over the events COMMITS_SQL lists, the brokers' and the
# publisher's CPU per 1,000 events.
vs_measure()
{
	local side=$1 run=$2 rate=$3 topic=$4 commits=$5 route=r$3
	local secs=${DEBEZIUM_SECONDS:-20} b0 p0 b1 p1 events
	b0=$(cpu_ms $(broker_pids))
	p0=$(cpu_ms $(vs_pids "$side"))
	vs_load "$side" "$route" "$rate" "$secs" || return 1
	if [ "$side" = obx ]; then
		settle_relay 120 >/dev/null || true
	else
		wait_for 120 "Debezium to publish the run's events" dbz_caught_up "$route" || true
	fi
	p1=$(cpu_ms $(vs_pids "$side"))
	b1=$(cpu_ms $(broker_pids))
	local events matched p50 p99 max
	read -r events matched p50 p99 max <<<"$(latency_stats "$topic" "$commits")"
	vs[$side,p50,$rate,$run]=$p50
	vs[$side,p99,$rate,$run]=$p99
	vs[$side,brokers,$rate,$run]=$(per_k "$((b1 - b0))" "$events")
	vs[$side,cpu,$rate,$run]=$(per_k "$((p1 - p0))" "$events")
	echo "round $run, $(vs_name "$side") at $rate/s: $events events ($matched read back), commit -> append p50 $p50 ms, p99 $p99 ms, max $max ms; CPU per 1,000 events: brokers ${vs[$side,brokers,$rate,$run]} ms, publisher ${vs[$side,cpu,$rate,$run]} ms"
}

# vs_pids obx|dbz: the publisher's processes: obx's relay workers, or
# Connect's JVM and its walsender.
vs_pids()
{
	if [ "$1" = obx ]; then relay_pids; else dbz_pids; fi
}

vs_name()
{
	if [ "$1" = obx ]; then echo "obx"; else echo "Debezium"; fi
}

# vs_report RUNS RATES: the medians, each run's figures beside them, and
# issue 58's targets.
vs_report()
{
	local runs=$1 rates=$2 side rate m k
	# vs_med KEY: "median (run1/run2/...)" of vs[KEY,RUN].
	vs_med()
	{
		local r v=()
		for ((r = 1; r <= runs; r++)); do v+=("${vs[$1,$r]}"); done
		local IFS=/
		echo "$(median "${v[@]}") (${v[*]})"
	}
	vs_m()
	{
		vs_med "$1" | cut -d' ' -f1
	}
	echo
	echo "Medians of $runs rounds (each round's figure in brackets, in round order)"
	{
		echo "measure | obx (defaults) | Debezium (poll.interval.ms 10) | obx / Debezium"
		echo "drain of ${DEBEZIUM_EVENTS:-100000}, events/s | $(vs_med obx,drain_rate) | $(vs_med dbz,drain_rate) | $(ratio "$(vs_m obx,drain_rate)" "$(vs_m dbz,drain_rate)")"
		echo "publisher CPU per 1,000 events in the drain, ms | $(vs_med obx,drain_cpu) | $(vs_med dbz,drain_cpu) | $(ratio "$(vs_m obx,drain_cpu)" "$(vs_m dbz,drain_cpu)")"
		for rate in $rates; do
			for k in p50 p99; do
				echo "$k commit -> LogAppendTime at $rate/s, ms | $(vs_med obx,$k,$rate) | $(vs_med dbz,$k,$rate) | $(ratio "$(vs_m obx,$k,$rate)" "$(vs_m dbz,$k,$rate)")"
			done
			echo "brokers' CPU per 1,000 events at $rate/s, ms | $(vs_med obx,brokers,$rate) | $(vs_med dbz,brokers,$rate) | $(ratio "$(vs_m obx,brokers,$rate)" "$(vs_m dbz,brokers,$rate)")"
			echo "publisher CPU per 1,000 events at $rate/s, ms | $(vs_med obx,cpu,$rate) | $(vs_med dbz,cpu,$rate) | $(ratio "$(vs_m obx,cpu,$rate)" "$(vs_m dbz,cpu,$rate)")"
		done
		echo "the application's tps, publisher running | $(vs_med obx,tps_on) | $(vs_med dbz,tps_on) | $(ratio "$(vs_m obx,tps_on)" "$(vs_m dbz,tps_on)")"
		echo "the same, publisher stopped | $(vs_med obx,tps_off) | $(vs_med dbz,tps_off) | $(ratio "$(vs_m obx,tps_off)" "$(vs_m dbz,tps_off)")"
	} | table
	local a b
	echo "targets (issue 58):"
	a=$(vs_m obx,drain_rate) b=$(vs_m dbz,drain_rate)
	echo "  drain ≥ 3 × Debezium's: $(ratio "$a" "$b")× — $(verdict "$(awk -v a="$a" -v b="$b" 'BEGIN { print (a >= 3 * b) }')")"
	for rate in $rates; do
		a=$(vs_m obx,p99,$rate) b=$(vs_m dbz,p99,$rate)
		echo "  p99 at $rate/s ≤ Debezium's: $a / $b ms — $(verdict "$(awk -v a="$a" -v b="$b" 'BEGIN { print (a <= b) }')")"
		a=$(vs_m obx,brokers,$rate) b=$(vs_m dbz,brokers,$rate)
		echo "  brokers' CPU per event at $rate/s ≤ Debezium's: $a / $b ms per 1,000 — $(verdict "$(awk -v a="$a" -v b="$b" 'BEGIN { print (a <= b) }')")"
	done
	a=$(vs_m obx,tps_on) b=$(vs_m dbz,tps_on)
	echo "  the application's tps with the publisher running ≥ with Debezium's: $a / $b — $(verdict "$(awk -v a="$a" -v b="$b" 'BEGIN { print (a >= b) }')")"
	a=$(vs_m obx,tps_off) b=$(vs_m dbz,tps_off)
	echo "  obx's transaction costs ≤ 1.05 × Debezium's, publishers stopped (tps ratio Debezium / obx): $(ratio "$b" "$a")× — $(verdict "$(awk -v a="$a" -v b="$b" 'BEGIN { print (b <= 1.05 * a) }')")"
	return 0
}

# dbz_start: Kafka Connect standalone with Debezium's connector
# (poll.interval.ms DEBEZIUM_POLL_MS, 10), its offsets in $work/dbz;
# returns once the connector streams from its slot.
dbz_start()
{
	local poll=${DEBEZIUM_POLL_MS:-10} dir=$work/dbz
	mkdir -p "$dir"
	cat >"$dir/worker.properties" <<EOF
bootstrap.servers=$brokers
key.converter=org.apache.kafka.connect.storage.StringConverter
value.converter=org.apache.kafka.connect.storage.StringConverter
offset.storage.file.filename=$dir/offsets
offset.flush.interval.ms=${DEBEZIUM_OFFSET_FLUSH_MS:-10000}
listeners=http://127.0.0.1:$((port + 1))
producer.acks=all
producer.enable.idempotence=true
EOF
	cat >"$dir/connector.properties" <<EOF
name=bench-outbox
connector.class=io.debezium.connector.postgresql.PostgresConnector
tasks.max=1
database.hostname=127.0.0.1
database.port=$port
database.user=postgres
database.password=
database.dbname=bench
topic.prefix=bench
plugin.name=pgoutput
slot.name=bench_dbz
publication.name=bench_dbz
publication.autocreate.mode=filtered
table.include.list=bench.dbz_outbox
snapshot.mode=no_data
poll.interval.ms=$poll
transforms=outbox
transforms.outbox.type=io.debezium.transforms.outbox.EventRouter
transforms.outbox.route.topic.replacement=bench.vs.dbz.\${routedByValue}
transforms.outbox.table.fields.additional.placement=id:header:event_id
EOF
	cat >"$dir/log4j.properties" <<EOF
log4j.rootLogger=INFO, file
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File=$dir/connect.log
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
EOF
	: >"$dir/connect.log"
	java -Dlog4j.configuration="file:$dir/log4j.properties" -cp "$OBX_DEBEZIUM_LIBS/*" \
		org.apache.kafka.connect.cli.ConnectStandalone "$dir/worker.properties" "$dir/connector.properties" \
		>"$dir/stdout.log" 2>&1 &
	dbz_pid=$!
	bench_jobs="$bench_jobs $dbz_pid"
	wait_for 180 "Debezium to stream from its slot" dbz_streaming || {
		tail -20 "$dir/connect.log" "$dir/stdout.log" >&2
		return 1
	}
}

dbz_streaming()
{
	kill -0 "$dbz_pid" && grep -q "Processing messages" "$work/dbz/connect.log" &&
		[ "$(sql_value "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'bench_dbz' AND active")" = 1 ]
}

# dbz_stop: stop Connect as its service would (SIGTERM: it commits its
# offsets and closes the slot's connection) and wait until the slot is free.
dbz_stop()
{
	[ -n "$dbz_pid" ] || return 0
	kill "$dbz_pid" 2>/dev/null || true
	wait "$dbz_pid" 2>/dev/null || true
	dbz_pid=""
	wait_for 60 "Debezium's slot to be released" dbz_slot_released
}

# dbz_slot_released: whether no session holds Debezium's slot (read again
# at each call: a condition for wait_for).
dbz_slot_released()
{
	[ "$(sql_value "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'bench_dbz' AND active")" = 0 ]
}

# dbz_pids: Connect's JVM and the walsender that decodes for it.
dbz_pids()
{
	echo "$dbz_pid" $(sql_value "SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'bench_dbz'")
}

# dbz_backlog ROUTE: the rows of Debezium's outbox with aggregatetype
# ROUTE that its topic does not hold yet.
dbz_backlog()
{
	echo $(($(sql_value "SELECT count(*) FROM bench.dbz_outbox WHERE aggregatetype = '$1'") - $(topic_count "bench.vs.dbz.$1")))
}

# dbz_caught_up ROUTE: whether Debezium has published every row of ROUTE
# (read again at each call: a condition for wait_for).
dbz_caught_up()
{
	[ "$(dbz_backlog "$1")" -le 0 ]
}

# topic_count TOPIC: how many messages the topic's partitions hold (the
# DEBEZIUM_PARTITIONS that bench_debezium made).
topic_count()
{
	local t=$1 p args=()
	for ((p = 0; p < ${DEBEZIUM_PARTITIONS:-6}; p++)); do
		args+=(-t "$t:$p:-1")
	done
	kcat -Q -b "$brokers" "${args[@]}" 2>/dev/null | awk '{ s += $4 } END { print s + 0 }'
}

# topic_holds TOPIC N: the topic holds at least N messages.
topic_holds()
{
	[ "$(topic_count "$1")" -ge "$2" ]
}

# append_span TOPIC: seconds from the first broker append time of the
# topic's messages to the last.
append_span()
{
	kcat -C -b "$brokers" -t "$1" -o beginning -e -q -f '%T\n' 2>/dev/null |
		awk 'NR == 1 { lo = $1; hi = $1 } { if ($1 < lo) lo = $1; if ($1 > hi) hi = $1 }
			END { printf "%.2f", (hi - lo) / 1000 }'
}

# full_speed SCRIPT CLIENTS SECONDS: pgbench's tps with SCRIPT.
full_speed()
{
	local out
	out=$(run_pgbench -c "$2" -j "$(pgbench_threads "$2")" -T "$3" -M prepared -f "$1" 2>&1) || {
		echo "$out" >&2
		return 1
	}
	calc "$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$out")" 0
}

# latency_stats TOPIC COMMITS_SQL: read TOPIC back and print "EVENTS
# MATCHED P50 P99 MAX", commit -> broker append in ms over the events
# COMMITS_SQL lists (id, commit time); an event not read back counts as
# infinitely late.
latency_stats()
{
	local topic=$1 commits=$2
	kcat -C -b "$brokers" -t "$topic" -o beginning -e -q -f '%T\t%h\n' >"$work/vs_$topic.tsv" 2>/dev/null || true
	chmod 644 "$work/vs_$topic.tsv"
	sql -tA -F' ' -P null=- -c "CREATE TEMP TABLE k (ts_ms bigint, headers text)" \
		-c "\\copy k FROM '$work/vs_$topic.tsv'" -c "
		WITH c AS ($commits),
		kk AS (SELECT substring(headers FROM 'event_id=([0-9a-f-]{36})')::uuid AS id, min(ts_ms) AS ts_ms
				 FROM k GROUP BY 1),
		l AS (SELECT coalesce(kk.ts_ms - extract(epoch FROM c.committed) * 1000, 'Infinity') AS ms
				FROM c LEFT JOIN kk USING (id))
		SELECT count(*), count(*) FILTER (WHERE ms < 'Infinity'),
			   round(percentile_disc(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 1),
			   round(percentile_disc(0.99) WITHIN GROUP (ORDER BY ms)::numeric, 1),
			   round(max(ms)::numeric, 1)
		  FROM l" | tail -1
}
