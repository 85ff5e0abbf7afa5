# Window 2: the relay cannot publish after commit.
#
# (a) Every broker is down.  The application keeps committing: no write
#     waits on Kafka (statement_timeout and per-statement timing prove it),
#     no relay holds a transaction open across the wait on Kafka, nothing is
#     marked published, the failures are recorded as transient and never
#     quarantine (obx.max_attempts = 1 would quarantine a misclassified
#     failure at once), and once the brokers return every committed event
#     reaches Kafka, per key in enqueue order.  One topic is first produced
#     during the outage, so the producer knows nothing about it yet.
# (b) No relay runs at all (obx.workers = 0, after a restart that stops the
#     relay in the middle of a burst): events wait in the outbox, nothing is
#     published, and a restart with workers publishes every one of them.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

# Longest any application statement may take.  A statement that waited on
# a relay stuck behind Kafka would wait a delivery timeout (2 s) or more.
my $max_statement_ms = 1500;

# A relay transaction open this long while the brokers are down would be a
# transaction held across the wait on Kafka (claims and records take ms).
my $max_relay_xact = '1.5 s';

my $mock = start_mock();
# A batch can hold every event of the outage.  Per-key order means a key's
# later events are only attempted in a batch that also holds its earlier
# ones; with batches smaller than the backlog, the retries of the earliest
# events of each key can fill every batch for the whole outage, and the
# second wave would never meet the dead brokers.
my $node = obx_node('relay_down', $mock,
	'obx.workers' => 2,
	'obx.batch_size' => 200,
	'obx.delivery_timeout' => "'2s'",
	'obx.max_attempts' => 1);

my @topics = ('orders.v1', 'payments.v1');
my $nkeys = 15;
$node->safe_psql('postgres', qq{
	CREATE TABLE orders (id int PRIMARY KEY, version int NOT NULL DEFAULT 0);
	INSERT INTO orders SELECT g FROM generate_series(1, $nkeys) g;});

my %committed;			# every event id handed out by a committed transaction
my $txn_no = 0;

# app_transactions($n, $with_payments): run $n application transactions in
# one psql session, each updating an order row and enqueueing one or two
# events for that order, under statement_timeout = 5s.  Returns the event
# ids, the wall time and the slowest statement in ms.
sub app_transactions
{
	my ($n, $with_payments) = @_;
	my $sql = "SET statement_timeout = '5s';\n\\timing on\n";
	for (1 .. $n)
	{
		$txn_no++;
		my $k = 1 + $txn_no % $nkeys;
		$sql .= "BEGIN;\n"
		  . "UPDATE orders SET version = version + 1 WHERE id = $k;\n"
		  . "SELECT obx.enqueue('orders.v1', 'ord_$k', '{\"txn\": $txn_no}');\n";
		$sql .= "SELECT obx.enqueue('payments.v1', 'ord_$k', '{\"txn\": $txn_no}');\n"
		  if $with_payments && $txn_no % 3 == 0;
		$sql .= "COMMIT;\n";
	}
	my $start = time();
	my $out = $node->safe_psql('postgres', $sql);
	my $elapsed = time() - $start;
	my (@ids, $slowest);
	$slowest = 0;
	for my $line (split /\n/, $out)
	{
		if ($line =~ /^Time: ([\d.]+) ms/)
		{
			$slowest = $1 if $1 > $slowest;
		}
		elsif ($line =~ /^[0-9a-f]{8}-[0-9a-f]{4}-/)
		{
			push @ids, $line;
			$committed{$line} = 1;
		}
	}
	return (\@ids, $elapsed, $slowest);
}

sub in_list { join(',', map { "'$_'" } @{ $_[0] }) }

sub check_broker_matches_outbox
{
	my ($what) = @_;
	my %at;
	for my $topic (@topics)
	{
		my $msgs = read_topic($mock, $topic);
		my $seen = event_ids_at_broker($msgs);
		my $expected = committed_ids($node, "topic = '$topic'");
		my @want = sort map { @$_ } values %$expected;
		is_deeply([ sort keys %$seen ], \@want,
			"$what: $topic at the broker holds exactly the committed events");
		is_deeply(first_occurrences($msgs), $expected,
			"$what: $topic per key, broker order equals enqueue order");
		$at{$_} = 1 for keys %$seen;
	}
	is(scalar(grep { !$at{$_} } keys %committed), 0,
		"$what: every id returned to the application is at the broker");
	is($node->safe_psql('postgres', 'SELECT count(*) FROM obx.outbox_events'),
		scalar(keys %committed),
		"$what: the outbox holds exactly the events the application committed");
}

# Warm up: the orders topic is known to both producers before the outage.
$committed{ $node->safe_psql('postgres',
	"SELECT obx.enqueue('orders.v1', 'warmup', '{}')") } = 1;
ok(all_published($node), 'warm-up event published');

############################################################################
# (a) every broker down
############################################################################
mock_cmd($mock, 'down all');

my ($wave1, $t1, $slow1) = app_transactions(40, 1);
note sprintf('wave 1 (brokers down): %d events in %.2f s, slowest statement %.1f ms',
	scalar(@$wave1), $t1, $slow1);
ok($slow1 < $max_statement_ms,
	"wave 1: no application statement waited on Kafka (slowest $slow1 ms)");

