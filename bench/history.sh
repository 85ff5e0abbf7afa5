# bench/history.sh: sourced by bench/run.  Benchmark 9, a long published
# history (only when asked: bench/run history).
#
# What retained history costs: the same database grows through the sizes
# of HISTORY_SIZES (default "0 1000000 10000000 50000000" filled events),
# and at each size the same reads and the same relay work are measured.
#
# The fill: with the relay paused (obx.workers = 0), bench.fill_history
# (bench/sql/history.sql) writes the outbox's tables directly, set-based,
# HISTORY_BATCH events per transaction (default 1,000,000): the events
# (~200-byte payloads, 10,000 keys, topics bench.history.0 to .3,
# occurred_at over the past 3 days) and, per 1,000 of them, a claim and its
# record, as the relay leaves a published batch (and a row per batch and
# topic in obx.published_counts where that table exists), then a tick above
# them all, so that every filled event counts as published.  Then VACUUM
# (ANALYZE) of the outbox's tables, as autovacuum would have done, and a
# CHECKPOINT.  Checked: nothing pending (the sets obx.status counts as
# pending and leased: lib.sh's pending_sql) and the count of obx.events.
#
# At each size, with the relay running (obx's defaults, and
# track_commit_timestamp on in every phase but the fill's), the drain and
# the latency run below, then:
#   - reads, once no record is of the last minute (what
#     obx.publish_latency_summary reads is then the same at every size):
#     each view read whole (obx.status, obx.publish_latency_summary,
#     obx.publish_latency, obx.quarantine, obx.workers, obx.consumers,
#     obx.landed_status, obx.leases), every query of
#     monitoring/obx-queries.yaml (read from the file, python3-yaml), the
#     unpublished events of one topic counted through obx.outbox_events
#     (by state, and by published_at IS NULL, which reads the history),
#     and one filled event looked up there by id.  With jit as
#     HISTORY_JIT says (default on, the server's default: a plan whose
#     estimates grew with the history would be compiled on every read).
#     Each is timed on the server (bench.time_read: planning and
#     execution, every row and column, between two clock_timestamp()),
#     5 times in one session; the
#     median is printed.  statement_timeout HISTORY_TIMEOUT (default 60 s)
#     per run: a read that hits it prints ">60000" and is not run again;
#     one that fails prints "error";
#   - the drain: 100,000 events (HISTORY_DRAIN_EVENTS) enqueued with the
#     relay paused, in one statement as the drain benchmark does, VACUUM
#     ANALYZE obx.events, CHECKPOINT, then the relay starts: seconds from
#     the workers' start to the first 50 ms poll that finds nothing
#     pending (drain.sh's drain_poll), and that it published exactly those
#     events (no history sent again); WAL per enqueued event (the enqueue's
#     statement) and per published event (server restart to drained), from
#     pg_current_wal_lsn;
#   - the latency: commit → published_at p99 at a steady 2,000 events/s
#     (HISTORY_RATE) for 20 s (HISTORY_LATENCY_SECONDS), HISTORY_LATENCY_RUNS
#     times (default 3, medians reported), measured as
#     latency.sh does (pgbench/latency.sql, 16 clients, a 3 s warm-up not
#     measured, commit times from track_commit_timestamp, published_at
#     from the records), and the relay workers' CPU per 1,000 events from
#     the load's start until all is published;
#   - storage: bytes per retained event of obx.events' heap (the
#     partitions' tables, TOAST included), of its indexes, and of
#     obx.records and obx.claims (heap and indexes, and
#     obx.published_counts where it exists), from the growth between two
#     sizes (measured after each fill, before the drain).
# The drain's and the latency run's events stay, as history too.
#
# Targets (issue 57): every figure at the largest size within 1.25x of the
# figure at 0 (storage: of the first size above 0), and obx.status and
# every exporter query under 50 ms at the largest size.

# Per size and measure (hist["SIZE,measure"]), and the reads' names in order.
declare -A hist=()
history_reads=()

