# bench/lib.sh: sourced by bench/run.  The throwaway PostgreSQL and Kafka
# (the stand-in, or with KAFKA=real a 3-node Apache Kafka cluster) the
# benchmarks run against, SQL helpers, arithmetic and the table printer.
# Nothing here measures anything.
#
# Globals set by bench_start: work (temporary directory), port, brokers,
# mock_pid or kafka_dir.  bench_stop undoes everything bench_start did.

work=""
port=${BENCH_PORT:-55439}
# The real cluster's JVM (KAFKA=real): see bench_start.
bench_kafka_heap=${OBX_KAFKA_HEAP:-1g}
bench_kafka_jvm=${OBX_KAFKA_JVM:--XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35}
brokers=""
mock_pid=""
kafka_dir=""    # the real cluster's directory (tools/kafka-cluster), KAFKA=real
pg_started=0
# PIDs of background jobs a benchmark started; bench_stop ends them.
bench_jobs=""
# CPU per 1,000 events of the last drain (bench/drain.sh), the reference
# of the latency benchmark's CPU figures.
drain_relay_per_k=""
drain_broker_per_k=""

# Wait for a condition, polling every 0.1 s, at most $1 seconds.
wait_for()
{
	local secs=$1 what=$2
	shift 2
	local deadline=$((SECONDS + secs))
	while [ $SECONDS -lt $deadline ]; do
		"$@" >/dev/null 2>&1 && return 0
		sleep 0.1 # poll interval of a condition wait
	done
	echo "bench: timed out after ${secs}s waiting for $what" >&2
	return 1
}

bench_start()
{
	work=$(obx_workdir bench)

	if [ "${KAFKA:-}" = real ]; then
		# Three KRaft nodes on loopback; topics are made by bench_topic.
		# The brokers' JVM as Kafka's own scripts start it (kafka-run-class:
		# G1, a 1 GB heap), not the tests' quick-starting one, whose
		# C1-only compiled code costs the brokers CPU on every request.
		kafka_dir=$work/kafka
		brokers=$(OBX_KAFKA_HEAP=$bench_kafka_heap OBX_KAFKA_JVM=$bench_kafka_jvm \
			"$root/tools/kafka-cluster" start "$kafka_dir" --nodes 3 | tail -1)
		# A fresh cluster's brokers load their transaction coordinators
		# (which hand idempotent producers their ids) only now: wait until
		# idempotent producers get theirs at once, so that no timed
		# producer waits for one.
		bench_topic bench.warmup
		wait_for 120 "the brokers to hand out producer ids" kafka_ready
	else
		"$root/tools/obx-kafka-mock" --state-file "$work/mock.state" </dev/null >"$work/mock.log" 2>&1 &
		mock_pid=$!
		wait_for 30 "the Kafka stand-in" test -f "$work/mock.state"
		brokers=$(sed -n 's/^bootstrap=//p' "$work/mock.state")
		# BENCH_RTT=ms: brokers that far away (each request answered that
		# much later), as a Kafka in another zone or region would be.
		if [ -n "${BENCH_RTT:-}" ]; then
			mock_command "rtt all $BENCH_RTT" || return 1
		fi
	fi

	local preload="obx"
	[ "${BENCH_STATEMENTS:-0}" = 1 ] && preload="obx,pg_stat_statements"

	obx_as_postgres initdb -D "$work/data" -A trust -U postgres >"$work/initdb.log"
	cat >>"$work/data/postgresql.conf" <<EOF
# bench/run: a throwaway server, reachable on its Unix socket only.
listen_addresses = ''
port = $port
unix_socket_directories = '$work'
shared_preload_libraries = '$preload'
obx.brokers = '$brokers'
obx.database = 'bench'
# Phases that pause the relay (obx.workers = 0) do so on purpose: no
# warning per pgbench session that no relay serves the database.
obx.warn_without_relay = off
# The same for obx and every baseline: enough cache for the data sets, and
# no checkpoint in the middle of a timed run (each run starts after one).
shared_buffers = 512MB
max_wal_size = 8GB
checkpoint_timeout = 30min
log_line_prefix = '%m [%p] '
# Per-benchmark settings (obx.workers, ...): rewritten by pg_phase.
include_if_exists = 'bench_phase.conf'
EOF
	obx_as_postgres touch "$work/data/bench_phase.conf"
	obx_as_postgres pg_ctl -D "$work/data" -l "$work/postgres.log" -w start >/dev/null
	pg_started=1
	sql -d postgres -c "CREATE DATABASE bench" >/dev/null
	sql -f "$here/sql/setup.sql" >/dev/null
	[ "${BENCH_STATEMENTS:-0}" = 1 ] && sql -c "CREATE EXTENSION pg_stat_statements" >/dev/null
	brokers_warm_up
}

