# bench/consumer.sh: sourced by bench/run.  Benchmark 6, the in-database
# consumer (only when asked: bench/run consumer).
#
# Throughput.  A subscription is made whose handler inserts one row
# (bench.apply_order, LANGUAGE sql, into bench.consumer_effects) on a
# 4-partition topic, and warmed up: rounds of 200 messages until every
# consumer worker has applied some in one round (the group joined, its
# rebalances over).  obx's defaults otherwise (obx.consumer_workers = 2,
# obx.consumer_batch_size = 500; CONSUMER_WORKERS=N to change the first);
# the relay is paused.  Then CONSUMER_ROUNDS (3) times: CONSUMER_MESSAGES
# (50,000) order messages (the drain benchmark's ~180-byte payloads,
# 10,000 keys, an event_id header each) are produced by
# bench/produce_baseline in a fraction of a second, and the consumer applies
# them.  A round's rate is its messages over the time from its first
# handler call (clock_timestamp()) to the commit of its last message
# (pg_xact_commit_timestamp of the xid the handler records); the figure is
# the median of the rounds.  Each message must be applied exactly once.
# (The stand-in keeps about 5 MB per partition: about 80,000 of these
# messages in all four.)
#
# Baselines, same run, no Kafka: pgbench with 2 clients writes what a
# consumer writes per message (a dedupe row in obx.processed_events with ON
# CONFLICT DO NOTHING, then the effect row), one message per transaction
# (pgbench/consumer_single.sql) and 1,000 per transaction
# (pgbench/consumer_batched.sql), CONSUMER_BASELINE_SECONDS (5) per run, in
# the order single, batched, batched, single; each figure is the mean of
# its two runs.  The target: the consumer at least half the batched rate.
#
# Apply latency.  A second subscription, on a topic of its own, is warmed
# up the same way; then
# produce_baseline (paced mode) produces CONSUMER_LATENCY_RATE (2,000)
# messages a second for CONSUMER_LATENCY_SECONDS (20), evenly spaced.  A
# message's latency runs from its Kafka timestamp (the stand-in keeps the
# producer's CreateTime: when produce_baseline produced it; millisecond
# resolution) to the commit of the handler's transaction
# (pg_xact_commit_timestamp of the xid the handler records, with
# track_commit_timestamp = on).  Its target, "no worse than before", has
# no same-run baseline: set CONSUMER_P99_BEFORE (ms) to a p99 measured
# before a change to get a verdict.

consumer_messages()
{
	local file=$1 n=$2 order=$3
	sql -o /dev/null -c "\\copy (SELECT 'cus_' || lpad(k::text, 5, '0'), gen_random_uuid(), (bench.make_payload(i, k) || jsonb_build_object('orderId', $order))::text FROM (SELECT i, floor(random() * 10000)::int AS k FROM generate_series(1, $n) i) s) TO '$file'"
}

# consumer_applied TOPIC [ORDERS]: how many effects the handler wrote for
# TOPIC (of the messages whose order id is LIKE ORDERS, when given).
consumer_applied()
{
	sql_value "SELECT count(*) FROM bench.consumer_effects WHERE topic = '$1' AND order_id LIKE '${2:-%}'"
}

# consumer_wait TOPIC N TIMEOUT [ORDERS]: wait until N messages of TOPIC
# (whose order id is LIKE ORDERS, when given) are applied.
consumer_wait()
{
	local topic=$1 n=$2 timeout=$3 orders=${4:-%} got
	local deadline=$((SECONDS + timeout))
	while [ $SECONDS -lt $deadline ]; do
		got=$(consumer_applied "$topic" "$orders")
		[ "$got" -ge "$n" ] && return 0
		sleep 0.2
	done
	echo "bench: the consumer applied $got of $n messages of $topic in ${timeout} s" >&2
	return 1
}

consumer_subscribe()
{
	sql -c "SELECT obx.subscribe('$1', ARRAY['$2'], 'bench.apply_order(obx.inbound_event)', '{\"kafka\": {\"session.timeout.ms\": \"6000\"}}')" >/dev/null
}