bench_history()
{
	local sizes=${HISTORY_SIZES:-0 1000000 10000000 50000000}
	local size prev="" t

	echo
	echo "== 9. a long published history: reads, drain and latency at $(echo $sizes | sed 's/ /, /g') filled events (load average $(machine_load))"

	bench_topic bench.history.0 bench.history.1 bench.history.2 bench.history.3 \
		bench.history.drain bench.history.latency
	sql -f "$here/sql/history.sql" >/dev/null
	sql -c "TRUNCATE obx.events, obx.claims, obx.records, obx.renewals, obx.event_states" >/dev/null
	sql -tA -c "SELECT to_regclass('obx.published_counts') IS NOT NULL" | grep -q t &&
		sql -c "TRUNCATE obx.published_counts" >/dev/null
	history_queries
	echo "obx.published_counts: $(sql_value "SELECT CASE WHEN to_regclass('obx.published_counts') IS NULL THEN 'absent (not filled)' ELSE 'present, filled per batch and topic' END")"

	for size in $sizes; do
		t=$SECONDS
		history_fill "$size"
		history_storage "$size" "$prev"
		history_drain "$size"
		history_latency "$size"
		# The reads after the relay's work, at every size 0's included:
		# read before it, size 0 had no claim and no record at all, which
		# no outbox in use has.  And the same reads at every size: no
		# record in the last minute's window of
		# obx.publish_latency_summary.
		wait_for 120 "the last minute to hold no record" \
			nothing_recorded_lately
		history_read_all "$size"
		echo "size $size: done in $((SECONDS - t)) s (fill ${hist[$size,fill_s]} s, vacuum/analyze/checkpoint ${hist[$size,vacuum_s]} s, reads ${hist[$size,reads_s]} s, drain and latency ${hist[$size,relay_s]} s)"
		prev=$size
	done
	history_report "$sizes"
}

# Succeeds when no record is of the last minute (plus a second).
nothing_recorded_lately()
{
	[ "$(sql_value "SELECT count(*) FROM obx.records WHERE recorded_at > now() - interval '61 s'")" = 0 ]
}

# history_queries: the reads, as "name<TAB>query" lines in
# $work/history_queries.tsv: the views, then every query of
# monitoring/obx-queries.yaml (one line each), then the two reads of
# obx.outbox_events (the id is filled in per size).
history_queries()
{
	{
		printf '%s\t%s\n' status "SELECT * FROM obx.status" \
			latency_summary "SELECT * FROM obx.publish_latency_summary" \
			publish_latency "SELECT * FROM obx.publish_latency" \
			quarantine "SELECT * FROM obx.quarantine" \
			workers "SELECT * FROM obx.workers" \
			consumers "SELECT * FROM obx.consumers" \
			landed_status "SELECT * FROM obx.landed_status" \
			leases "SELECT * FROM obx.leases"
		python3 - "$root/monitoring/obx-queries.yaml" <<'EOF'
import sys
import yaml

with open(sys.argv[1]) as f:
    for name, spec in yaml.safe_load(f).items():
        print("exporter:%s\t%s" % (name, " ".join(str(spec["query"]).split()).rstrip(";")))
EOF
		printf '%s\t%s\n' pending_topic "SELECT count(*) FROM obx.outbox_events WHERE state <> 'published' AND topic = 'bench.history.1'" \
			pending_topic_published_at "SELECT count(*) FROM obx.outbox_events WHERE published_at IS NULL AND topic = 'bench.history.1'" \
			by_id "SELECT * FROM obx.outbox_events WHERE id = ':event_id'"
	} >"$work/history_queries.tsv"
	mapfile -t history_reads < <(cut -f1 "$work/history_queries.tsv")
}