# brokers_warm_up: with KAFKA=real, BENCH_BROKER_WARMUP_SECONDS (60) of
# 2,000 events/s through obx's relay, not measured, until all is published:
# the brokers' JVMs compile their hot code under the first load, and no
# benchmark's first figure should be taken against brokers still doing so.
brokers_warm_up()
{
	local secs=${BENCH_BROKER_WARMUP_SECONDS:-60} f=$work/brokers_warm_up.sql
	[ -n "$kafka_dir" ] && [ "$secs" -gt 0 ] || return 0
	bench_topic bench.warmup.relay
	sed "s/TOPIC/bench.warmup.relay/" "$here/pgbench/latency.sql" >"$f"
	chmod 644 "$f"
	run_pgbench -c 4 -j "$(pgbench_threads 4)" -R 2000 -T "$secs" -M prepared -f "$f" >/dev/null 2>&1 || true
	settle_relay 300 >/dev/null
}

# mock_command LINE: one command to the stand-in's control port; fails
# unless it answers "ok".
mock_command()
{
	local control reply
	control=$(sed -n 's/^control=//p' "$work/mock.state")
	exec 3<>"/dev/tcp/${control%:*}/${control#*:}"
	echo "$1" >&3
	read -r reply <&3
	exec 3<&-
	[ "${reply%% *}" = ok ] || {
		echo "bench: the stand-in refused \"$1\": $reply" >&2
		return 1
	}
}

bench_stop()
{
	local pid
	for pid in $bench_jobs; do
		kill "$pid" 2>/dev/null || true
	done
	pg_stop || true
	if [ -n "$mock_pid" ]; then
		kill "$mock_pid" 2>/dev/null || true
		wait "$mock_pid" 2>/dev/null || true
		mock_pid=""
	fi
	if [ -n "$kafka_dir" ]; then
		"$root/tools/kafka-cluster" stop "$kafka_dir" || true
		kafka_dir=""
	fi
}

# kafka_ready: six idempotent producers in a row, each to whichever
# broker librdkafka picks, got their producer id without "Coordinator load
# in progress".
kafka_ready()
{
	local i err
	for i in 1 2 3 4 5 6; do
		err=$(echo warm | kcat -P -b "$brokers" -t bench.warmup \
			-X enable.idempotence=true -X acks=all 2>&1) || return 1
		[ -z "$err" ] || return 1
	done
}

# kafka_description: what the benchmarks' Kafka is, for the header.
kafka_description()
{
	if [ -n "$kafka_dir" ]; then
		echo "Kafka: Apache Kafka $OBX_KAFKA_VERSION, 3 KRaft nodes (broker and controller each) on loopback (tools/kafka-cluster; JVM: $bench_kafka_jvm -Xmx$bench_kafka_heap); topics with 4 partitions, replication factor 3, min.insync.replicas 2, message.timestamp.type LogAppendTime"
	else
		echo "stand-in: tools/obx-kafka-mock (3 brokers, 4 partitions per topic)"
	fi
}

# bench_topic NAME...: with KAFKA=real, create the topics a benchmark is
# about to use, as kafka_description says (with bench_partitions
# partitions where a benchmark sets it, 4 otherwise; one JVM start each,
# before anything is timed); with the stand-in nothing, it makes them on
# first use.
bench_topic()
{
	[ -n "$kafka_dir" ] || return 0
	local t
	for t in "$@"; do
		"$root/tools/kafka-cluster" topic "$kafka_dir" "$t" "${bench_partitions:-4}" \
			message.timestamp.type=LogAppendTime min.insync.replicas=2
	done
}

