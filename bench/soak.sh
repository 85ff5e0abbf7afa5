# bench/soak.sh: sourced by bench/run.  Benchmark 4, soak (only when asked).
#
# SOAK_EVENTS events (default 1,000,000) at SOAK_RATE events/s (default
# 2,000; pgbench --rate with 16 clients, one event per transaction) against obx with its
# defaults except obx.retention = SOAK_RETENTION (default 1min; obx's
# default is 7 days, which a run of minutes never reaches).  Every
# SOAK_SAMPLE_SECONDS the outbox's size, each index's size, the pending
# backlog and the retained published rows are sampled and printed as a
# table.  The outbox starts with rate x retention published rows spread
# over the retention period (what the steady state holds), analyzed.  The load keeps going until all events are
# enqueued; sampling then goes on until the backlog is empty.
#
# Baseline: the outbox rotates (docs/operations.md#retention): a generation
# is closed after half the retention and truncated a retention after it is
# done, so at steady state it holds between one and two retention periods
# of published events, plus up to 20 s of the rotation's 10 s steps:
# rate x (2 x retention + 20 s) rows at most.  Printed next to the
# retained rows observed, as a ratio.
#
# Verdicts: the backlog is bounded if pending stayed under 2 s of events
# (2 x rate) in the second half of the load; the size is bounded if the
# outbox's total size (events, claims, records: heap + indexes) at the end
# of the load is at most 2.25x its size one retention period + 30 s into
# the run (a truncation halves it, a generation doubles it).

bench_soak()
{
	local n=${SOAK_EVENTS:-1000000}
	local rate=${SOAK_RATE:-2000}
	local retention=${SOAK_RETENTION:-1min}
	local every=${SOAK_SAMPLE_SECONDS:-20}
	local clients threads
	clients=${SOAK_CLIENTS:-16}
	threads=$(pgbench_threads "$clients")
	local per_client=$(((n + clients - 1) / clients))
	local total=$((per_client * clients))

	echo
	echo "== 4. soak: $total events at $rate/s (~$((total / rate))s), obx.retention = '$retention' (load average $(machine_load))"

	bench_topic bench.soak
	pg_phase "obx.retention = '$retention'"
	local retention_s
	retention_s=$(sql_value "SELECT setting FROM pg_settings WHERE name = 'obx.retention'")
	sed "s/TOPIC/bench.soak/" "$here/pgbench/latency.sql" >"$work/soak.sql"
	chmod 644 "$work/soak.sql"
	# Start at the steady state the run should stay in: one retention
	# period's worth of published rows, published over that period.
	reset_outbox $((rate * retention_s)) "$retention_s"
	local seq0
	seq0=$(sql_value "$last_seq_sql")

	local t_start=$SECONDS
	run_pgbench -c "$clients" -j "$threads" -R "$rate" -t "$per_client" -M prepared \
		-f "$work/soak.sql" >"$work/soak_pgbench.log" 2>&1 &
	local pgbench_pid=$!
	bench_jobs="$bench_jobs $pgbench_pid"

	# The outbox's tables: the partitions of obx.events, obx.claims and obx.records.
	local indexes="events claims records"

	local samples="$work/soak_samples"
	: >"$samples"
	local loading=1 elapsed pending
	while :; do
		sleep "$every" # the sampling period
		elapsed=$((SECONDS - t_start))
		if [ $loading = 1 ] && ! kill -0 "$pgbench_pid" 2>/dev/null; then
			loading=0
			wait "$pgbench_pid" || {
				cat "$work/soak_pgbench.log" >&2
				return 1
			}
		fi
		soak_sample "$elapsed" "$loading" "$seq0" "$indexes" >>"$samples"
		pending=$(tail -1 "$samples" | cut -d'|' -f4)
		if [ $loading = 0 ] && [ "$pending" -eq 0 ]; then
			break
		fi
		if [ $elapsed -gt $((total / rate * 3 + 600)) ]; then
			echo "bench: soak: giving up, $pending events still pending after ${elapsed}s" >&2
			break
		fi
	done

	{
		echo "s | load | enqueued | pending | retained published | events heap MB | events indexes MB | claims MB | records MB | total MB | oldest pending s | dead tuples | autovacuums"
		cat "$samples"
	} | table

	local achieved lag
	achieved=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$work/soak_pgbench.log")
	lag=$(sed -n 's/^rate limit schedule lag: avg \([0-9.]*\) .*/\1/p' "$work/soak_pgbench.log")
	echo "load: $total events, achieved $(calc "${achieved:-0}" 0)/s (client schedule lag avg ${lag:-?} ms)"

	# Verdicts, from the samples taken under load.
	awk -F'|' -v rate="$rate" -v ret="$retention_s" -v tc=10 '
		function trim(s) { gsub(/^ +| +$/, "", s); return s }
		trim($2) == "yes" { n++; t[n] = trim($1) + 0; p[n] = trim($4) + 0; r[n] = trim($5) + 0; sz[n] = trim($tc) + 0 }
		END {
			if (n < 4) { print "too few samples under load for a verdict (run longer or sample more often)"; exit }
			maxp = 0
			for (i = int(n / 2) + 1; i <= n; i++) if (p[i] > maxp) maxp = p[i]
			printf "target: no pending backlog growth: max pending in the second half of the load %d (bound 2 x rate = %d) — %s\n", maxp, 2 * rate, (maxp <= 2 * rate) ? "met" : "NOT met"
			ref = 0
			for (i = 1; i <= n; i++) if (t[i] >= ret + 30) { ref = i; break }
			if (ref == 0 || ref == n) { print "size: the load ended before the purge reached its steady state (retention + 30 s); no verdict"; exit }
			expect = rate * (2 * ret + 20)
			printf "retained published rows at the end of the load: %d; expected at most rate x (2 x retention + 20 s) = %d; ratio %.2f\n", r[n], expect, r[n] / expect
			printf "target: outbox size bounded: %.1f MB at %d s, %.1f MB at the end of the load (%.2fx; bound 2.25x) — %s\n", sz[ref], t[ref], sz[n], sz[n] / sz[ref], (sz[n] <= 2.25 * sz[ref] && r[n] <= expect) ? "met" : "NOT met"
		}' "$samples"
}

