# bench/horizon.sh: sourced by bench/run.  Benchmark 5, a held-back horizon.
#
# The same load as the latency benchmark at HORIZON_RATE events/s (default
# 2,000) for HORIZON_SECONDS (default 30), twice, on an outbox reset to the
# same 50,000 published rows: first with nothing holding the xmin horizon,
# then while two sessions hold it for the whole run, as production has
# them: a report in REPEATABLE READ that keeps its snapshot (it read the
# outbox once), and a transaction that wrote a row and sits idle (its xid
# is running in every snapshot taken meanwhile).
#
# Printed for each: commit → published_at p50 / p99 / max (commit time from
# track_commit_timestamp, as in the latency benchmark; published_at from the
# records), and the dead tuples obx's tables gained during the run
# (n_dead_tup of the publish path's tables, read once the statistics have
# counted the run's records), per published event.  Baseline: the run with
# nothing held.  Targets (issue 27): p99 held ≤ 1.2 × p99 not held; dead
# tuples per published event 0.

bench_horizon()
{
	local secs=${HORIZON_SECONDS:-30} i
	local rate=${HORIZON_RATE:-2000}
	local clients=${LATENCY_CLIENTS:-16} threads
	threads=$(pgbench_threads "$clients")

	echo
	echo "== 5. a held-back horizon: $rate events/s for ${secs}s, without and with a snapshot held (load average $(machine_load))"
	pg_phase "track_commit_timestamp = on"

	local held rows="" p99_free="" p99_held="" dead_held=""
	for held in no yes; do
		local topic=bench.horizon.$held
		bench_topic "$topic"
		sed "s/TOPIC/$topic/" "$here/pgbench/latency.sql" >"$work/horizon_$held.sql"
		chmod 644 "$work/horizon_$held.sql"
		reset_outbox
		run_pgbench -c "$clients" -j "$threads" -R "$rate" -T 3 -M prepared \
			-f "$work/horizon_$held.sql" >/dev/null 2>&1 || true
		settle_relay 120 >/dev/null || true
		local seq0 dead0 holder=""
		seq0=$(sql_value "$last_seq_sql")
		dead0=$(sql_value "$horizon_dead_sql")

		if [ $held = yes ]; then
			# The report and the idle writer, each a psql reading a FIFO
			# that stays open until the load is published.
			rm -f "$work/hold_report" "$work/hold_idle"
			mkfifo -m 666 "$work/hold_report" "$work/hold_idle"
			obx_as_postgres psql -X -qAt -h "$work" -p "$port" -U postgres -d bench \
				-f "$work/hold_report" >/dev/null 2>&1 &
			holder=$!
			exec 7>"$work/hold_report"
			obx_as_postgres psql -X -qAt -h "$work" -p "$port" -U postgres -d bench \
				-f "$work/hold_idle" >/dev/null 2>&1 &
			holder="$holder $!"
			exec 8>"$work/hold_idle"
			bench_jobs="$bench_jobs $holder"
			echo "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM obx.events;" >&7
			echo "BEGIN; INSERT INTO bench.result VALUES ('horizon_idle_writer', 0, 0) ON CONFLICT DO NOTHING;" >&8
			for i in $(seq 1 100); do
				[ "$(sql_value "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction' AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)")" = 2 ] && break
				sleep 0.1 # until both sessions hold the horizon
			done
		fi

		local out tps
		out=$(run_pgbench -c "$clients" -j "$threads" -R "$rate" -T "$secs" -M prepared \
			-f "$work/horizon_$held.sql" 2>&1) || {
			echo "$out" >&2
			return 1
		}
		tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$out")
		local settled unpublished=""
		settled=$(settle_relay "${LATENCY_SETTLE_TIMEOUT:-120}") ||
			unpublished=" (not all published $settled)"
		# The statistics have counted every record of the run.
		for i in $(seq 1 50); do
			[ "$(sql_value "SELECT (SELECT coalesce(sum(n_tup_ins), 0) FROM pg_stat_user_tables WHERE relname ~ '^records_[0-2]\$' AND schemaname = 'obx') >= (SELECT count(*) FROM obx.records)")" = t ] && break
			sleep 0.2 # the statistics are flushed at most once a second
		done
		local dead held_xmin=""
		dead=$(($(sql_value "$horizon_dead_sql") - dead0))
		if [ $held = yes ]; then
			held_xmin=$(sql_value "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction' AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)")
			exec 7>&- 8>&- # end of input: both sessions end, rolled back
			wait $holder 2>/dev/null || true
		fi

		local res n p50 p99 pmax
		res=$(sql -tA -F' ' -c "
			WITH $(latency_ctes "$seq0" "$topic"),
			l AS (SELECT $commit_to_published AS ms FROM ev)
			SELECT count(*), round(percentile_disc(0.5) WITHIN GROUP (ORDER BY ms)::numeric, 1),
				   round(percentile_disc(0.99) WITHIN GROUP (ORDER BY ms)::numeric, 1),
				   round(max(ms)::numeric, 1)
			  FROM l" | tail -1)
		read -r n p50 p99 pmax <<<"$res"
		local label="nothing held"
		[ $held = yes ] && label="snapshot held ($held_xmin sessions holding the horizon)"
		rows="$rows
$label | $(calc "$tps" 0)/s, $n events$unpublished | $p50 | $p99 | $pmax | $dead | $(calc "$dead / ($n + 0.000001)" 4)"
		if [ $held = no ]; then p99_free=$p99; else
			p99_held=$p99
			dead_held=$(calc "$dead / ($n + 0.000001)" 4)
		fi
	done
	{
		echo "run | achieved | commit -> published_at p50 ms | p99 ms | max ms | dead tuples gained | per event"
		echo "${rows#?}"
	} | table
	local r
	r=$(ratio "$p99_held" "$p99_free")
	echo "target: p99 with a snapshot held ≤ 1.2 × without: ${r}× — $(verdict "$(awk -v v="$r" 'BEGIN { print (v ~ /^[0-9.]+$/ && v <= 1.2) }')")"
	echo "target: dead tuples per published event with a snapshot held: 0 — $dead_held — $(verdict "$(awk -v v="$dead_held" 'BEGIN { print (v + 0 == 0) }')")"
}

# The dead tuples of the publish path's tables (obx's events, claims,
# records, renewals, states, generations).
horizon_dead_sql="SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables
	WHERE schemaname = 'obx' AND relname ~ '^(events|claims|records|renewals)_[0-2]\$|^event_states\$|^generations\$'"