# pg_phase SETTING...: restart the server with exactly these per-benchmark
# settings (each a "name = value" line) on top of the fixed ones.  No
# setting means obx's defaults (one relay worker, ...).
pg_phase()
{
	local line
	: >"$work/phase.tmp"
	# BENCH_SETTINGS: extra lines for every phase, ";"-separated except
	# inside single quotes, e.g. BENCH_SETTINGS="obx.claim_gap = 5;
	# obx.kafka_properties = 'linger.ms=0;socket.nagle.disable=false'"
	# (then the figures are no longer obx's defaults; bench/run prints them).
	# They come first, so that the phase's own lines win: with
	# BENCH_SETTINGS="obx.workers = 1", a paused phase still has none.
	if [ -n "${BENCH_SETTINGS:-}" ]; then
		awk '{
			quoted = 0; line = ""
			for (i = 1; i <= length($0); i++) {
				c = substr($0, i, 1)
				if (c == "\047")
					quoted = !quoted
				if (c == ";" && !quoted) {
					print line; line = ""
				} else
					line = line c
			}
			print line
		}' <<<"$BENCH_SETTINGS" >>"$work/phase.tmp"
	fi
	for line in "$@"; do
		echo "$line" >>"$work/phase.tmp"
	done
	obx_as_postgres cp "$work/phase.tmp" "$work/data/bench_phase.conf"
	pg_stop
	obx_as_postgres pg_ctl -D "$work/data" -l "$work/postgres.log" -w start >/dev/null
	pg_started=1
}

# pg_stop [immediate]: a fast shutdown; if the server has not stopped
# after 60 s (a relay worker that does not exit), say so and stop it
# immediately.  With "immediate", stop it immediately at once.
pg_stop()
{
	[ "$pg_started" = 1 ] || return 0
	if [ "${1:-}" = immediate ]; then
		obx_as_postgres pg_ctl -D "$work/data" -m immediate -w stop >/dev/null
	elif ! obx_as_postgres pg_ctl -D "$work/data" -m fast -w -t 60 stop >/dev/null 2>&1; then
		echo "bench: WARNING: the server did not stop within 60 s of a fast shutdown request; stopping it with -m immediate" >&2
		ps -o pid,etime,time,args --ppid "$(head -1 "$work/data/postmaster.pid")" >&2 || true
		obx_as_postgres pg_ctl -D "$work/data" -m immediate -w stop >/dev/null
	fi
	pg_started=0
}

sql()
{
	obx_as_postgres psql -X -q -v ON_ERROR_STOP=1 -h "$work" -p "$port" -U postgres -d bench "$@"
}

# sql_value QUERY: the single value a query returns.
sql_value()
{
	sql -tA -c "$1"
}

# pgbench_threads CLIENTS: pgbench's -j for that many clients, one thread
# per core at most.
pgbench_threads()
{
	local cores
	cores=$(nproc)
	echo $(($1 < cores ? $1 : cores))
}

run_pgbench()
{
	obx_as_postgres pgbench -n -h "$work" -p "$port" -U postgres "$@" bench
}

# How many events are unpublished, as cheaply as the claim finds them
# (obx._unpublished_events from the latest tick, and the held ones), not
# through obx.outbox_events, which looks each event's record up.
pending_sql="SELECT (SELECT count(*) FROM obx._unpublished_events) + (SELECT count(*) FROM obx.event_states WHERE published_at IS NULL AND skipped_at IS NULL)"

# Succeeds when no event in the outbox is unpublished.
nothing_pending()
{
	[ "$(sql_value "$pending_sql")" = 0 ]
}

# settle_relay TIMEOUT: wait until the relay has published everything,
# polling every 0.2 s; prints the seconds it took, or "not after TIMEOUT s
# (N pending)".  When the relay did not make it, the server is stopped
# immediately and started again with the same settings (a relay stuck in a
# statement would otherwise block the next TRUNCATE, and shutdown), and the
# status is 1.
settle_relay()
{
	local timeout=$1 start=$EPOCHREALTIME pending
	local deadline=$((SECONDS + timeout))
	while [ $SECONDS -lt $deadline ]; do
		pending=$(sql_value "$pending_sql")
		if [ "$pending" = 0 ]; then
			calc "$EPOCHREALTIME - $start" 1
			return 0
		fi
		sleep 0.2
	done
	echo "not after ${timeout} s ($pending pending)"
	echo "bench: WARNING: the relay left $pending events unpublished for ${timeout} s; restarting the server (-m immediate)" >&2
	pg_stop immediate
	obx_as_postgres pg_ctl -D "$work/data" -l "$work/postgres.log" -w start >/dev/null
	pg_started=1
	return 1
}

