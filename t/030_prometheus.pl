# Monitoring: monitoring/obx-queries.yaml served by the real
# prometheus-postgres-exporter (Debian package) shows what obx's own views
# say.
#
# A node with two relay workers publishes events to the Kafka stand-in.
# One event is refused for good (a payload over the producer's
# message.max.bytes: MSG_SIZE_TOO_LARGE, a permanent error) and
# quarantined, holding back two later events of its key; then the limit is
# raised and the event retried; then the brokers go down and come back;
# then a worker is terminated and comes back (obx.workers shows "stopped"
# exactly while it has no process).
# After each step the exporter, running as a role with only obx's
# documented monitoring grants, is scraped over HTTP and every obx metric
# is compared with obx.status and obx.workers: per-topic pending, leased,
# quarantined, failing, published and oldest pending age; per-worker state,
# up, published, errors and batches counters; the published/errors totals.
# The counters equal what reached the broker, which is checked by event id
# (the numbers an operator alerts on tell the truth).
#
# Publish latency: after each step the histogram obx_publish_latency_seconds
# must hold, per topic and bucket, exactly the counts the test computes
# itself from every published event's published_at - occurred_at, and its
# count and sum must match; each event's Kafka timestamp (set when the
# relay produced it) lies between the two.  The one-minute p50 and p99
# equal the test's own percentiles of those latencies.  Beyond 64 topics
# the events are counted under "(other)", none lost or counted twice.
#
# No silent dead end: obx.workers names the database its workers serve;
# a database that obx.database does not name gets a warning from CREATE
# EXTENSION and its first enqueue, and obx.status says why its events
# stay pending; obx_relay_served is 1 for the served database.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxMetrics;
use ObxTest;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $t0 = time();
my $orders = 'orders.metrics.v1';
my $payments = 'payments.metrics.v1';
my @states = ('not started', 'starting', 'idle', 'producing', 'backing off',
	'broker down', 'standby', 'waiting for extension', 'waiting for role', 'logical replica',
	'stopping', 'stopped');

my $mock = start_mock();
# The poison is deterministic, as in t/022: enqueue accepts up to 1 MB,
# the producer refuses messages over 20 kB.  'log' level: the relays'
# "Kafka settings changed" lines are awaited below.
my $node = obx_node('prometheus', $mock,
	'obx.workers' => 2,
	'obx.kafka_properties' => "'message.max.bytes=20000'",
	'obx.max_payload_size' => "'1MB'",
	'log_min_messages' => 'log');
relay_ready($node, 2);

# The exporter connects as a role with only the monitoring grants.
grant_monitoring($node, 'obx_exporter');
my $exp = start_exporter($node, user => 'obx_exporter');
my $m = parse_metrics(scrape($exp));

is(sample($m, 'pg_up'), '1', 'the exporter reaches PostgreSQL');
is(sample($m, 'pg_exporter_user_queries_load_error'), '0', 'the queries file loads');
is(sample($m, 'pg_exporter_last_scrape_error'), '0', 'every obx query runs as the monitoring role');
my %types = (
	obx_topic_pending => 'gauge', obx_topic_leased => 'gauge',
	obx_topic_quarantined => 'gauge', obx_topic_failing => 'gauge',
	obx_topic_published_retained => 'gauge',
	obx_topic_oldest_pending_age_seconds => 'gauge',
	obx_topic_last_published_timestamp_seconds => 'gauge',
	obx_topic_last_error_timestamp_seconds => 'gauge',
	obx_worker_up => 'gauge', obx_worker_state => 'gauge',
	obx_worker_batches_total => 'counter', obx_worker_published_total => 'counter',
	obx_worker_errors_total => 'counter',
	obx_worker_last_success_age_seconds => 'gauge',
	obx_worker_start_time_seconds => 'gauge',
	obx_worker_last_error_timestamp_seconds => 'gauge',
	obx_publish_errors_total => 'counter', obx_publish_published_total => 'counter',
	obx_relay_served => 'gauge', obx_publish_latency_seconds => 'histogram',
	obx_publish_latency_window_p50_seconds => 'gauge',
	obx_publish_latency_window_p99_seconds => 'gauge',
	obx_publish_latency_window_events => 'gauge');
