# bench/outage.sh: sourced by bench/run.  Benchmark 10, the way back from
# an outage of every broker (only when asked: bench/run outage; the
# stand-in only, whose brokers go down and up on command).
#
# For each length of OUTAGE_SECONDS ("5 45": shorter and longer than
# obx.delivery_timeout, 30 s, so that the events of the second wait in
# librdkafka's queue and then fail and back off), OUTAGE_RUNS (3) times:
# with the relay running (obx's defaults) and its producer warm, every
# broker of the stand-in goes down; OUTAGE_EVENTS (100,000) events are
# committed in one statement; once a relay worker says "broker down" the
# brokers stay down for the outage's length and come back.  Then, from the
# events' published_at (the relay's record of the broker's ack): the time
# from the brokers' return to the first event published, to half of them
# and to the last.
# Issue 58's target: the backlog moves within 200 ms of the brokers'
# return.

bench_outage()
{
	echo
	if [ -n "$kafka_dir" ]; then
		echo "== 10. back from a broker outage: skipped (the stand-in only: its brokers go down on command)"
		return 0
	fi
	local lengths=${OUTAGE_SECONDS:-5 45} runs=${OUTAGE_RUNS:-3} n=${OUTAGE_EVENTS:-100000}
	local len run first half last firsts medians=() rows=""
	echo "== 10. back from a broker outage: $n events committed while every broker is down, $runs runs per outage length (load average $(machine_load))"
	pg_phase
	reset_outbox
	for len in $lengths; do
		firsts=()
		for ((run = 1; run <= runs; run++)); do
			read -r first half last <<<"$(outage_run "bench.outage.$len.$run" "$n" "$len")" || return 1
			firsts+=("$first")
			echo "outage of $len s, run $run: first event published $first ms after the brokers' return, half of them $half ms after, the last $last ms after"
			rows="$rows
$len s, run $run | $first | $half | $last"
		done
		medians+=("$(median "${firsts[@]}")")
		rows="$rows
$len s, median | ${medians[-1]} | - | -"
	done
	{
		echo "outage | brokers back -> first event published, ms | -> half of them, ms | -> the last, ms"
		echo "${rows#?}"
	} | table
	local worst
	worst=$(printf '%s\n' "${medians[@]}" | sort -g | tail -1)
	echo "target (issue 58): the backlog moves within 200 ms of the brokers' return: the slowest median $worst ms — $(verdict "$(awk -v w="$worst" 'BEGIN { print (w <= 200) }')")"
}

# outage_run TOPIC N SECONDS: one outage; prints the ms from the brokers'
# return to the first, the median and the last of the N events published.
outage_run()
{
	local topic=$1 n=$2 len=$3 back seq0
	# The producer knows the topic and its leaders before the outage, as a
	# running relay does.
	sql -q -c "SELECT obx.enqueue('$topic', 'warm', '{}')" >/dev/null
	settle_relay 60 >/dev/null || return 1
	seq0=$(sql_value "$last_seq_sql")
	mock_command "down all" || return 1
	sql -q -c "SELECT setseed(0.42)" -c "
		SELECT count(obx.enqueue('$topic', 'cus_' || lpad(k::text, 5, '0'), bench.make_payload(i, k)))
		  FROM (SELECT i, floor(random() * 10000)::int AS k FROM generate_series(1, $n) i) s" >/dev/null
	wait_for 120 "a relay worker to see the brokers down" outage_seen || return 1
	sleep "$len" # the outage's length: the scenario, not a wait for a condition
	mock_command "up all" || return 1
	back=$EPOCHREALTIME
	settle_relay 600 >/dev/null || return 1
	# When each event was first published, from the records (reading
	# obx.outbox_events' published_at for a topic reads the history).
	sql -tA -F' ' -c "
		WITH pub AS (
			SELECT x.id, min(x.t) AS t
			  FROM obx.records r, unnest(r.ids, r.published_at) AS x(id, t)
			 WHERE r.max_seq > $seq0 GROUP BY x.id)
		SELECT round((extract(epoch FROM min(pub.t)) - $back) * 1000),
			   round((extract(epoch FROM percentile_disc(0.5) WITHIN GROUP (ORDER BY pub.t)) - $back) * 1000),
			   round((extract(epoch FROM max(pub.t)) - $back) * 1000)
		  FROM obx.events e JOIN pub USING (id)
		 WHERE e.topic = '$topic' AND e.seq > $seq0"
}

outage_seen()
{
	[ "$(sql_value "SELECT count(*) FROM obx.workers WHERE state = 'broker down'")" -gt 0 ]
}
