# bench/debezium.sh: sourced by bench/run.  Benchmark 7, obx beside
# Debezium (issue 27); with KAFKA=real only.
#
# Debezium 3.6.1's PostgreSQL connector (pgoutput, a logical replication
# slot) with its outbox EventRouter, in Kafka Connect standalone 4.3
# (tools/debezium/pom.xml, fetched by obx_install_debezium), and obx's
# relay, one publisher at a time, on the same server and the same 3-node
# cluster.  The server runs with wal_level = logical throughout this
# benchmark, for both (Debezium needs it; obx does not).  Both produce with
# acks=all and idempotence; Connect's producer keeps its other defaults
# (Kafka 4.3's: linger.ms 5).  Debezium's outbox is bench.dbz_outbox, the
# columns EventRouter reads by default; the application's transaction
# inserts one row, with the same ~180-byte payload as obx's events, and
# EventRouter routes it by aggregatetype to a topic of its own.
#
# 1. Drain: DEBEZIUM_EVENTS (100,000) events committed in one statement
#    while the publisher is stopped (obx: obx.workers = 0; Debezium:
#    Connect stopped, its slot kept), then the publisher started.  The
#    drain time is the span of the events' broker append times
#    (LogAppendTime), first to last, so that neither's start-up counts.
#    CPU per 1,000 events: obx's relay workers; the Connect JVM from the
#    moment it streams (its start-up excluded as far as that goes).
# 2. Latency: at each rate of DEBEZIUM_RATES ("500 2000"), one event per
#    transaction by pgbench --rate (DEBEZIUM_LATENCY_CLIENTS, 16, as in
#    bench/latency.sh) for DEBEZIUM_SECONDS (20) after a 3 s
#    warm-up, commit -> broker append (LogAppendTime), as bench/latency.sh
#    measures it: obx with its defaults; Debezium at its defaults
#    (poll.interval.ms 500); Debezium with poll.interval.ms 10.
# 3. The application's throughput: pgbench at full speed, DEBEZIUM_CLIENTS
#    (4) clients for DEBEZIUM_TPS_SECONDS (15): obx.enqueue with the relay
#    running, then the INSERT into Debezium's outbox with Connect running
#    (poll.interval.ms 10), in turn for DEBEZIUM_TPS_ROUNDS (2) rounds,
#    each with the backlog its publisher left when the run ended; then each
#    with its publisher stopped.

dbz_base=("wal_level = logical" "listen_addresses = '127.0.0.1'" "track_commit_timestamp = on")
dbz_pid=""