my %absent_before_events = map { $_ => 1 } grep { /^obx_topic_|^obx_publish_latency/ } keys %types;
for my $name (sort keys %types)
{
	next if $absent_before_events{$name};
	is($m->{type}{$name}, $types{$name}, "$name is exported as a $types{$name}");
}
is(scalar(samples($m, 'obx_topic_pending')), 0, 'no topic series before the first event');
is(scalar(samples($m, 'obx_publish_latency_seconds_count')), 0,
	'no latency series before the first publish');
is(sample($m, 'obx_relay_served'), '1', 'obx_relay_served: the relay serves database postgres');
is(scalar(samples($m, 'obx_worker_state')), 2 * @states,
	'one state series per worker and state');
check_workers($m, 'before any event', 0, 0);

#
# Step 1: 30 events in 10 transactions over 5 keys, all published.
#
my %committed;    # topic => { id => 1 }
for my $tx (1 .. 10)
{
	my $sql = "BEGIN;\n";
	$sql .= "SELECT obx.enqueue('$orders', 'ord_" . (($tx + $_) % 5) . "', '{\"tx\": $tx}');\n"
	  for 1 .. 3;
	$sql .= "COMMIT;\n";
	$committed{$orders}{$_} = 1 for grep { length } split /\n/, $node->safe_psql('postgres', $sql);
}
is(scalar(keys %{ $committed{$orders} }), 30, '30 events committed');
ok(all_published($node), 'all 30 published');
broker_holds($orders);

$m = wait_metrics('the published counters to reach 30 with every worker idle', sub {
	my $m = shift;
	sum_of($m, 'obx_worker_published_total') == 30 && all_in_state($m, 'idle') });
check_topics($m, 'after 30 published');
check_workers($m, 'after 30 published', 30, 0);
check_latency('after 30 published');
is(sample($m, 'obx_topic_published_retained', topic => $orders), '30',
	'published_retained counts the 30 events');
is(sample($m, 'obx_topic_oldest_pending_age_seconds', topic => $orders), '0',
	'nothing pending: oldest pending age 0');
cmp_ok(sample($m, 'obx_topic_last_published_timestamp_seconds', topic => $orders), '>', $t0 - 1,
	'last published timestamp is recent');
ok(grep({ $_->{value} <= time() - $t0 + 1 } samples($m, 'obx_worker_last_success_age_seconds')) >= 1,
	'a worker that published reports a recent last success');
my %prev = counters($m);

#
# Step 2: one event can never be sent as it is; it is quarantined and
# holds back the two later events of its key, while another key flows.
# The poison and the other key's event commit together, so one worker
# claims both in one batch: one failure, one success.
#
my ($poison, $other) = split /\n/, $node->safe_psql('postgres', qq{
	BEGIN;
	SELECT obx.enqueue('$payments', 'pay_1', jsonb_build_object('n', 1, 'blob', repeat('x', 50000)));
	SELECT obx.enqueue('$payments', 'pay_2', '{"n": 2}');
	COMMIT;});
$committed{$payments}{$_} = 1 for $poison, $other;
$node->poll_query_until('postgres',
	"SELECT count(*) = 1 FROM obx.quarantine WHERE id = '$poison'")
  or die 'the rejected event was not quarantined';
$node->poll_query_until('postgres',
	"SELECT published_at IS NOT NULL FROM obx.outbox_events WHERE id = '$other'")
  or die 'the event of the other key was not published';
for my $n (3, 4)
{
	$committed{$payments}{ $node->safe_psql('postgres',
		"SELECT obx.enqueue('$payments', 'pay_1', '{\"n\": $n}')") } = 1;
}