# history_fill SIZE: grow the filled history to SIZE events (relay
# paused), vacuum, analyze and checkpoint, and check that nothing is
# pending and the count is right.
history_fill()
{
	local size=$1 have n t0 batch=${HISTORY_BATCH:-1000000}
	# No commit timestamps for the fill's million empty transactions.
	pg_phase "obx.workers = 0"
	have=${hist[filled]:-0}
	n=$((size - have))
	[ "$n" -ge 0 ] || {
		echo "bench: HISTORY_SIZES must grow: $size after $have" >&2
		return 1
	}
	t0=$EPOCHREALTIME
	sql -c "CALL bench.fill_history($n, $batch)" >/dev/null
	hist[$size,fill_s]=$(calc "$EPOCHREALTIME - $t0" 1)
	hist[filled]=$size
	t0=$EPOCHREALTIME
	sql -c "VACUUM (ANALYZE) obx.events" -c "VACUUM (ANALYZE) obx.claims" -c "VACUUM (ANALYZE) obx.records" \
		-c "VACUUM (ANALYZE) obx.event_states" -c "CHECKPOINT" >/dev/null
	[ "$(sql_value "SELECT to_regclass('obx.published_counts') IS NOT NULL")" = t ] &&
		sql -c "VACUUM (ANALYZE) obx.published_counts" >/dev/null
	hist[$size,vacuum_s]=$(calc "$EPOCHREALTIME - $t0" 1)

	local check counted="-"
	check=$(sql -tA -F' ' -c "SELECT ($pending_sql), count(*), count(*) FILTER (WHERE topic LIKE 'bench.history._'), (SELECT count(*) FROM obx.claims), (SELECT coalesce(sum(cardinality(ids)), 0) FROM obx.records) FROM obx.events")
	local pending total filled claims recorded
	read -r pending total filled claims recorded <<<"$check"
	hist[$size,events]=$total
	[ "$(sql_value "SELECT to_regclass('obx.published_counts') IS NOT NULL")" = t ] &&
		counted=$(sql_value "SELECT coalesce(sum(published), 0) FROM obx.published_counts")
	echo "size $size: filled $n events in ${hist[$size,fill_s]} s ($(calc "$n > 0 ? ${hist[$size,fill_s]} * 1000000 / $n : 0" 1) s per million), VACUUM (ANALYZE) and CHECKPOINT ${hist[$size,vacuum_s]} s; check: pending $pending (must be 0), obx.events $total rows of which $filled filled (must be $size), $claims claims, the records hold $recorded events (obx.published_counts: $counted)"
	[ "$pending" = 0 ] && [ "$filled" = "$size" ] || {
		echo "bench: the fill left $pending pending, $filled filled events (expected 0 and $size)" >&2
		return 1
	}
}

# history_storage SIZE PREV: the outbox's sizes at SIZE, and per event
# retained since PREV.
history_storage()
{
	local size=$1 prev=$2 heap idx rc
	read -r heap idx rc <<<"$(sql -tA -F' ' -c "
		WITH leaf AS (
			SELECT p.relid, r.rel FROM unnest(ARRAY['obx.events', 'obx.claims', 'obx.records']) r(rel),
				   pg_partition_tree(r.rel::regclass) p WHERE p.isleaf)
		SELECT (SELECT sum(pg_table_size(relid)) FROM leaf WHERE rel = 'obx.events'),
			   (SELECT sum(pg_indexes_size(relid)) FROM leaf WHERE rel = 'obx.events'),
			   (SELECT sum(pg_total_relation_size(relid)) FROM leaf WHERE rel <> 'obx.events')
				 + coalesce(pg_total_relation_size(to_regclass('obx.published_counts')), 0)")"
	hist[$size,heap]=$heap
	hist[$size,idx]=$idx
	hist[$size,rc]=$rc
	local m d
	for m in heap idx rc; do
		d="-"
		if [ -n "$prev" ] && [ "${hist[$size,events]}" -gt "${hist[$prev,events]}" ]; then
			d=$(calc "(${hist[$size,$m]} - ${hist[$prev,$m]}) / (${hist[$size,events]} - ${hist[$prev,events]})" 1)
		fi
		hist[$size,${m}_per]=$d
	done
}

# history_read QUERY: the median of 5 server-side timings of QUERY in
# milliseconds, ">TIMEOUT" when a run hit HISTORY_TIMEOUT, "error" when it
# failed otherwise (the error on stderr).
history_read()
{
	local q=$1 i out timeout=${HISTORY_TIMEOUT:-60}
	out=$({
		echo "SET statement_timeout = '${timeout}s';"
		echo "SET jit = ${HISTORY_JIT:-on};"
		for i in 1 2 3 4 5; do
			echo "SELECT bench.time_read(\$read\$$q\$read\$);"
		done
	} | sql -tA 2>"$work/history_read.err") || true
	if [ "$(grep -c . <<<"$out")" -lt 5 ]; then
		if grep -q "statement timeout" "$work/history_read.err"; then
			echo ">$((timeout * 1000))"
		else
			echo "bench: history read failed: $q: $(cat "$work/history_read.err")" >&2
			echo "error"
		fi
		return 0
	fi
	calc "$(sort -g <<<"$out" | sed -n 3p)" 2
}

