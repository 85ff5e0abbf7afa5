# bench/latency.sh: sourced by bench/run.  Benchmark 3, end-to-end latency.
#
# For each rate in LATENCY_RATES (events/s), pgbench --rate runs one event
# per transaction for LATENCY_SECONDS (pgbench/latency.sql, 16 clients
# (LATENCY_CLIENTS) so that commits waiting for their WAL flush do not hold
# the rate back; --rate spaces transactions by a Poisson schedule at that mean rate)
# against obx with its defaults, on an outbox reset to 50,000 published
# rows (reset_outbox in lib.sh), after a 3 s warm-up on the same topic
# that is not measured.  Each payload
# carries its transaction id; with track_commit_timestamp on, its commit
# time is pg_xact_commit_timestamp(xid), taken when the commit record is
# written (before its WAL flush).
#
# What the broker's append time is, honestly: the stand-in (librdkafka's
# mock cluster) stores record batches as the producer sent them and answers
# LogAppendTime with a constant, so a message's Kafka timestamp is the
# producer's CreateTime, i.e. when the relay handed the event to
# librdkafka (read back with kcat, %T, millisecond resolution).  The
# append happens after that and before the acknowledgement, and
# published_at is when librdkafka received the event's acknowledgement,
# on its broker thread, after the broker appended it.  So:
#     commit → CreateTime   <=   commit → broker append   <=   commit → published_at
# Both bounds are printed; the target is judged on the upper one.
#
# With KAFKA=real (a 3-node Apache Kafka cluster, tools/kafka-cluster), the
# topics have message.timestamp.type = LogAppendTime, replication factor 3
# and min.insync.replicas 2: the broker overwrites each message's timestamp
# with the time its partition leader appended it, so the same read-back is
# commit → broker append itself (the leader's append; the acknowledgement
# comes after the followers have it too), and the target is judged on it.
# Both clocks are this machine's: the commit timestamp in microseconds, the
# append time in milliseconds (truncated, so a figure can read up to 1 ms
# short).  The rates default to 500, 2,000 and 5,000 events/s.
#
# Baselines: bench/produce_baseline in paced mode, the same rate, messages
# and producer settings with no database: produce call → delivery report.
# It runs twice: alone, and while pgbench runs the same load with a plain
# INSERT instead of obx.enqueue (pgbench/enqueue_plain.sql, same clients
# and rate, no relay work).  The second shows what the host's load alone
# does to a bare producer's latency on this machine; the ratio column is
# against it.
#
# CPU per 1,000 events (second table): the relay workers' and, with
# KAFKA=real, the brokers' CPU from the load's start until all is
# published, against the same run's drain and against the brokers' CPU
# under Kafka's Java producer at the same rate (java_reference); the
# method is in docs/benchmarks.md.