# Wait until the relay has failed on events of both topics at least twice
# (beyond obx.max_attempts = 1) and reports the brokers down, sampling the
# relays' transactions all the while.
my @long_xacts;
my $sample_relays = sub {
	my $r = $node->safe_psql('postgres', qq{
		SELECT string_agg(pid || ' in a transaction for ' || (clock_timestamp() - xact_start), ', ')
		  FROM pg_stat_activity
		 WHERE backend_type = 'obx relay'
		   AND xact_start < clock_timestamp() - interval '$max_relay_xact'});
	push @long_xacts, $r if $r ne '';
};
my $down_ids = in_list($wave1);
wait_until(sub {
	$sample_relays->();
	$node->safe_psql('postgres', qq{
		SELECT count(DISTINCT topic) = 2
		   AND bool_or(attempts >= 2)
		  FROM obx.outbox_events
		 WHERE id IN ($down_ids) AND last_error_class IS NOT NULL}) eq 't'
	  && $node->safe_psql('postgres',
		"SELECT count(*) > 0 FROM obx.workers WHERE state = 'broker down'") eq 't';
}, 'failed publish attempts on both topics and a worker in state broker down');

# A second wave while the relays are in the middle of waiting on Kafka.
my ($wave2, $t2, $slow2) = app_transactions(40, 1);
note sprintf('wave 2 (brokers down, relays waiting): %d events in %.2f s, slowest statement %.1f ms',
	scalar(@$wave2), $t2, $slow2);
ok($slow2 < $max_statement_ms,
	"wave 2: no application statement waited on Kafka (slowest $slow2 ms)");
ok($t1 + $t2 < 30, sprintf('80 application transactions took %.1f s in all', $t1 + $t2));

# Let the second wave meet the dead brokers too, still sampling.
$down_ids = in_list([ @$wave1, @$wave2 ]);
wait_until(sub {
	$sample_relays->();
	$node->safe_psql('postgres', qq{
		SELECT count(*) FILTER (WHERE attempts >= 3) > 0
		   AND count(*) FILTER (WHERE id IN (@{[ in_list($wave2) ]})
								AND last_error_class IS NOT NULL) > 0
		  FROM obx.outbox_events WHERE id IN ($down_ids)}) eq 't';
}, 'wave 2 failing as well, and some event on its third attempt');

is($node->safe_psql('postgres',
	"SELECT count(*) FROM obx.outbox_events WHERE id IN ($down_ids) AND published_at IS NOT NULL"),
	'0', 'nothing enqueued during the outage is marked published');
is($node->safe_psql('postgres',
	"SELECT count(*) FROM obx.outbox_events WHERE quarantined_at IS NOT NULL"),
	'0', 'no event is quarantined during the outage (obx.max_attempts = 1)');
is($node->safe_psql('postgres', 'SELECT count(*) FROM obx.quarantine'),
	'0', 'obx.quarantine is empty');
is($node->safe_psql('postgres', q{
	SELECT string_agg(DISTINCT last_error_class, ',') FROM obx.outbox_events
	 WHERE last_error_class IS NOT NULL}),
	'transient', 'every recorded failure is classified transient');
is(join('; ', @long_xacts), '',
	'no relay held a transaction open while waiting on the dead brokers');
note 'errors seen: ' . $node->safe_psql('postgres', q{
	SELECT string_agg(DISTINCT topic || ': ' || last_error, '; ')
	  FROM obx.outbox_events WHERE last_error IS NOT NULL});

mock_cmd($mock, 'up all');
ok(all_published($node), 'after the brokers return, every event is published');
is($node->safe_psql('postgres',
	'SELECT count(*) FROM obx.outbox_events WHERE quarantined_at IS NOT NULL'),
	'0', 'still no event quarantined');
check_broker_matches_outbox('outage');

############################################################################
# (b) relay workers stopped
############################################################################

# A burst, and the relay stopped (restart with no workers) while it is
# still publishing it.
my ($burst) = app_transactions(150, 0);
$node->append_conf('postgresql.conf', "obx.workers = 0\n");
$node->restart;
note 'burst events left unpublished by the stopped relay: ' . $node->safe_psql('postgres',
	"SELECT count(*) FROM obx.outbox_events WHERE id IN (@{[ in_list($burst) ]}) AND published_at IS NULL");
is(scalar(@{ relay_pids($node) }), 0, 'no relay worker runs with obx.workers = 0');
is($node->safe_psql('postgres', 'SELECT count(*) FROM obx.workers'), '0',
	'obx.workers shows no worker');

my ($idle, $t3, $slow3) = app_transactions(60, 1);
ok($slow3 < $max_statement_ms,
	"without relay workers enqueue still works at once (slowest $slow3 ms)");
my $idle_ids = in_list($idle);
is($node->safe_psql('postgres',
	"SELECT count(*) FROM obx.outbox_events WHERE id IN ($idle_ids) AND published_at IS NULL"),
	scalar(@$idle), 'every event enqueued without workers is in the outbox, unpublished');
is($node->safe_psql('postgres',
	"SELECT sum(pending) >= @{[ scalar(@$idle) ]} FROM obx.status"),
	't', 'obx.status counts them as pending');
{
	my %at;
	$at{ $_->{event_id} } = 1 for map { @{ read_topic($mock, $_) } } @topics;
	is(scalar(grep { $at{$_} } @$idle), 0,
		'none of them reached the broker');
}

$node->append_conf('postgresql.conf', "obx.workers = 2\n");
$node->restart;
ok(all_published($node), 'with workers back, every event is published');
is(scalar(@{ relay_pids($node) }), 2, 'two relay workers run again');
check_broker_matches_outbox('workers stopped');

done_testing();
