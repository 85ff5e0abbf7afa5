# bench/bulk.sh: sourced by bench/run.  Benchmark 5, bulk enqueue (only
# when asked: bench/run bulk).
#
# A batch import that emits one event per row: pgbench transactions of
# 1,000 events each, three ways, with the same rows (key cus_NNNNN, the
# drain benchmark's ~180-byte payload from bench.make_payload):
#   - calls: 1,000 obx.enqueue calls in one statement (pgbench/bulk_calls.sql);
#   - many:  one obx.enqueue_many of the 1,000 rows (pgbench/bulk_many.sql);
#   - plain: one INSERT ... SELECT of the 1,000 rows into bench.plain_outbox,
#     the outbox's columns, defaults, sequence and indexes without obx
#     (pgbench/bulk_plain.sql): the database's own cost for the rows, the
#     baseline.
# The relay is paused (obx.workers = 0): this is the application's cost.
# BULK_CLIENTS pgbench clients (default: the number of cores) for
# BULK_SECONDS (default 5) per run; every run starts from an outbox and a
# plain table reset to the same 50,000 published rows (reset_outbox), and
# the runs go calls, many, plain, plain, many, calls, so that a drift of
# the machine's load hits every side alike; each figure is the mean of two
# runs.  Commits are durable (synchronous_commit on).

bench_bulk()
{
	local secs=${BULK_SECONDS:-5}
	local clients=${BULK_CLIENTS:-$(nproc)}
	local threads
	threads=$(pgbench_threads "$clients")

	echo
	echo "== 5. bulk enqueue: transactions of 1,000 events, relay paused, $clients clients, ${secs}s per run (load average $(machine_load))"

	reset_outbox
	pg_phase "obx.workers = 0"
	local kind out tps calls=0 many=0 plain=0
	for kind in calls many plain plain many calls; do
		reset_outbox
		out=$(run_pgbench -c "$clients" -j "$threads" -T "$secs" -M prepared \
			-f "$here/pgbench/bulk_$kind.sql" 2>&1) || {
			echo "$out" >&2
			return 1
		}
		tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$out")
		if [ -z "$tps" ]; then
			echo "bench: could not read pgbench's output:" >&2
			echo "$out" >&2
			return 1
		fi
		eval "$kind=\$(calc \"\$$kind + $tps * 1000 / 2\" 0)"
	done
	[ "$(sql_value "SELECT count(*) FROM obx.events WHERE topic = 'bench.bulk'")" -gt 0 ] || {
		echo "bench: the obx runs enqueued nothing" >&2
		return 1
	}

	{
		echo "1,000 events per transaction | events/s | ms per transaction | / INSERT ... SELECT"
		echo "1,000 obx.enqueue calls | $calls | $(calc "1000000 / $calls" 1) | $(ratio "$calls" "$plain")"
		echo "one obx.enqueue_many | $many | $(calc "1000000 / $many" 1) | $(ratio "$many" "$plain")"
		echo "baseline: one INSERT ... SELECT, no obx | $plain | $(calc "1000000 / $plain" 1) | 1.00"
	} | table
	local r
	r=$(ratio "$many" "$plain")
	echo "target: obx.enqueue_many ≥ 0.75x the INSERT ... SELECT's events/s: ${r}x — $(verdict "$(awk "BEGIN { print ($r >= 0.75) }")")"
	echo "(1,000 obx.enqueue calls: $(ratio "$calls" "$plain")x, shown for comparison)"
}
