# Window: PostgreSQL restarts (a crash-like immediate stop, then a clean
# restart) with events pending and the brokers down.
#
# The relay workers claim the events and wait on brokers that never answer;
# the instance is stopped in immediate mode (no shutdown checkpoint, workers
# killed mid-batch) and started again, then restarted cleanly (workers give
# up their in-flight batches within obx.shutdown_timeout), and only then do
# the brokers come back.  Guarantees 2, 4, 5 and 6: every committed event
# reaches Kafka, per key in enqueue order, and the application's writes
# never wait on the broker (each enqueue runs under statement_timeout and
# lock_timeout, so a blocked write fails the test instead of hanging it).
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use ObxWindows;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $t0 = time();
my $topic = 'orders.restart_pending.v1';
my $nkeys = 20;
my $per_tx = 10;
my $lease_s = 3;

my $mock = start_mock();

# Two workers; a short lease, so the leases of the workers killed by the
# immediate stop end soon after the start even if nothing releases them.
my $node = obx_node('restart_pending', $mock,
	'obx.workers' => 2,
	'obx.lease_timeout' => "'${lease_s}s'",
	'log_min_messages' => 'warning');

relay_ready($node, 2);

mock_cmd($mock, 'down all');

my $slowest = 0;
my $enqueue_wave = wave_producer($node, $topic, nkeys => $nkeys, per_tx => $per_tx,
	slowest => \$slowest, brokers => 'down');

# Wave 1 (100 events), then wait until the workers have claimed: the
# immediate stop must catch them mid-batch.
my @committed = $enqueue_wave->(1, 10);
$node->poll_query_until('postgres',
	"SELECT count(*) > 0 FROM obx.leased_events")
  or die 'no event was ever claimed';

# The relays hold no lock while they wait on Kafka: a session can lock
# every pending event's row, and obx.records against the record step
# (lock_timeout covers a lease renewal in progress).
my ($ret, $out, $err) = $node->psql('postgres', q{
	SET lock_timeout = '5s';
	BEGIN;
	SELECT count(*) FROM (SELECT 1 FROM obx.events
		WHERE id IN (SELECT id FROM obx.outbox_events WHERE published_at IS NULL)
		FOR UPDATE) s;
	LOCK TABLE obx.records IN SHARE MODE;
	ROLLBACK;});
is($ret, 0, 'every pending row can be locked while the relays wait on Kafka')
  or diag($err);

note('leased before the immediate stop: ' . $node->safe_psql('postgres',
	'SELECT count(*) FROM obx.leased_events'));
$node->stop('immediate');
$node->start;
is($node->safe_psql('postgres',
	'SELECT count(*) FROM obx.outbox_events WHERE published_at IS NULL'),
	scalar(@committed), 'after the immediate stop every event is still pending');

# Wave 2 (50 events) after the crash-like restart, brokers still down.
my $started_at = $node->safe_psql('postgres', 'SELECT now()');
push @committed, $enqueue_wave->(2, 5);

# Wait for a claim made since the start (a lease taken before the crash
# ends at most obx.lease_timeout after it), so that the clean restart
# catches a live worker mid-batch.
$node->poll_query_until('postgres', qq{
	SELECT count(*) > 0 FROM obx.leased_events
	 WHERE lease_until >= '$started_at'::timestamptz + interval '$lease_s s'})
  or die 'nothing was claimed after the restart';
note('workers before the clean restart: ' . $node->safe_psql('postgres',
	"SELECT string_agg(worker || ':' || state, ', ' ORDER BY worker) FROM obx.workers"));

# A clean restart: the workers give their in-flight batches back, within
# obx.shutdown_timeout (5 s by default), and stop.
my $log_offset = -s $node->logfile;
my $t_restart = time();
$node->restart;
note(sprintf('clean restart took %.1f s', time() - $t_restart));
my $log = slurp_file($node->logfile, $log_offset);
like($log, qr/obx relay 0 stopped.*obx relay 1 stopped|obx relay 1 stopped.*obx relay 0 stopped/s,
	'both workers stopped cleanly');

# Wave 3 (50 events) after the clean restart, brokers still down.
push @committed, $enqueue_wave->(3, 5);
is(scalar(@committed), 200, '200 events committed in 20 transactions');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM obx.outbox_events
	 WHERE published_at IS NULL AND quarantined_at IS NULL}),
	'200', 'all 200 are pending, none published or quarantined');
cmp_ok($slowest, '<', 5, sprintf('no enqueue transaction waited on the broker (slowest %.2f s)', $slowest));

mock_cmd($mock, 'up all');
my $t_up = time();
ok(all_published($node), 'every event published once the brokers are back');
note(sprintf('all published %.1f s after the brokers came back', time() - $t_up));

my %committed = map { $_ => 1 } @committed;
my $msgs = broker_holds_exactly($mock, $node, $topic, [ keys %committed ]);
my $seen = event_ids_at_broker($msgs);
is($node->safe_psql('postgres', q{
	SELECT (SELECT count(*) FROM obx.outbox_events WHERE quarantined_at IS NOT NULL)
		   + (SELECT count(*) FROM obx.leases)}),
	'0', 'nothing quarantined, no lease left behind');

# A worker stopped with pg_terminate_backend() comes back (the postmaster
# does not restart a worker that exits with status 0), and keeps publishing.
for my $type ('obx relay', 'obx consumer')
{
	my $old = $node->safe_psql('postgres',
		"SELECT min(pid) FROM pg_stat_activity WHERE backend_type = '$type'");
	my $count = $node->safe_psql('postgres',
		"SELECT count(*) FROM pg_stat_activity WHERE backend_type = '$type'");
	$node->safe_psql('postgres', "SELECT pg_terminate_backend($old)");
	ok($node->poll_query_until('postgres', qq{
		SELECT count(*) = $count AND bool_and(pid <> $old)
		  FROM pg_stat_activity WHERE backend_type = '$type'}),
		"a $type worker stopped by pg_terminate_backend() is started again");
}
my $after = $node->safe_psql('postgres', "SELECT obx.enqueue('$topic', 'after_terminate', '{}')");
ok(all_published($node), 'the restarted relay publishes');

note(sprintf('%d messages, %d distinct events, %d duplicates; wall time %.1f s',
	scalar(@$msgs), scalar(keys %$seen), scalar(@$msgs) - scalar(keys %$seen),
	time() - $t0));

done_testing();