# consumer_baselines SECS: "SINGLE BATCHED" messages/s of the two baselines.
consumer_baselines()
{
	local secs=$1 kind out tps single=0 batched=0
	for kind in single batched batched single; do
		sql -c "TRUNCATE bench.consumer_effects, obx.processed_events" -c "CHECKPOINT" >/dev/null
		out=$(run_pgbench -c 2 -j 2 -T "$secs" -M prepared -f "$here/pgbench/consumer_$kind.sql" 2>&1) || {
			echo "$out" >&2
			return 1
		}
		tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$out")
		[ -n "$tps" ] || {
			echo "$out" >&2
			return 1
		}
		[ $kind = batched ] && tps=$(calc "$tps * 1000" 0)
		eval "$kind=\$(calc \"\$$kind + $tps / 2\" 0)"
	done
	echo "$single $batched"
}

# consumer_warm_up TOPIC TIMEOUT: rounds of 200 warm-up messages until, in
# one round, every consumer worker (as many as there are partitions, at
# most) applied some: the group has joined and its rebalances are over.
consumer_warm_up()
{
	local topic=$1 timeout=$2 want round=0 pids=0
	local deadline=$((SECONDS + timeout))
	want=$(sql_value "SELECT least(current_setting('obx.consumer_workers')::int, 4)")
	while [ "$pids" -lt "$want" ] && [ $SECONDS -lt $deadline ]; do
		round=$((round + 1))
		consumer_messages "$work/consumer_warm.tsv" 200 "'warm$round'"
		"$here/produce_baseline" -b "$brokers" -t "$topic" -f "$work/consumer_warm.tsv" >/dev/null 2>&1 || return 1
		consumer_wait "$topic" $((round * 200)) "$timeout" || return 1
		pids=$(sql_value "SELECT count(DISTINCT backend_pid) FROM bench.consumer_effects WHERE topic = '$topic' AND order_id = 'warm$round'")
	done
	[ "$pids" -ge "$want" ] || {
		echo "bench: only $pids of $want consumer workers applied warm-up messages of $topic in ${timeout} s" >&2
		return 1
	}
}