# reset_outbox [ROWS [SPREAD]]: empty obx's outbox and
# bench.plain_outbox, put ROWS (default BENCH_SEED_ROWS, 50,000)
# already-published events of topic bench.seed in each (published over the
# last SPREAD seconds, default 3600: in obx one record per 1,000 events, as
# the relay records them, and a tick past them), analyze both, all in one
# transaction, then write the dirty pages out.  A production outbox is
# never empty: it holds what obx.retention keeps, and autovacuum has
# analyzed it.  Starting each run from that state (rather than from an
# empty, never-analyzed table, which the relay would plan its statements
# for) keeps the runs comparable and realistic.
reset_outbox()
{
	local n=${1:-${BENCH_SEED_ROWS:-50000}} spread=${2:-3600} try
	# A running relay's claim locks the outbox's partitions one by one, and
	# the TRUNCATE takes them in its own order: a deadlock the server
	# resolves by cancelling one side.  If it is this side, again.
	for try in 1 2 3 4 5; do
		reset_outbox_once "$n" "$spread" && return 0
		echo "bench: reset_outbox: attempt $try failed; again" >&2
	done
	return 1
}

reset_outbox_once()
{
	local n=$1 spread=$2
	sql >/dev/null <<EOF
BEGIN;
TRUNCATE obx.events, obx.claims, obx.records, obx.renewals, obx.event_states, bench.plain_outbox;
CREATE TEMP TABLE seed ON COMMIT DROP AS
SELECT gen_random_uuid() AS id, i AS n, 'cus_' || lpad(k::text, 5, '0') AS event_key,
	   bench.make_payload(i, k) AS payload,
	   now() - make_interval(secs => $spread * (1 - i::float8 / $n)) AS published_at
  FROM (SELECT i, floor(random() * 10000)::int AS k FROM generate_series(1, $n) i) s;
INSERT INTO obx.events (id, aggregate_id, topic, event_key, payload, occurred_at)
SELECT id, event_key, 'bench.seed', event_key, payload, published_at FROM seed ORDER BY n;
INSERT INTO obx.records (lease_id, recorded_at, max_seq, ids, partitions, offsets, published_at)
SELECT nextval('obx.lease_seq'), max(s.published_at), max(e.seq), array_agg(s.id ORDER BY s.n),
	   array_agg(0 ORDER BY s.n), array_agg(s.n::bigint ORDER BY s.n), array_agg(s.published_at ORDER BY s.n)
  FROM seed s JOIN obx.events e ON e.id = s.id GROUP BY (s.n - 1) / 1000;
INSERT INTO bench.plain_outbox (id, seq, aggregate_id, topic, event_key, payload,
								occurred_at, published_at, attempts, kafka_partition, kafka_offset)
SELECT id, -n, event_key, 'bench.seed', event_key, payload, published_at, published_at, 1, 0, n FROM seed;
ANALYZE obx.events;
ANALYZE obx.records;
ANALYZE bench.plain_outbox;
COMMIT;
INSERT INTO obx.claims (lease_id, owner, until, snap, floor)
SELECT nextval('obx.lease_seq'), -1, now(), pg_current_snapshot(),
	   coalesce((SELECT max(seq) + 1 FROM obx.events), 0);
CHECKPOINT;
EOF
}

# calc EXPR: floating-point arithmetic (awk), printed with %.${2:-2}f.
calc()
{
	awk "BEGIN { v = $1; printf \"%.${2:-2}f\", v }"
}

# median N...: the median of the numbers given (the mean of the middle two
# for an even count), "-" for none.
median()
{
	printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 }
		END {
			if (NR == 0) print "-"
			else if (NR % 2) print v[(NR + 1) / 2]
			else print (v[NR / 2] + v[NR / 2 + 1]) / 2
		}'
}

# ratio A B: A / B with two decimals, or "-" when either is not a number.
ratio()
{
	awk -v a="$1" -v b="$2" 'BEGIN {
		if (a !~ /^-?[0-9.]+$/ || b !~ /^-?[0-9.]+$/ || b + 0 == 0) print "-"
		else printf "%.2f", a / b
	}'
}

# verdict OK TEXT: "met" or "not met" after a target's description.
verdict()
{
	if [ "$1" = 1 ]; then
		echo "met"
	else
		echo "NOT met"
	fi
}

# table: print "|"-separated rows from stdin as an aligned Markdown table;
# the first row is the header.
table()
{
	awk -F'|' '
	{
		rows[NR] = $0
		for (i = 1; i <= NF; i++) {
			gsub(/^ +| +$/, "", $i)
			cell[NR, i] = $i
			if (length($i) > w[i]) w[i] = length($i)
		}
		if (NF > nf) nf = NF
	}
	END {
		for (r = 1; r <= NR; r++) {
			line = "|"
			for (i = 1; i <= nf; i++)
				line = line sprintf(" %-" w[i] "s |", cell[r, i])
			print line
			if (r == 1) {
				line = "|"
				for (i = 1; i <= nf; i++) {
					dash = ""
					for (j = 0; j < w[i] + 2; j++) dash = dash "-"
					line = line dash "|"
				}
				print line
			}
		}
	}'
}