# history_read_all SIZE: every read of $work/history_queries.tsv at SIZE.
history_read_all()
{
	local size=$1 name q id t0=$SECONDS
	id=$(sql_value "SELECT id FROM obx.events WHERE seq >= (SELECT (min(seq) + max(seq)) / 2 FROM obx.events) AND topic LIKE 'bench.history._' ORDER BY seq LIMIT 1")
	[ -n "$id" ] || id=00000000-0000-7000-8000-000000000000
	while IFS=$'\t' read -r name q; do
		hist[$size,$name]=$(history_read "${q//:event_id/$id}")
	done <"$work/history_queries.tsv"
	hist[$size,reads_s]=$((SECONDS - t0))
}

# history_drain SIZE: HISTORY_DRAIN_EVENTS enqueued with the relay paused,
# then drained by the relay; the seconds, and the WAL of each part.
history_drain()
{
	local size=$1 n=${HISTORY_DRAIN_EVENTS:-100000} t0=$SECONDS
	local lsn0 lsn1 lease0 t_end started
	pg_phase "obx.workers = 0" "track_commit_timestamp = on"
	lsn0=$(sql_value "SELECT pg_current_wal_lsn()")
	sql -tA -c "SELECT setseed(0.42)" -c "
		SELECT count(obx.enqueue('bench.history.drain', 'cus_' || lpad(k::text, 5, '0'), bench.make_payload(i, k)))
		  FROM (SELECT i, floor(random() * 10000)::int AS k FROM generate_series(1, $n) i) s" >/dev/null
	lsn1=$(sql_value "SELECT pg_current_wal_lsn()")
	hist[$size,wal_enq]=$(sql_value "SELECT round(pg_wal_lsn_diff('$lsn1', '$lsn0') / $n)")
	sql -c "VACUUM ANALYZE obx.events" -c "CHECKPOINT" >/dev/null
	lease0=$(sql_value "SELECT coalesce(max(lease_id), 0) FROM obx.claims")

	lsn0=$(sql_value "SELECT pg_current_wal_lsn()")
	pg_phase "track_commit_timestamp = on"
	t_end=$(drain_poll "$n" "${DRAIN_TIMEOUT:-900}") || {
		echo "bench: obx did not drain $n events within ${DRAIN_TIMEOUT:-900}s; $(sql_value "$pending_sql") still pending" >&2
		return 1
	}
	lsn1=$(sql_value "SELECT pg_current_wal_lsn()")
	started=$(sql_value "SELECT extract(epoch FROM min(started_at)) FROM obx.workers")
	hist[$size,drain_s]=$(calc "$t_end - $started" 2)
	hist[$size,drain_rate]=$(calc "$n / ${hist[$size,drain_s]}" 0)
	hist[$size,drain_cpu]=$(per_k "$(cpu_ms $(relay_pids))" "$n")
	hist[$size,wal_pub]=$(sql_value "SELECT round(pg_wal_lsn_diff('$lsn1', '$lsn0') / $n)")
	local sent
	sent=$(sql_value "
		WITH x AS (SELECT u.id FROM obx.records r, unnest(r.ids) AS u(id) WHERE r.lease_id > $lease0)
		SELECT count(*) || ' events, ' || (SELECT count(DISTINCT x.id) FROM x JOIN obx.events e USING (id) WHERE e.topic = 'bench.history.drain') || ' distinct drained events' FROM x")
	echo "size $size: drained $n events in ${hist[$size,drain_s]} s; the records written since hold $sent (must be $n and $n: no history sent again)"
	hist[$size,relay_t0]=$t0
}

# history_latency SIZE: commit → published_at at a steady HISTORY_RATE, as
# latency.sh measures it, and the relay's CPU per 1,000 events; measured
# HISTORY_LATENCY_RUNS times (default 3), each run's figures printed and
# their medians kept.
history_latency()
{
	local size=$1 rate=${HISTORY_RATE:-2000} secs=${HISTORY_LATENCY_SECONDS:-20}
	local clients=${LATENCY_CLIENTS:-16} threads topic=bench.history.latency
	local runs=${HISTORY_LATENCY_RUNS:-3} run p50s=() p99s=() cpus=()
	threads=$(pgbench_threads "$clients")
	sed "s/TOPIC/$topic/" "$here/pgbench/latency.sql" >"$work/history_latency.sql"
	chmod 644 "$work/history_latency.sql"
	# Warm-up, not measured: the producers learn the topic's metadata.
	run_pgbench -c "$clients" -j "$threads" -R "$rate" -T 3 -M prepared \
		-f "$work/history_latency.sql" >/dev/null 2>&1 || true
	settle_relay 120 >/dev/null || true

	for ((run = 1; run <= runs; run++)); do
		local seq0 relays relay0 settled
		seq0=$(sql_value "$last_seq_sql")
		relays=$(relay_pids)
		relay0=$(cpu_ms $relays)
		run_pgbench -c "$clients" -j "$threads" -R "$rate" -T "$secs" -M prepared \
			-f "$work/history_latency.sql" >"$work/history_latency.log" 2>&1 || {
			cat "$work/history_latency.log" >&2
			return 1
		}
		settled=$(settle_relay "${LATENCY_SETTLE_TIMEOUT:-120}") || true
		local relay_ms=$(($(cpu_ms $relays) - relay0))
		local events p50 p99 cpu
		read -r events p50 p99 <<<"$(sql -tA -F' ' -c "
			WITH $(latency_ctes "$seq0" "$topic"),
			l AS (SELECT $commit_to_published AS up FROM ev)
			SELECT count(*), round(percentile_disc(0.5) WITHIN GROUP (ORDER BY up)::numeric, 1),
				   round(percentile_disc(0.99) WITHIN GROUP (ORDER BY up)::numeric, 1)
			  FROM l")"
		cpu=$(per_k "$relay_ms" "$events")
		p50s+=("$p50")
		p99s+=("$p99")
		cpus+=("$cpu")
		echo "size $size, run $run of $runs: $events events at $rate/s for ${secs} s, commit → published_at p50 $p50 ms, p99 $p99 ms, all published after ${settled} s; relay CPU $cpu ms per 1,000 events"
	done
	hist[$size,p50]=$(median "${p50s[@]}")
	hist[$size,p99]=$(median "${p99s[@]}")
	hist[$size,cpu]=$(median "${cpus[@]}")
	hist[$size,cpu_runs]=$(
		IFS=/
		echo "${cpus[*]}"
	)
	hist[$size,relay_s]=$((SECONDS - ${hist[$size,relay_t0]}))
}

# history_report SIZES: the tables, one row per size, the ratios of the
# largest size to 0 and the verdicts.
history_report()
{
	local sizes=$1 size name hdr row
	echo
	echo "Fill and storage (bytes per event retained since the size before; events include the earlier sizes' drain and latency events)"
	{
		echo "filled events | obx.events rows | fill s | vacuum, analyze, checkpoint s | events heap B/event | events indexes B/event | records, claims, published_counts B/event"
		for size in $sizes; do
			echo "$size | ${hist[$size,events]} | ${hist[$size,fill_s]} | ${hist[$size,vacuum_s]} | ${hist[$size,heap_per]} | ${hist[$size,idx_per]} | ${hist[$size,rc_per]}"
		done
	} | table

	local kind
	for kind in views exporter; do
		echo
		if [ "$kind" = views ]; then
			echo "Reads with jit = ${HISTORY_JIT:-on}, ms (server-side, median of 5): the views read whole, and obx.outbox_events (pending_topic: the unpublished events of bench.history.1 counted by state, pending_topic_published_at: the same by published_at IS NULL, which reads the history; by_id: one filled event)"
		else
			echo "Reads with jit = ${HISTORY_JIT:-on}, ms (server-side, median of 5): the queries of monitoring/obx-queries.yaml"
		fi
		{
			hdr="filled events"
			for name in "${history_reads[@]}"; do
				history_is_kind "$name" "$kind" && hdr="$hdr | ${name#exporter:}"
			done
			echo "$hdr"
			for size in $sizes; do
				row=$size
				for name in "${history_reads[@]}"; do
					history_is_kind "$name" "$kind" && row="$row | ${hist[$size,$name]}"
				done
				echo "$row"
			done
		} | table
	done

	echo
	echo "The relay: a drain of ${HISTORY_DRAIN_EVENTS:-100000} events (enqueued with the relay paused), and ${HISTORY_RATE:-2000} events/s for ${HISTORY_LATENCY_SECONDS:-20} s (medians of ${HISTORY_LATENCY_RUNS:-3} runs; the CPU of each run after them)"
	{
		echo "filled events | drain s | drain events/s | WAL B/enqueued event | WAL B/published event | commit -> published_at p50 ms | p99 ms | relay CPU ms/1,000 events | each run"
		for size in $sizes; do
			echo "$size | ${hist[$size,drain_s]} | ${hist[$size,drain_rate]} | ${hist[$size,wal_enq]} | ${hist[$size,wal_pub]} | ${hist[$size,p50]} | ${hist[$size,p99]} | ${hist[$size,cpu]} | ${hist[$size,cpu_runs]}"
		done
	} | table
	history_verdicts "$sizes"
}

# history_is_kind NAME views|exporter: whether the read NAME is of that table.
history_is_kind()
{
	if [[ $1 == exporter:* ]]; then
		[ "$2" = exporter ]
	else
		[ "$2" = views ]
	fi
}

# history_verdicts SIZES: each figure at the largest size against 0 (the
# storage figures against the first size above 0), and the 50 ms target.
history_verdicts()
{
	local sizes=$1 first="" last="" base s m name
	for s in $sizes; do
		[ -z "$first" ] && first=$s
		last=$s
	done
	base=$(awk '{ print $2 }' <<<"$sizes")
	echo
	echo "At $last filled events against $first (target: within 1.25x)"
	{
		echo "figure | at $first | at $last | ratio | within 1.25x"
		for m in drain_s wal_enq wal_pub p99 cpu "${history_reads[@]}"; do
			history_ratio_row "$m" "$first" "$last"
		done
		if [ -n "$base" ] && [ "$base" != "$last" ]; then
			for m in heap_per idx_per rc_per; do
				history_ratio_row "$m" "$base" "$last"
			done
		fi
	} | table

	local ok=1 slow="" v
	for name in "${history_reads[@]}"; do
		[ "$name" = status ] || [[ $name == exporter:* ]] || continue
		v=${hist[$last,$name]}
		if ! awk -v v="$v" 'BEGIN { exit !(v ~ /^[0-9.]+$/ && v < 50) }'; then
			ok=0
			slow="$slow, ${name#exporter:} $v ms"
		fi
	done
	echo "target: obx.status and every exporter query under 50 ms at $last filled events — $(verdict $ok)${slow:+ (over:${slow#,})}"
}

# history_ratio_row MEASURE FROM TO: one row of the ratio table.
history_ratio_row()
{
	local m=$1 a=${hist[$2,$1]:-} b=${hist[$3,$1]:-} r label
	case "$m" in
	drain_s) label="drain of ${HISTORY_DRAIN_EVENTS:-100000} events, s" ;;
	wal_enq) label="WAL per enqueued event, B" ;;
	wal_pub) label="WAL per published event, B" ;;
	p99) label="commit -> published_at p99 at ${HISTORY_RATE:-2000}/s, ms" ;;
	cpu) label="relay CPU per 1,000 events at ${HISTORY_RATE:-2000}/s, ms" ;;
	heap_per) label="obx.events heap per event, B (at $2: the growth to $2)" ;;
	idx_per) label="obx.events indexes per event, B (at $2: the growth to $2)" ;;
	rc_per) label="obx.records, obx.claims, obx.published_counts per event, B (at $2: the growth to $2)" ;;
	exporter:*) label="read ${m#exporter:} (exporter query), ms" ;;
	*) label="read $m, ms" ;;
	esac
	r=$(ratio "$b" "$a")
	echo "$label | $a | $b | $r | $(verdict "$(awk -v r="$r" 'BEGIN { print (r ~ /^[0-9.]+$/ && r <= 1.25) }')")"
}