bench_debezium()
{
	echo
	if [ -z "$kafka_dir" ]; then
		echo "== 7. obx beside Debezium: skipped (KAFKA=real bench/run debezium: Debezium publishes to a real cluster)"
		return 0
	fi
	obx_install_debezium >&2
	local n=${DEBEZIUM_EVENTS:-100000}
	local secs=${DEBEZIUM_SECONDS:-20}
	local rates=${DEBEZIUM_RATES:-500 2000}
	local clients=${DEBEZIUM_CLIENTS:-4}
	local lat_clients=${DEBEZIUM_LATENCY_CLIENTS:-16}
	local tps_secs=${DEBEZIUM_TPS_SECONDS:-15}
	echo "== 7. obx beside Debezium $OBX_DEBEZIUM_VERSION (Kafka Connect standalone), wal_level = logical for both (load average $(machine_load))"

	local topics=(bench.vs.obx.drain bench.vs.dbz.drain bench.vs.dbz.warm bench.vs.dbz.tps bench.enqueue) rate
	for rate in $rates; do
		topics+=("bench.vs.obx.r$rate" "bench.vs.dbz.p500.r$rate" "bench.vs.dbz.p10.r$rate")
	done
	bench_topic "${topics[@]}"

	# 1. Drains.
	pg_phase "${dbz_base[@]}" "obx.workers = 0"
	reset_outbox
	sql -q -c "TRUNCATE bench.dbz_outbox" -c "SELECT setseed(0.42)" -c "
		SELECT count(obx.enqueue('bench.vs.obx.drain', 'cus_' || lpad(k::text, 5, '0'), bench.make_payload(i, k)))
		  FROM (SELECT i, floor(random() * 10000)::int AS k FROM generate_series(1, $n) i) s" >/dev/null
	pg_phase "${dbz_base[@]}"
	settle_relay 600 >/dev/null || return 1
	local obx_cpu obx_span
	obx_cpu=$(per_k "$(cpu_ms $(relay_pids))" "$n")
	obx_span=$(append_span bench.vs.obx.drain)

	pg_phase "${dbz_base[@]}" "obx.workers = 0"
	dbz_start 500 || return 1
	sql -q -c "INSERT INTO bench.dbz_outbox (id, aggregatetype, aggregateid, type, payload)
		VALUES (gen_random_uuid(), 'warm', 'cus_00000', 'OrderPlaced', bench.make_payload(0, 0))"
	wait_for 120 "Debezium's first event at the broker" topic_holds bench.vs.dbz.warm 1 || return 1
	dbz_stop
	sql -q -c "SELECT setseed(0.42)" -c "
		INSERT INTO bench.dbz_outbox (id, aggregatetype, aggregateid, type, payload)
		SELECT gen_random_uuid(), 'drain', 'cus_' || lpad(k::text, 5, '0'), 'OrderPlaced', bench.make_payload(i, k)
		  FROM (SELECT i, floor(random() * 10000)::int AS k FROM generate_series(1, $n) i) s" >/dev/null
	dbz_start 500 || return 1
	local c0 dbz_cpu dbz_span
	c0=$(cpu_ms "$dbz_pid")
	wait_for 600 "Debezium's drain of $n events" topic_holds bench.vs.dbz.drain "$n" || return 1
	dbz_cpu=$(per_k "$(($(cpu_ms "$dbz_pid") - c0))" "$n")
	dbz_span=$(append_span bench.vs.dbz.drain)
	local obx_rate dbz_rate drain_ratio
	obx_rate=$(calc "$n / $obx_span" 0)
	dbz_rate=$(calc "$n / $dbz_span" 0)
	drain_ratio=$(ratio "$obx_rate" "$dbz_rate")
	{
		echo "publisher | first -> last broker append, s | events/s | CPU per 1,000 events, ms | obx / Debezium (events/s)"
		echo "obx relay (defaults) | $obx_span | $obx_rate | $obx_cpu | $drain_ratio"
		echo "Debezium (Connect JVM, from streaming on) | $dbz_span | $dbz_rate | $dbz_cpu | 1.00"
	} | table
	echo "target: obx drain ≥ 2 × Debezium's: ${drain_ratio}× — $(verdict "$(awk -v v="$drain_ratio" 'BEGIN { print (v >= 2) }')")"

	# 2. Latency: Debezium at its defaults (Connect runs with them now),
	# then with a short poll, then obx.
	local rows="" p99_obx="" p99_dbz10=""
	for rate in $rates; do
		rows="$rows
$(dbz_latency 500 "$rate" "$secs" "$lat_clients")"
	done
	dbz_stop
	dbz_start 10 || return 1
	for rate in $rates; do
		local line
		line=$(dbz_latency 10 "$rate" "$secs" "$lat_clients")
		rows="$rows
$line"
		[ "$rate" = 2000 ] && p99_dbz10=$(cut -d'|' -f4 <<<"$line" | tr -d ' ')
	done

	dbz_stop
	pg_phase "${dbz_base[@]}"
	reset_outbox
	for rate in $rates; do
		local line
		line=$(obx_latency "$rate" "$secs" "$lat_clients")
		rows="$rows
$line"
		[ "$rate" = 2000 ] && p99_obx=$(cut -d'|' -f4 <<<"$line" | tr -d ' ')
	done

	# 3. Throughput: the two publishers in turn, then each stopped.
	local round tps_rows="" obx_on=() dbz_on=() out
	sed "s/ROUTE/tps/" "$here/pgbench/insert_debezium.sql" >"$work/tps_debezium.sql"
	chmod 644 "$work/tps_debezium.sql"
	for round in $(seq 1 "${DEBEZIUM_TPS_ROUNDS:-2}"); do
		pg_phase "${dbz_base[@]}"
		reset_outbox
		out=$(full_speed "$here/pgbench/enqueue_obx.sql" "$clients" "$tps_secs") || return 1
		obx_on+=("$out")
		tps_rows="$tps_rows
obx running (obx.enqueue; the relay with its defaults), round $round | $out | $(sql_value "$pending_sql")"
		pg_phase "${dbz_base[@]}" "obx.workers = 0"
		dbz_start 10 || return 1
		out=$(full_speed "$work/tps_debezium.sql" "$clients" "$tps_secs") || return 1
		dbz_on+=("$out")
		tps_rows="$tps_rows
Debezium running (INSERT into its outbox; Connect, poll.interval.ms 10), round $round | $out | $(dbz_backlog)"
		# Caught up before it stops, so that the next round starts even.
		wait_for 600 "Debezium to publish its backlog" dbz_caught_up || return 1
		dbz_stop
	done
	reset_outbox
	tps_rows="$tps_rows
obx stopped (obx.workers = 0) | $(full_speed "$here/pgbench/enqueue_obx.sql" "$clients" "$tps_secs") | -
Debezium stopped (Connect stopped) | $(full_speed "$work/tps_debezium.sql" "$clients" "$tps_secs") | -"
	local obx_mean dbz_mean
	obx_mean=$(printf '%s\n' "${obx_on[@]}" | awk '{ s += $1 } END { printf "%.0f", s / NR }')
	dbz_mean=$(printf '%s\n' "${dbz_on[@]}" | awk '{ s += $1 } END { printf "%.0f", s / NR }')

	echo
	echo "commit -> broker append (LogAppendTime), one event per transaction at a steady rate, ${secs}s per run"
	{
		echo "rate | publisher | p50 ms | p99 ms | max ms | events (read back)"
		echo "${rows#?}"
	} | table
	echo "target: obx p99 at 2,000 events/s ≤ Debezium's with poll.interval.ms 10: $p99_obx / $p99_dbz10 ms — $(verdict "$(awk -v a="$p99_obx" -v b="$p99_dbz10" 'BEGIN { print (a ~ /^[0-9.]+$/ && b ~ /^[0-9.]+$/ && a <= b) }')")"

	echo
	echo "the application's transactions per second, one event each, $clients clients at full speed for ${tps_secs}s; backlog: events the publisher had not published when the run ended"
	{
		echo "publisher | tps | backlog"
		echo "${tps_rows#?}"
	} | table
	echo "target: the application's tps with obx running ≥ with Debezium running (means of the rounds): $obx_mean / $dbz_mean = $(ratio "$obx_mean" "$dbz_mean")× — $(verdict "$(awk -v a="$obx_mean" -v b="$dbz_mean" 'BEGIN { print (a >= b) }')")"
	return 0
}