# soak_sample ELAPSED LOADING SEQ0 TABLES: one "|"-separated row of the
# soak table.
soak_sample()
{
	sql -tA -F' | ' -c "
		WITH p AS (SELECT c.oid, c.relname FROM pg_class c
					WHERE c.relnamespace = 'obx'::regnamespace AND c.relkind = 'r'
					  AND c.relname ~ '^(events|claims|records|renewals)_[0-2]\$|^event_states\$'),
			 u AS (SELECT count(*) AS n, min(occurred_at) AS oldest FROM obx._unpublished_events)
		SELECT $1, CASE WHEN $2 = 1 THEN 'yes' ELSE 'no' END,
			   ($last_seq_sql) - $3,
			   u.n,
			   (SELECT count(*) FROM obx.events) - u.n,
			   (SELECT round(sum(pg_relation_size(oid)) / 1048576.0, 1) FROM p WHERE relname LIKE 'events%'),
			   (SELECT round(sum(pg_indexes_size(oid)) / 1048576.0, 1) FROM p WHERE relname LIKE 'events%'),
			   (SELECT round(sum(pg_total_relation_size(oid)) / 1048576.0, 1) FROM p WHERE relname LIKE 'claims%'),
			   (SELECT round(sum(pg_total_relation_size(oid)) / 1048576.0, 1) FROM p WHERE relname LIKE 'records%'),
			   (SELECT round(sum(pg_total_relation_size(oid)) / 1048576.0, 1) FROM p),
			   coalesce(round(extract(epoch FROM clock_timestamp() - u.oldest)::numeric, 1), 0),
			   (SELECT sum(n_dead_tup) FROM pg_stat_user_tables s JOIN p ON p.oid = s.relid),
			   (SELECT sum(autovacuum_count) FROM pg_stat_user_tables s JOIN p ON p.oid = s.relid)
		  FROM u"
}