# consumer_throughput N ROUNDS TIMEOUT: "MEDIAN LOWEST HIGHEST JOIN_SECONDS"
# of obx's consumer on ROUNDS backlogs of N messages each, one after the
# other, on a subscription warmed up first (consumer_warm_up).
consumer_throughput()
{
	local n=$1 rounds=$2 timeout=$3 topic=bench.consumer.backlog t0 joined round
	local seconds applied rates=""
	sql -c "TRUNCATE bench.consumer_effects, obx.processed_events" -c "CHECKPOINT" >/dev/null
	t0=$EPOCHREALTIME
	consumer_subscribe bench-consumer "$topic"
	consumer_warm_up "$topic" "$timeout" || return 1
	joined=$(calc "$EPOCHREALTIME - $t0" 1)
	for round in $(seq 1 "$rounds"); do
		consumer_messages "$work/consumer_backlog.tsv" "$n" "'r${round}_' || i"
		sql -c "CHECKPOINT" >/dev/null
		"$here/produce_baseline" -b "$brokers" -t "$topic" -f "$work/consumer_backlog.tsv" >"$work/consumer_produce.log" 2>&1 || {
			cat "$work/consumer_produce.log" >&2
			return 1
		}
		consumer_wait "$topic" "$n" "$timeout" "r${round}\\_%" || return 1
		applied=$(sql_value "SELECT count(DISTINCT event_id) || ' ' || count(*) FROM bench.consumer_effects WHERE topic = '$topic' AND order_id LIKE 'r${round}\\_%'")
		[ "$applied" = "$n $n" ] ||
			echo "bench: WARNING: expected each of $n messages of round $round applied once, got (distinct, rows) = ($applied)" >&2
		# From the first handler call to the commit of the last message.
		seconds=$(sql_value "
			SELECT extract(epoch FROM max(pg_xact_commit_timestamp(((xid::text::bigint % 4294967296)::text)::xid))
								   - min(applied_at))
			  FROM bench.consumer_effects WHERE topic = '$topic' AND order_id LIKE 'r${round}\\_%'")
		rates="$rates $(calc "$n / $seconds" 0)"
	done
	sql -c "SELECT obx.unsubscribe('bench-consumer')" >/dev/null
	echo "$(tr ' ' '\n' <<<"$rates" | sed '/^$/d' | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)], v[1], v[NR] }') $joined"
}

# consumer_latency RATE SECS TIMEOUT: "ACHIEVED P50 P99 MAX" (ms) of
# message timestamp -> handler commit at RATE messages/s.
consumer_latency()
{
	local rate=$1 secs=$2 timeout=$3 topic=bench.consumer.latency out count warm
	sql -c "TRUNCATE bench.consumer_effects" -c "CHECKPOINT" >/dev/null
	consumer_messages "$work/consumer_paced.tsv" "$((rate * secs + rate))" "'ord_' || i"
	consumer_subscribe bench-latency "$topic"
	consumer_warm_up "$topic" "$timeout" || return 1
	warm=$(consumer_applied "$topic")
	out=$("$here/produce_baseline" -b "$brokers" -t "$topic" -f "$work/consumer_paced.tsv" \
		-r "$rate" -d "$secs" 2>&1) || {
		echo "$out" >&2
		return 1
	}
	count=$(sed -n 's/.*count=\([0-9]*\).*/\1/p' <<<"$out")
	consumer_wait "$topic" "$((count + warm))" "$timeout" || return 1
	sql -c "SELECT obx.unsubscribe('bench-latency')" >/dev/null
	sql_value "
		WITH l AS (
			SELECT extract(epoch FROM pg_xact_commit_timestamp(((xid::text::bigint % 4294967296)::text)::xid)
						   - kafka_timestamp) * 1000 AS ms, kafka_timestamp
			  FROM bench.consumer_effects WHERE topic = '$topic' AND order_id NOT LIKE 'warm%')
		SELECT round(count(*) / greatest(extract(epoch FROM max(kafka_timestamp) - min(kafka_timestamp)), 0.001)) || ' ' ||
			   round(percentile_disc(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 1) || ' ' ||
			   round(percentile_disc(0.99) WITHIN GROUP (ORDER BY ms)::numeric, 1) || ' ' ||
			   round(max(ms)::numeric, 1)
		  FROM l"
}

bench_consumer()
{
	local n=${CONSUMER_MESSAGES:-50000} secs=${CONSUMER_BASELINE_SECONDS:-5}
	local rate=${CONSUMER_LATENCY_RATE:-2000} lsecs=${CONSUMER_LATENCY_SECONDS:-20}
	local timeout=${CONSUMER_TIMEOUT:-600} rounds=${CONSUMER_ROUNDS:-3}

	echo
	echo "== 6. in-database consumer: 4 partitions, $rounds backlogs of $n messages, a handler inserting one row (load average $(machine_load))"

	bench_topic bench.consumer.backlog bench.consumer.latency
	local workers=()
	[ -n "${CONSUMER_WORKERS:-}" ] && workers=("obx.consumer_workers = $CONSUMER_WORKERS")
	pg_phase "obx.workers = 0" "${workers[@]}" "track_commit_timestamp = on"
	local single batched rate_obx lowest highest join achieved p50 p99 max
	local out
	out=$(consumer_baselines "$secs") || return 1
	read -r single batched <<<"$out"
	out=$(consumer_throughput "$n" "$rounds" "$timeout") || return 1
	read -r rate_obx lowest highest join <<<"$out"
	out=$(consumer_latency "$rate" "$lsecs" "$timeout") || return 1
	read -r achieved p50 p99 max <<<"$out"
	{
		echo "measure | messages/s | / 1,000 per transaction"
		echo "obx consumer, $(sql_value "SHOW obx.consumer_workers") worker(s), backlogs of $n: median of $rounds ($lowest to $highest) | $rate_obx | $(ratio "$rate_obx" "$batched")"
		echo "baseline: one message per transaction, 2 pgbench clients, no Kafka | $single | $(ratio "$single" "$batched")"
		echo "baseline: 1,000 messages per transaction, 2 pgbench clients, no Kafka | $batched | 1.00"
	} | table
	local r
	r=$(ratio "$rate_obx" "$batched")
	echo "target: the consumer ≥ 0.50x the batched baseline: ${r}x — $(verdict "$(awk "BEGIN { print ($r >= 0.5) }")")"
	echo "apply latency at $rate messages/s (achieved $achieved/s), message timestamp → handler commit: p50 $p50 ms, p99 $p99 ms, max $max ms"
	if [ -n "${CONSUMER_P99_BEFORE:-}" ]; then
		echo "target: p99 no worse than before ($CONSUMER_P99_BEFORE ms): $p99 ms — $(verdict "$(awk "BEGIN { print ($p99 <= $CONSUMER_P99_BEFORE) }")")"
	else
		echo "target: p99 no worse than before the change: set CONSUMER_P99_BEFORE=<ms> for a verdict (docs/benchmarks.md keeps the latest figure)"
	fi
}