# dbz_start POLL_MS: Kafka Connect standalone with Debezium's connector
# (poll.interval.ms POLL_MS), its offsets in $work/dbz; returns once the
# connector streams from its slot.
dbz_start()
{
	local poll=$1 dir=$work/dbz
	mkdir -p "$dir"
	cat >"$dir/worker.properties" <<EOF
bootstrap.servers=$brokers
key.converter=org.apache.kafka.connect.storage.StringConverter
value.converter=org.apache.kafka.connect.storage.StringConverter
offset.storage.file.filename=$dir/offsets
offset.flush.interval.ms=1000
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

# dbz_backlog: the throughput runs' rows that Debezium has not published.
dbz_backlog()
{
	echo $(($(sql_value "SELECT count(*) FROM bench.dbz_outbox WHERE aggregatetype = 'tps'") - $(topic_count bench.vs.dbz.tps)))
}

# dbz_caught_up: whether Debezium has published its whole backlog (read
# again at each call: a condition for wait_for).
dbz_caught_up()
{
	[ "$(dbz_backlog)" -le 0 ]
}

# topic_count TOPIC: how many messages the topic's 4 partitions hold.
topic_count()
{
	local t=$1
	kcat -Q -b "$brokers" -t "$t:0:-1" -t "$t:1:-1" -t "$t:2:-1" -t "$t:3:-1" 2>/dev/null |
		awk '{ s += $4 } END { print s + 0 }'
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

# latency_row LABEL RATE TOPIC COMMITS_SQL: read TOPIC back and print
# "RATE | LABEL | p50 | p99 | max | N (M)", commit -> broker append over
# the events COMMITS_SQL lists (id, commit time).
latency_row()
{
	local label=$1 rate=$2 topic=$3 commits=$4 res
	kcat -C -b "$brokers" -t "$topic" -o beginning -e -q -f '%T\t%h\n' >"$work/vs_$topic.tsv" 2>/dev/null || true
	chmod 644 "$work/vs_$topic.tsv"
	res=$(sql -tA -F' ' -P null=- -c "CREATE TEMP TABLE k (ts_ms bigint, headers text)" \
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
		  FROM l" | tail -1)
	local events matched p50 p99 max
	read -r events matched p50 p99 max <<<"$res"
	echo "$rate/s | $label | $p50 | $p99 | $max | $events ($matched)"
}

# dbz_latency POLL RATE SECONDS CLIENTS: one latency run of Debezium
# (running with poll.interval.ms POLL) into topic bench.vs.dbz.pPOLL.rRATE.
dbz_latency()
{
	local poll=$1 rate=$2 secs=$3 clients=$4 route="p$1.r$2" n0 total
	sed "s/ROUTE/$route/" "$here/pgbench/insert_debezium.sql" >"$work/dbz_$route.sql"
	chmod 644 "$work/dbz_$route.sql"
	run_pgbench -c "$clients" -j "$(pgbench_threads "$clients")" -R "$rate" -T 3 -M prepared \
		-f "$work/dbz_$route.sql" >/dev/null 2>&1 || true
	n0=$(sql_value "SELECT coalesce(max(n), 0) FROM bench.dbz_outbox")
	run_pgbench -c "$clients" -j "$(pgbench_threads "$clients")" -R "$rate" -T "$secs" -M prepared \
		-f "$work/dbz_$route.sql" >"$work/dbz_$route.log" 2>&1 || {
		cat "$work/dbz_$route.log" >&2
		return 1
	}
	total=$(sql_value "SELECT count(*) FROM bench.dbz_outbox WHERE aggregatetype = '$route'")
	wait_for 120 "Debezium to publish the run's events" topic_holds "bench.vs.dbz.$route" "$total" || true
	latency_row "Debezium, poll.interval.ms $poll" "$rate" "bench.vs.dbz.$route" "
		SELECT id, pg_xact_commit_timestamp(((((payload->>'xid')::bigint % 4294967296)::text)::xid)) AS committed
		  FROM bench.dbz_outbox WHERE aggregatetype = '$route' AND n > $n0"
}

# obx_latency RATE SECONDS CLIENTS: one latency run of obx's relay into
# topic bench.vs.obx.rRATE.
obx_latency()
{
	local rate=$1 secs=$2 clients=$3 topic=bench.vs.obx.r$1 seq0
	sed "s/TOPIC/$topic/" "$here/pgbench/latency.sql" >"$work/vs_obx_$rate.sql"
	chmod 644 "$work/vs_obx_$rate.sql"
	run_pgbench -c "$clients" -j "$(pgbench_threads "$clients")" -R "$rate" -T 3 -M prepared \
		-f "$work/vs_obx_$rate.sql" >/dev/null 2>&1 || true
	settle_relay 120 >/dev/null || true
	seq0=$(sql_value "$last_seq_sql")
	run_pgbench -c "$clients" -j "$(pgbench_threads "$clients")" -R "$rate" -T "$secs" -M prepared \
		-f "$work/vs_obx_$rate.sql" >"$work/vs_obx_$rate.log" 2>&1 || {
		cat "$work/vs_obx_$rate.log" >&2
		return 1
	}
	settle_relay 120 >/dev/null || true
	latency_row "obx relay, defaults" "$rate" "$topic" "
		SELECT id, pg_xact_commit_timestamp(((((payload->>'xid')::bigint % 4294967296)::text)::xid)) AS committed
		  FROM obx.events WHERE topic = '$topic' AND seq > $seq0"
}