bench_latency()
{
	local secs=${LATENCY_SECONDS:-20}
	local rates=${LATENCY_RATES:-500 2000}
	[ -n "$kafka_dir" ] && rates=${LATENCY_RATES:-500 2000 5000}
	local clients threads
	clients=${LATENCY_CLIENTS:-16}
	threads=$(pgbench_threads "$clients")

	echo
	echo "== 3. end-to-end latency: one event per transaction at a steady rate, ${secs}s per rate (load average $(machine_load))"

	pg_phase "track_commit_timestamp = on"
	ensure_messages

	local rows="" cpu_rows="" cpu_verdicts="" rate verdict_line=""
	for rate in $rates; do
		local topic=bench.latency.$rate
		bench_topic "$topic" "$topic.librdkafka" "$topic.librdkafka.loaded"
		sed "s/TOPIC/$topic/" "$here/pgbench/latency.sql" >"$work/latency_$rate.sql"
		chmod 644 "$work/latency_$rate.sql"

		reset_outbox

		# Warm-up on the same topic, not measured: the relay's producers
		# learn the new topic's metadata (the first message to a topic a
		# producer has not seen waits for it), as they would have long
		# since in production.
		run_pgbench -c "$clients" -j "$threads" -R "$rate" -T 3 -M prepared \
			-f "$work/latency_$rate.sql" >/dev/null 2>&1 || true
		settle_relay 120 >/dev/null || true
		local seq0
		seq0=$(sql_value "$last_seq_sql")
		statements_reset
		local relays relay0 broker0
		relays=$(relay_pids)
		relay0=$(cpu_ms $relays)
		broker0=$(cpu_ms $(broker_pids))

		# The load, with the relay's backlog sampled every second.
		local out tps lag pgb peak=0 pending perf_pid=""
		run_pgbench -c "$clients" -j "$threads" -R "$rate" -T "$secs" -M prepared \
			-f "$work/latency_$rate.sql" >"$work/latency_$rate.log" 2>&1 &
		pgb=$!
		bench_jobs="$bench_jobs $pgb"
		if [ "${BENCH_PERF:-0}" = 1 ]; then
			perf record -q -e cpu-clock -F 499 -g -o "$work/perf_$rate.data" -p "$(echo $relays | tr ' ' ,)" \
				-- sleep "$secs" >/dev/null 2>&1 &
			perf_pid=$!
		fi
		while kill -0 "$pgb" 2>/dev/null; do
			sleep 1 # the backlog's sampling period
			pending=$(sql_value "SELECT count(*) FROM obx._unpublished_events WHERE seq > $seq0")
			[ "$pending" -gt "$peak" ] && peak=$pending
		done
		wait "$pgb" || {
			cat "$work/latency_$rate.log" >&2
			return 1
		}
		out=$(cat "$work/latency_$rate.log")
		tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$out")
		lag=$(sed -n 's/^rate limit schedule lag: avg \([0-9.]*\) .*/\1/p' <<<"$out")

		local settled unpublished=""
		settled=$(settle_relay "${LATENCY_SETTLE_TIMEOUT:-120}") ||
			unpublished=" (not all published $settled; those count as infinitely late)"
		[ -n "$perf_pid" ] && wait "$perf_pid" && perf_summary "$work/perf_$rate.data" "$rate/s"
		local relay_ms broker_ms
		relay_ms=$(($(cpu_ms $relays) - relay0))
		broker_ms=$(($(cpu_ms $(broker_pids)) - broker0))
		statements_print

		# Read the topic back: CreateTime (ms) and the event_id header.
		kcat -C -b "$brokers" -t "$topic" -o beginning -e -q -f '%T\t%h\n' >"$work/kafka_$rate.tsv" 2>"$work/kcat_$rate.log" || true
		chmod 644 "$work/kafka_$rate.tsv"

		local res
		res=$(sql -tA -F' ' -P null=- -c "CREATE TEMP TABLE k (ts_ms bigint, headers text)" \
			-c "\\copy k FROM '$work/kafka_$rate.tsv'" \
			-c "
			WITH $(latency_ctes "$seq0" "$topic"),
			kk AS (
				SELECT substring(headers FROM 'event_id=([0-9a-f-]{36})')::uuid AS id, min(ts_ms) AS ts_ms
				  FROM k GROUP BY 1),
			l AS (
				SELECT $commit_to_published AS up,
					   kk.ts_ms - extract(epoch FROM ev.committed) * 1000 AS low
				  FROM ev LEFT JOIN kk USING (id))
			SELECT count(*), count(low),
				   round(percentile_disc(0.5) WITHIN GROUP (ORDER BY up)::numeric, 1),
				   round(percentile_disc(0.99) WITHIN GROUP (ORDER BY up)::numeric, 1),
				   round(max(up)::numeric, 1),
				   round(percentile_disc(0.5) WITHIN GROUP (ORDER BY low)::numeric, 1),
				   round(percentile_disc(0.99) WITHIN GROUP (ORDER BY low)::numeric, 1),
				   round(max(low)::numeric, 1)
			  FROM l" | tail -1)
		local events matched up50 up99 upmax lo50 lo99 lomax
		read -r events matched up50 up99 upmax lo50 lo99 lomax <<<"$res"

		# What the read-back timestamps are, as the broker labels them.
		local low_label="commit -> Kafka CreateTime (lower bound; $matched of $events read back)"
		local up_label="commit -> published_at (upper bound)"
		if [ -n "$kafka_dir" ]; then
			local tstype
			tstype=$(kcat -C -b "$brokers" -t "$topic" -o beginning -c 1 -e -J 2>/dev/null |
				sed -n 's/.*"tstype":"\([a-z]*\)".*/\1/p' | head -1)
			low_label="commit -> broker append (Kafka timestamp, type ${tstype:-?}; $matched of $events read back)"
			up_label="commit -> published_at (the relay has the ack)"
		fi

		local base b50 b99 bmax
		base=$("$here/produce_baseline" -b "$brokers" -t "$topic.librdkafka" -f "$work/messages.tsv" -r "$rate" -d "$secs") || {
			echo "bench: librdkafka latency baseline: $base" >&2
			return 1
		}
		b50=$(sed -n 's/.*p50_ms=\([0-9.]*\).*/\1/p' <<<"$base")
		b99=$(sed -n 's/.*p99_ms=\([0-9.]*\).*/\1/p' <<<"$base")
		bmax=$(sed -n 's/.*max_ms=\([0-9.]*\).*/\1/p' <<<"$base")

		# The same producer while the same load runs without obx.
		local loaded l50 l99 lmax ltps
		run_pgbench -c "$clients" -j "$threads" -R "$rate" -T "$secs" -M prepared \
			-f "$here/pgbench/enqueue_plain.sql" >"$work/latency_plain_$rate.log" 2>&1 &
		pgb=$!
		bench_jobs="$bench_jobs $pgb"
		loaded=$("$here/produce_baseline" -b "$brokers" -t "$topic.librdkafka.loaded" -f "$work/messages.tsv" -r "$rate" -d "$secs") || {
			echo "bench: librdkafka latency baseline under load: $loaded" >&2
			return 1
		}
		wait "$pgb" || {
			cat "$work/latency_plain_$rate.log" >&2
			return 1
		}
		ltps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$work/latency_plain_$rate.log")
		l50=$(sed -n 's/.*p50_ms=\([0-9.]*\).*/\1/p' <<<"$loaded")
		l99=$(sed -n 's/.*p99_ms=\([0-9.]*\).*/\1/p' <<<"$loaded")
		lmax=$(sed -n 's/.*max_ms=\([0-9.]*\).*/\1/p' <<<"$loaded")

		local relay_k broker_k java_k="-" vs_java="-"
		relay_k=$(per_k "$relay_ms" "$events")
		broker_k=$(per_k "$broker_ms" "$events")
		if [ -n "$kafka_dir" ]; then
			bench_topic "$topic.java"
			java_k=$(java_reference "$topic.java" "$rate" "$secs") || return 1
			vs_java=$(ratio "$broker_k" "$java_k")
		fi
		local vs_drain
		vs_drain=$(ratio "$relay_k" "${drain_relay_per_k:--}")
		cpu_rows="$cpu_rows
$rate/s | $relay_k | $vs_drain | $broker_k | $java_k | $vs_java"
		[ "$vs_drain" != - ] && cpu_verdicts="$cpu_verdicts
target: relay CPU per event at $rate/s ≤ 2 × its drain cost: ${vs_drain}× — $(verdict "$(awk -v v="$vs_drain" 'BEGIN { print (v <= 2) }')")"
		[ "$rate" = 500 ] && [ "$vs_java" != - ] && cpu_verdicts="$cpu_verdicts
target: brokers' CPU per event at 500/s ≤ under Kafka's Java producer: ${vs_java}× — $(verdict "$(awk -v v="$vs_java" 'BEGIN { print (v <= 1) }')")"

		rows="$rows
$rate/s (achieved $(calc "$tps" 0)/s, $events events$unpublished, peak backlog $peak, client lag avg ${lag:-?} ms) | $up_label | $up50 | $up99 | $upmax | $(ratio "$up99" "$l99")
 | $low_label | $lo50 | $lo99 | $lomax | $(ratio "$lo99" "$l99")
 | baseline: librdkafka alone, produce -> ack, while $(calc "${ltps:-0}" 0) plain INSERT transactions/s run | $l50 | $l99 | $lmax | 1.00
 | baseline: librdkafka alone on a quiet host | $b50 | $b99 | $bmax | $(ratio "$b99" "$l99")"
		if [ "$rate" = 2000 ] && [ -n "$kafka_dir" ]; then
			verdict_line="target: p99 ≤ 20 ms at 2,000 events/s: commit → broker append (LogAppendTime) p99 $lo99 ms — $(verdict "$(awk -v v="$lo99" 'BEGIN { print (v ~ /^-?[0-9.]+$/ && v <= 20) }')") (commit → published_at p99 $up99 ms)"
		elif [ "$rate" = 2000 ]; then
			verdict_line="target: p99 ≤ 20 ms at 2,000 events/s: commit → published_at p99 $up99 ms — $(verdict "$(awk -v v="$up99" 'BEGIN { print (v ~ /^[0-9.]+$/ && v <= 20) }')") (lower bound, commit → CreateTime, p99 $lo99 ms)"
		fi
	done

	{
		echo "rate | measure | p50 ms | p99 ms | max ms | p99 / loaded baseline p99"
		echo "${rows#?}"
	} | table
	echo "${verdict_line:-target: p99 ≤ 20 ms at 2,000 events/s — not measured (2000 not in LATENCY_RATES)}"

	echo
	echo "CPU per 1,000 events, from the load's start until all is published (relay: the relay workers with their librdkafka threads; brokers: the three broker processes; Java: the brokers while Kafka's Java producer sends as many records of the same size at the same rate, linger.ms=5)"
	{
		echo "rate | relay ms | relay / drain (${drain_relay_per_k:-not run} ms) | brokers ms | brokers ms, Java producer | brokers obx / Java"
		echo "${cpu_rows#?}"
	} | table
	[ -n "$cpu_verdicts" ] && echo "${cpu_verdicts#?}"
	[ -z "$drain_relay_per_k" ] && echo "(run the drain benchmark in the same bench/run for the relay / drain ratio)"
	return 0
}

# perf_summary DATA WHEN: where the relay workers' CPU went during the load
# or the drain (BENCH_PERF=1: perf record of the relay processes and their
# librdkafka threads): shares per thread kind, then the
# relay's top functions with their callers folded in.
perf_summary()
{
	perf report -q -i "$1" --no-children --sort comm --stdio -g none >"$1.threads" 2>/dev/null || true
	perf report -q -i "$1" --children --sort sym --stdio -g none >"$1.functions" 2>/dev/null || true
	echo "-- relay profile at $2 (perf, $1): share of samples per thread"
	grep -v -e '^$' -e '^#' "$1.threads" | sed -n 1,12p
	echo "-- relay profile at $2: top functions, children included (what each step costs)"
	grep -v -e '^$' -e '^#' "$1.functions" | sed -n 1,40p
	return 0
}

# java_reference TOPIC RATE SECONDS: the brokers' CPU per 1,000 records
# while Kafka's own Java producer (ProducerPerformance, from the broker's
# kafka-tools jar) sends RATE records/s of the benchmark's average payload
# size for SECONDS: acks=all, idempotent, linger.ms=5 (what Kafka Connect's
# producers use), spread over the partitions in turn (RoundRobinPartitioner)
# as the benchmark's random keys spread obx's events.
java_reference()
{
	local topic=$1 rate=$2 secs=$3 size b0
	size=$(awk -F'\t' '{ n++; s += length($3) } END { print int(s / n) }' "$work/messages.tsv")
	b0=$(cpu_ms $(broker_pids))
	java -cp "$OBX_KAFKA_LIBS/*" org.apache.kafka.tools.ProducerPerformance \
		--topic "$topic" --num-records $((rate * secs)) --record-size "$size" --throughput "$rate" \
		--producer-props bootstrap.servers="$brokers" acks=all enable.idempotence=true linger.ms=5 \
		partitioner.class=org.apache.kafka.clients.producer.RoundRobinPartitioner \
		>"$work/java_$rate.log" 2>&1 || {
		cat "$work/java_$rate.log" >&2
		return 1
	}
	per_k "$(($(cpu_ms $(broker_pids)) - b0))" "$((rate * secs))"
}