$m = wait_metrics('the quarantine to show', sub {
	my $m = shift;
	(sample($m, 'obx_topic_quarantined', topic => $payments) // -1) == 1
	  && sum_of($m, 'obx_worker_published_total') == 31
	  && sum_of($m, 'obx_worker_errors_total') == 1 });
check_topics($m, 'after the quarantine');
is(sample($m, 'obx_topic_pending', topic => $payments), '2',
	'the two events held back by the quarantined one are pending');
is(sample($m, 'obx_topic_quarantined', topic => $payments), '1', 'one event quarantined');
is(sample($m, 'obx_topic_failing', topic => $payments), '0',
	'failing excludes the quarantined event');
is(sample($m, 'obx_topic_published_retained', topic => $payments), '1',
	'the other key was published');
cmp_ok(sample($m, 'obx_topic_oldest_pending_age_seconds', topic => $payments), '>', 0,
	'the oldest pending age of the blocked topic is above 0');
cmp_ok(sample($m, 'obx_topic_last_error_timestamp_seconds', topic => $payments), '>', $t0 - 1,
	'the error timestamp is recent');
is(sample($m, 'obx_publish_errors_total'), '1', 'obx_publish_errors_total counts the rejection');
check_workers($m, 'after the quarantine', 31, 1);
check_monotonic($m, \%prev, 'after the quarantine');
%prev = counters($m);
my $msgs = read_topic($mock, $payments);
is_deeply([ map { $_->{key} } @$msgs ], ['pay_2'],
	'the broker holds only the event of the unblocked key');

ok(wait_metrics_for('every worker idle after the quarantine',
	sub { all_in_state(shift, 'idle') }, 5),
	'nothing is backing off (the failure was quarantined): every worker shows idle');

#
# Step 3: the cause is removed (a larger message.max.bytes; each relay
# rebuilds its producer before its next claim), obx.retry sends the
# quarantined event, then the two behind it.
#
my $log_offset = -s $node->logfile;
$node->safe_psql('postgres', q{
	ALTER SYSTEM SET obx.kafka_properties = 'message.max.bytes=1000000';
	SELECT pg_reload_conf();});
wait_until(sub {
	my %w = map { $_ => 1 } (slurp_file($node->logfile, $log_offset)
		=~ /obx relay (\d+): Kafka settings changed, rebuilding the producer/g);
	keys(%w) == 2 }, 'both relays to take the new Kafka settings');
is($node->safe_psql('postgres', "SELECT obx.retry('$poison')"), 't', 'obx.retry accepts it');
ok(all_published($node), 'everything published after the retry');
$m = wait_metrics('the counters to reach 34', sub {
	my $m = shift;
	sum_of($m, 'obx_worker_published_total') == 34
	  && (sample($m, 'obx_topic_pending', topic => $payments) // -1) == 0 });
check_topics($m, 'after the retry');
check_latency('after the retry');
is(sample($m, 'obx_topic_quarantined', topic => $payments), '0', 'quarantine empty');
is(sample($m, 'obx_topic_oldest_pending_age_seconds', topic => $payments), '0',
	'oldest pending age back to 0');
is(sample($m, 'obx_publish_published_total'), '34', 'obx_publish_published_total is 34');
check_workers($m, 'after the retry', 34, 1);
check_monotonic($m, \%prev, 'after the retry');
%prev = counters($m);
broker_holds($payments);

#
# Step 4: the brokers go down with events in flight: the state gauge shows
# it, the events wait (leased or pending) and age; the brokers come back
# and the events are published.
#
mock_cmd($mock, 'down all');
my $sql = "BEGIN;\n";
$sql .= "SELECT obx.enqueue('$orders', 'ord_$_', '{\"down\": true}');\n" for 1 .. 5;
$sql .= "COMMIT;\n";
$committed{$orders}{$_} = 1 for grep { length } split /\n/, $node->safe_psql('postgres', $sql);
$m = wait_metrics('a worker in state "broker down"', sub {
	my $m = shift;
	grep({ $_->{value} == 1 } samples($m, 'obx_worker_state', state => 'broker down')) >= 1 });
is((sample($m, 'obx_topic_pending', topic => $orders) // 0)
	+ (sample($m, 'obx_topic_leased', topic => $orders) // 0), 5,
	'the 5 new events are pending or leased');
cmp_ok(sample($m, 'obx_topic_oldest_pending_age_seconds', topic => $orders), '>', 0,
	'and their age is counted');
check_workers($m, 'with the brokers down', 34, undef);

mock_cmd($mock, 'up all');
ok(all_published($node), 'all published after the brokers came back');
$m = wait_metrics('the counters to reach 39', sub {
	my $m = shift;
	sum_of($m, 'obx_worker_published_total') == 39
	  && (sample($m, 'obx_topic_pending', topic => $orders) // -1) == 0
	  && (sample($m, 'obx_topic_leased', topic => $orders) // -1) == 0 });
check_topics($m, 'after the brokers came back');
check_latency('after the brokers came back');
check_monotonic($m, \%prev, 'after the brokers came back');
broker_holds($orders);

# A worker that had nothing to send since the brokers came back shows
# "broker down" until its last connection error is 30 s old
# (OBX_BROKER_TROUBLE_WINDOW_MS in src/relay/kafka.c); then the alert clears.
ok(wait_metrics_for('no worker in state "broker down"', sub {
	!grep { $_->{value} == 1 } samples(shift, 'obx_worker_state', state => 'broker down') }, 60),
	'no worker shows "broker down" within 60 s of the brokers coming back');

#
# Step 5: a relay worker ends (pg_terminate_backend) and the postmaster
# starts it again a second later.  Until then its slot has no pid and
# obx.workers must say "stopped", not "stopping" (a live worker shutting
# down) nor what it did before.  One session watches the slot every 10 ms
# from the terminate until the new process is there: the second without a
# process is many polls long, so it cannot be missed.
#
my $watch = $node->safe_psql('postgres', q{
	CREATE TEMP TABLE seen (n serial, pid int, state text);
	CREATE TEMP TABLE old AS SELECT pid FROM obx.workers WHERE worker = 1;
	SELECT pg_terminate_backend(pid) FROM old;
	DO $$
	DECLARE
		w record;
		last text := '';
		give_up timestamptz := clock_timestamp() + interval '60 s';
	BEGIN
		LOOP
			SELECT pid, state INTO w FROM obx.workers WHERE worker = 1;
			IF coalesce(w.pid::text, '-') || w.state <> last THEN
				INSERT INTO seen (pid, state) VALUES (w.pid, w.state);
				last := coalesce(w.pid::text, '-') || w.state;
			END IF;
			EXIT WHEN w.pid <> (SELECT pid FROM old) OR clock_timestamp() > give_up;
			PERFORM pg_sleep(0.01);  -- the poll's pace, not a wait for a result
		END LOOP;
	END $$;
	SELECT coalesce(s.pid::text, ''), s.state, s.pid IS NOT DISTINCT FROM o.pid
	  FROM seen s, old o ORDER BY s.n;});
my @seen = map { [ split /\|/ ] } grep { /\|/ } split /\n/, $watch;
note('worker 1 through its restart: ' . join(', ', map { "$_->[1] ($_->[0])" } @seen));
my %while_gone = map { $_->[1] => 1 } grep { $_->[0] eq '' } @seen;
ok(%while_gone, 'worker 1 was seen without a process between its exit and its restart');
is_deeply([ sort keys %while_gone ], ['stopped'],
	'a worker that has exited shows "stopped", nothing else');
ok(!grep({ $_->[2] eq 't' && $_->[1] eq 'stopped' } @seen),
	'the worker shows "stopped" only once its process is gone');
ok(@seen && $seen[-1][0] ne '' && $seen[-1][2] eq 'f', 'worker 1 came back as a new process');
$m = wait_metrics('both workers idle after the restart', sub { all_in_state(shift, 'idle') });
check_workers($m, 'after worker 1 restarted', 39, undef);

#
# Step 6: a database obx.database does not name.  CREATE EXTENSION and the
# first enqueue there warn, naming the setting; the enqueue still stores
# its event, which stays pending, and obx.status says why.
#
$node->safe_psql('postgres', 'CREATE DATABASE shop');
my ($ret, $out, $err) = $node->psql('shop', 'CREATE EXTENSION obx');
is($ret, 0, 'CREATE EXTENSION succeeds in a database no relay serves');
like($err, qr/WARNING:  no obx relay publishes the outbox of database "shop".*HINT:  Set obx.databases to 'postgres, shop' and reload/s,
	'CREATE EXTENSION warns that no relay serves "shop", naming obx.databases');
($ret, $out, $err) = $node->psql('shop', qq{
	SELECT obx.enqueue('$orders', 'ord_s', '{"shop": 1}') IS NOT NULL;
	SELECT obx.enqueue('$orders', 'ord_s', '{"shop": 2}') IS NOT NULL;});
is($ret, 0, 'obx.enqueue succeeds there');
is(scalar(() = $err =~ /WARNING:  no obx relay publishes/g), 1, 'the first enqueue of the session warns, the second does not');
is($node->safe_psql('shop', 'SELECT pending, problem FROM obx.status'),
	"2|no relay serves this database: obx.database is 'postgres'",
	'obx.status in "shop": both events pending, and why');
is($node->safe_psql('postgres', 'SELECT count(*) FROM obx.status WHERE problem IS NOT NULL'), '0',
	'obx.status in the served database shows no problem');

#
# Step 7: the histogram keeps 64 topics; the events of later ones are
# counted under topic "(other)".  70 new topics, 2 events each, in one
# transaction: every published event is counted exactly once, each named
# topic with its own count.
#
$sql = "BEGIN;\n";
for my $t (1 .. 70)
{
	$sql .= "SELECT obx.enqueue('lat.many.$t', 'k', '{\"n\": $_}');\n" for 1 .. 2;
}
$sql .= "COMMIT;\n";
$node->safe_psql('postgres', $sql);
ok(all_published($node), 'the events of 70 more topics are published');
my %published_per_topic = map { split /\|/ } split /\n/, $node->safe_psql('postgres',
	'SELECT topic, count(*) FROM obx.outbox_events WHERE published_at IS NOT NULL GROUP BY topic');
$m = wait_metrics('the histogram to count every published event', sub {
	sum_of(shift, 'obx_publish_latency_seconds_count') == sum_of_values(\%published_per_topic) });
my %counted = map { $_->{labels}{topic} => $_->{value} } samples($m, 'obx_publish_latency_seconds_count');
is(scalar(keys %counted), 65, 'the histogram has 64 topics and "(other)"');
my @wrong = grep { $_ ne '(other)' && $counted{$_} != ($published_per_topic{$_} // -1) } sort keys %counted;
is_deeply(\@wrong, [], 'each named topic counts exactly its published events');
my $named = sum_of_values({ map { $_ => $published_per_topic{$_} } grep { $_ ne '(other)' } keys %counted });
is($counted{'(other)'}, sum_of_values(\%published_per_topic) - $named,
	'"(other)" counts the published events of every topic without a row of its own');

#
# Consumer metrics: a subscription on the orders topic applies its events;
# one handler error is dead-lettered.  Lag, counters and pending dead
# letters must match obx.consumer_status and obx.consumers.
#
$node->safe_psql('postgres', q{
	CREATE TABLE applied (event_id text PRIMARY KEY);
	CREATE FUNCTION apply_order(e obx.inbound_event) RETURNS void LANGUAGE plpgsql AS $$
	BEGIN
		IF e.payload ? 'reject' THEN
			RAISE EXCEPTION 'rejected' USING ERRCODE = 'check_violation';
		END IF;
		INSERT INTO public.applied VALUES (e.event_id);
	END $$;});
$node->safe_psql('postgres', "SELECT obx.subscribe('metrics-app', ARRAY['$orders'], 'apply_order(obx.inbound_event)')");
$node->safe_psql('postgres', "SELECT obx.enqueue('$orders', 'ord_r', '{\"reject\": true}')");
ok(all_published($node), 'the rejected order is published');
my $orders_at_broker = scalar(@{ read_topic($mock, $orders) });
# Processed and dead-lettered add up to the orders; duplicates are not
# counted in: with two consumer workers, a rebalance may deliver a message
# again (its offset commit refused while the group rebalances), and it is
# then a duplicate.
$m = wait_metrics('the consumer to apply every order and report no lag', sub {
	my $m = shift;
	sum_of($m, 'obx_consumer_partition_processed_total')
	  + sum_of($m, 'obx_consumer_partition_dead_lettered_total') == $orders_at_broker
	  && sum_of($m, 'obx_consumer_partition_lag') == 0
	  && (sample($m, 'obx_consumer_dead_letters_pending', consumer => 'metrics-app') // -1) == 1 });
is(sum_of($m, 'obx_consumer_partition_dead_lettered_total'), 1,
	'the rejected order is counted as a dead letter');
is(sum_of($m, 'obx_consumer_partition_processed_total'),
	$node->safe_psql('postgres', 'SELECT count(*) FROM applied'),
	'processed_total equals the effects the handler committed');
is(sum_of($m, 'obx_consumer_partition_processed_total'),
	$node->safe_psql('postgres', "SELECT sum(processed) FROM obx.consumer_status WHERE consumer_name = 'metrics-app'"),
	'processed_total equals obx.consumer_status');
is($m->{type}{obx_consumer_partition_lag}, 'gauge', 'consumer lag is a gauge');
is(sample($m, 'obx_consumer_kafka_error_timestamp_seconds', consumer => 'metrics-app'), 0,
	'no Kafka error standing for the consumer: its timestamp gauge is 0');
is($m->{type}{obx_consumer_partition_processed_total}, 'counter', 'processed_total is a counter');

# The example alert rules: promtool's unit test (Debian's prometheus
# package) fires the p99 rule on a slow topic only, and the unserved rule.
SKIP:
{
	skip 'promtool not installed (Debian package prometheus)', 1
	  unless grep { -x "$_/promtool" } split /:/, $ENV{PATH};
	my ($ok, $rules_out) = (0, '');
	$ok = IPC::Run::run(
		[ 'promtool', 'test', 'rules', "$FindBin::RealBin/../monitoring/obx-alerts-test.yaml" ],
		'<', \undef, '>&', \$rules_out);
	ok($ok, 'promtool: the alert rules of monitoring/obx-alerts.yaml pass their unit test')
	  or diag($rules_out);
}

my $log = slurp_file($exp->{log});
unlike($log, qr/Error running query|level=error/, 'the exporter logged no query error');
ok(stop_exporter($exp), 'the exporter is stopped');
note(sprintf('wall time %.1f s', time() - $t0));
done_testing();

# --- helpers ---------------------------------------------------------------

# wait_metrics('what', sub { my $m = shift; ... }): scrape until the
# condition holds; fails the test (returns the last metrics) on timeout.
sub wait_metrics
{
	my ($what, $cond) = @_;
	my $m = scrape_until($exp, $cond, $what);
	return $m if $m;
	fail("timed out waiting for $what");
	return parse_metrics(scrape($exp));
}

# wait_metrics_for('what', $cond, $seconds): true when the condition held
# within $seconds (for checks that must not fail the test by themselves).
sub wait_metrics_for
{
	my ($what, $cond, $seconds) = @_;
	return defined scrape_until($exp, $cond, $what, $seconds);
}

sub sum_of_values
{
	my ($h) = @_;
	my $sum = 0;
	$sum += $_ for values %$h;
	return $sum;
}

sub sum_of
{
	my ($m, $name, %labels) = @_;
	my $sum = 0;
	$sum += $_->{value} for samples($m, $name, %labels);
	return $sum;
}

sub all_in_state
{
	my ($m, $state) = @_;
	my @s = samples($m, 'obx_worker_state', state => $state);
	return @s == 2 && !grep { $_->{value} != 1 } @s;
}

sub counters
{
	my ($m) = @_;
	my %c;
	for my $name (qw(obx_worker_batches_total obx_worker_published_total obx_worker_errors_total))
	{
		$c{"$name/$_->{labels}{worker}"} = $_->{value} for samples($m, $name);
	}
	$c{$_} = sample($m, $_) for qw(obx_publish_errors_total obx_publish_published_total);
	return %c;
}

# Counters never go down between scrapes.
sub check_monotonic
{
	my ($m, $prev, $when) = @_;
	my %now = counters($m);
	my @down = grep { !defined $now{$_} || $now{$_} < $prev->{$_} } sort keys %$prev;
	is_deeply(\@down, [], "$when: no counter went down");
}

# Every topic gauge equals obx.status; the age lies between the ones read
# just before and just after the scrape.
sub check_topics
{
	my ($m, $when) = @_;
	my $cols = 'topic, pending, leased, quarantined, failing, published, '
	  . 'extract(epoch FROM oldest_pending_age)';
	my $before = $node->safe_psql('postgres', "SELECT $cols FROM obx.status ORDER BY topic");
	$m = parse_metrics(scrape($exp));
	my $after = $node->safe_psql('postgres', "SELECT $cols FROM obx.status ORDER BY topic");
	my %age_after = map { (split /\|/)[0, 6] } split /\n/, $after;
	my @topics;
	for my $line (split /\n/, $before)
	{
		my ($topic, $pending, $leased, $quarantined, $failing, $published, $age) = split /\|/, $line;
		push @topics, $topic;
		my %want = (pending => $pending, leased => $leased, quarantined => $quarantined,
			failing => $failing, published_retained => $published);
		my %got = map { $_ => sample($m, "obx_topic_$_", topic => $topic) } keys %want;
		is_deeply(\%got, \%want, "$when: obx_topic_* of $topic equal obx.status");
		my $v = sample($m, 'obx_topic_oldest_pending_age_seconds', topic => $topic);
		ok(defined $v && $v >= $age - 1e-6 && $v <= $age_after{$topic} + 1e-6,
			"$when: oldest pending age of $topic ($v) is within [$age, $age_after{$topic}]");
	}
	is_deeply([ sort map { $_->{labels}{topic} } samples($m, 'obx_topic_pending') ], \@topics,
		"$when: one series per topic of obx.status");
}

# Every worker metric equals obx.workers; the state gauge is 1 for the
# state obx.workers shows and 0 for every other; the published counters add
# up to $published and the errors to $errors (when defined).
sub check_workers
{
	my ($m, $when, $published, $errors) = @_;
	my $rows = $node->safe_psql('postgres', q{
		SELECT worker, state, batches, published, errors, pid IS NOT NULL,
		       extract(epoch FROM started_at), database
		  FROM obx.workers ORDER BY worker});
	my $n = 0;
	for my $line (split /\n/, $rows)
	{
		my ($w, $state, $batches, $pub, $err, $up, $started, $db) = split /\|/, $line;
		$n++;
		is($db, 'postgres', "$when: obx.workers says worker $w serves database postgres");
		my %got = (
			batches => sample($m, 'obx_worker_batches_total', worker => $w),
			published => sample($m, 'obx_worker_published_total', worker => $w),
			errors => sample($m, 'obx_worker_errors_total', worker => $w),
			up => sample($m, 'obx_worker_up', worker => $w));
		is_deeply(\%got, { batches => $batches, published => $pub, errors => $err,
			up => $up eq 't' ? 1 : 0 }, "$when: counters of worker $w equal obx.workers");
		my $st = sample($m, 'obx_worker_start_time_seconds', worker => $w);
		ok(abs($st - $started) < 1e-3, "$when: start time of worker $w equals obx.workers");
		my %gauge = map { $_->{labels}{state} => $_->{value} }
		  samples($m, 'obx_worker_state', worker => $w);
		# The state may move between the SQL read and the scrape only
		# while the relay works; callers check at rest.
		my @on = grep { $gauge{$_} == 1 } sort keys %gauge;
		is(scalar(@on), 1, "$when: worker $w is in exactly one state (@on)");
		is_deeply([ sort keys %gauge ], [ sort @states ],
			"$when: worker $w has a series for every state");
		is($on[0], $state, "$when: worker $w state gauge says '$state' as obx.workers does")
		  if defined $errors;
	}
	is($n, 2, "$when: obx.workers shows 2 workers");
	is(sum_of($m, 'obx_worker_published_total'), $published,
		"$when: obx_worker_published_total adds up to $published");
	is(sample($m, 'obx_publish_published_total'), $published,
		"$when: obx_publish_published_total is $published");
	if (defined $errors)
	{
		is(sum_of($m, 'obx_worker_errors_total'), $errors,
			"$when: obx_worker_errors_total adds up to $errors");
		is(sample($m, 'obx_publish_errors_total'), $errors,
			"$when: obx_publish_errors_total is $errors");
	}
	is(sum_of($m, 'obx_worker_published_total'),
		$node->safe_psql('postgres', 'SELECT count(*) FROM obx.outbox_events WHERE published_at IS NOT NULL'),
		"$when: the published counters equal the published rows (no re-send happened)");
}

# The publish latency metrics against the test's own measure: every
# published event's published_at - occurred_at (in microseconds, as the
# relay counts it), put in the documented buckets here.  Every event was
# published once (no replay in this test), so the counts are exact.
sub check_latency
{
	my ($when) = @_;
	my @bounds_ms = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000);
	my %us;    # topic => [ latency in microseconds ]
	my %times; # event id => [ occurred_at ms, published_at ms, topic ]
	for (split /\n/, $node->safe_psql('postgres', q{
		SELECT topic, id, (extract(epoch FROM published_at - occurred_at) * 1000000)::bigint,
		       extract(epoch FROM occurred_at) * 1000, extract(epoch FROM published_at) * 1000
		  FROM obx.outbox_events WHERE published_at IS NOT NULL}))
	{
		my ($topic, $id, $us, $occ, $pub) = split /\|/;
		push @{ $us{$topic} }, $us;
		$times{$id} = [ $occ, $pub, $topic ];
	}
	my $m = parse_metrics(scrape($exp));
	is_deeply([ sort map { $_->{labels}{topic} } samples($m, 'obx_publish_latency_seconds_count') ],
		[ sort keys %us ], "$when: one latency histogram per topic that published");
	for my $topic (sort keys %us)
	{
		my @us = @{ $us{$topic} };
		my (%want, %got);
		for my $b (@bounds_ms)
		{
			$want{$b} = scalar(grep { $_ <= $b * 1000 } @us);
		}
		$want{'+Inf'} = scalar(@us);
		for (samples($m, 'obx_publish_latency_seconds_bucket', topic => $topic))
		{
			my $le = $_->{labels}{le};
			$got{ $le eq '+Inf' ? $le : sprintf('%d', $le * 1000 + 0.5) } = $_->{value};
		}
		is_deeply(\%got, \%want, "$when: latency buckets of $topic equal the test's own count of published_at - occurred_at");
		is(sample($m, 'obx_publish_latency_seconds_count', topic => $topic), scalar(@us),
			"$when: latency count of $topic equals its published events");
		my $sum = 0;
		$sum += $_ for @us;
		my $got_sum = sample($m, 'obx_publish_latency_seconds_sum', topic => $topic);
		ok(abs($got_sum - $sum / 1e6) < 1e-6,
			"$when: latency sum of $topic ($got_sum s) equals the test's own (@{[ $sum / 1e6 ]} s)");
		note("$when: $topic latency buckets " . join(' ', map { "$_:$want{$_}" } @bounds_ms, '+Inf'));
		check_window($m, $when, $topic, \@us);
	}
	# The Kafka timestamp is when the relay produced the message: between
	# the enqueue and the acknowledgement the latency spans.
	my @outside;
	for my $topic (sort keys %us)
	{
		for my $msg (@{ read_topic($mock, $topic) })
		{
			my $t = $times{ $msg->{event_id} } or next;
			push @outside, "$msg->{event_id}: $t->[0] <= $msg->{timestamp} <= $t->[1]"
			  unless int($t->[0]) <= $msg->{timestamp} && $msg->{timestamp} <= $t->[1] + 1;
		}
	}
	is_deeply(\@outside, [], "$when: every message's Kafka timestamp lies between occurred_at and published_at");
}

# The one-minute p50 and p99 of a topic equal percentile_cont computed
# here over the same latencies, when no event left the window meanwhile.
sub check_window
{
	my ($m, $when, $topic, $us) = @_;
	my $in_window = "SELECT count(*) FROM obx.outbox_events WHERE topic = '$topic'"
	  . " AND published_at > now() - interval '1 minute'";
	return note("$when: events of $topic left the one-minute window; p50/p99 not compared")
	  unless $node->safe_psql('postgres', $in_window) == @$us;
	my @x = sort { $a <=> $b } map { $_ / 1e6 } @$us;
	my $pct = sub {
		my $pos = $_[0] * (@x - 1);
		my $lo = int($pos);
		return $lo + 1 < @x ? $x[$lo] + ($pos - $lo) * ($x[ $lo + 1 ] - $x[$lo]) : $x[$lo];
	};
	is(sample($m, 'obx_publish_latency_window_events', topic => $topic), scalar(@x),
		"$when: the window of $topic holds its published events");
	for my $p ([ 'p50', 0.5 ], [ 'p99', 0.99 ])
	{
		my $got = sample($m, "obx_publish_latency_window_$p->[0]_seconds", topic => $topic);
		ok(defined $got && abs($got - $pct->($p->[1])) < 1e-6,
			"$when: $p->[0] of $topic (@{[ $got // 'none' ]}) equals the test's own (@{[ $pct->($p->[1]) ]})");
	}
}

# The broker holds exactly the committed events of $topic, each in per-key
# enqueue order.
sub broker_holds
{
	my ($topic) = @_;
	my $want = $committed{$topic};
	my $msgs = broker_holds_exactly($mock, $node, $topic, [ keys %$want ],
		"topic = '$topic'");
	is(scalar(@$msgs), scalar(keys %$want), "$topic: no event was sent twice");
}