# With BENCH_STATEMENTS=1: statements_reset before a measured run,
# statements_print after it (the relay's statements, from pg_stat_statements).
statements_reset()
{
	[ "${BENCH_STATEMENTS:-0}" = 1 ] || return 0
	sql -c "SELECT pg_stat_statements_reset()" >/dev/null
}

statements_print()
{
	[ "${BENCH_STATEMENTS:-0}" = 1 ] || return 0
	echo "statements during the run (pg_stat_statements, BENCH_STATEMENTS=1):"
	sql -c "SELECT calls, round(total_exec_time::numeric) AS total_ms, round(mean_exec_time::numeric, 2) AS mean_ms, round(max_exec_time::numeric, 2) AS max_ms, rows, left(regexp_replace(query, '\s+', ' ', 'g'), 60) AS query FROM pg_stat_statements WHERE query !~ 'pg_stat_statements|obx.workers|count\(\*\)|pg_settings' ORDER BY total_exec_time DESC LIMIT 8"
}

# The last event sequence number handed out (0 before the first).
last_seq_sql="SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM obx.event_seq"

# payload_committed: the SQL expression of an event's commit time, from
# the transaction id its payload carries (pgbench/latency.sql and its
# kin) and track_commit_timestamp.
payload_committed="pg_xact_commit_timestamp((((payload->>'xid')::bigint % 4294967296)::text)::xid)"

# latency_ctes SEQ0 TOPIC: two CTEs for the latency of the events a
# pgbench script enqueued (its payload carries its transaction's xid):
# "pub", each event's first publish since SEQ0 (from the records), and
# "ev", each event of TOPIC after SEQ0 with published_at (NULL: not
# published) and committed (its commit time, track_commit_timestamp).
latency_ctes()
{
	cat <<-EOF
		pub AS (
			SELECT x.id, min(x.t) AS published_at
			  FROM obx.records r, unnest(r.ids, r.published_at) AS x(id, t)
			 WHERE r.max_seq > $1 GROUP BY x.id),
		ev AS (
			SELECT e.id, pub.published_at,
				   $payload_committed AS committed
			  FROM obx.events e LEFT JOIN pub USING (id) WHERE e.topic = '$2' AND e.seq > $1)
	EOF
}

# commit_to_published: the SQL expression of an "ev" row's commit ->
# published_at in ms, Infinity for an event not published.
commit_to_published="coalesce(extract(epoch FROM ev.published_at - ev.committed)::float8 * 1000, 'Infinity')"

# Load average, printed before each benchmark: these machines are shared.
machine_load()
{
	cut -d' ' -f1-3 /proc/loadavg
}

# cpu_ms PID...: the CPU time (user + system, every thread) these processes
# have used since they started, in milliseconds, from /proc/PID/stat (the
# fields after the command name, which may hold spaces).  A process that is
# gone counts 0.
cpu_ms()
{
	local p ticks total=0
	for p in "$@"; do
		ticks=$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | awk '{ print $12 + $13 }')
		total=$((total + ${ticks:-0}))
	done
	echo $((total * 1000 / $(getconf CLK_TCK)))
}

# relay_pids: the server's relay workers.  broker_pids: the real
# cluster's broker processes (none with the stand-in).
relay_pids()
{
	sql -tA -c "SELECT pid FROM pg_stat_activity WHERE backend_type = 'obx relay'"
}

broker_pids()
{
	[ -n "$kafka_dir" ] && sed -n 's/^pid[0-9]*=//p' "$kafka_dir/cluster.env"
	return 0
}

# per_k MS EVENTS: milliseconds per 1,000 events.
per_k()
{
	calc "$1 * 1000 / ($2 > 0 ? $2 : 1)" 1
}

# ensure_messages: $work/messages.tsv holds DRAIN_EVENTS messages (key,
# event id, payload as the relay sends it) for the librdkafka baselines.
# The drain benchmark writes it from the outbox; otherwise it is generated
# from the same payload function.
ensure_messages()
{
	[ -s "$work/messages.tsv" ] && return 0
	sql -o /dev/null -c "SELECT setseed(0.42)" \
		-c "\\copy (SELECT 'cus_' || lpad(k::text, 5, '0'), gen_random_uuid(), bench.make_payload(i, k)::text FROM (SELECT i, floor(random() * 10000)::int AS k FROM generate_series(1, 20000) i) s) TO '$work/messages.tsv'"
}
