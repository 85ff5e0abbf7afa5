# Window: Kafka acknowledged, the worker dies before published_at is set.
#
# The relay claims a batch, produces it, gets the acknowledgement, and is
# killed (SIGKILL, then crash recovery of the whole instance) before the
# short transaction that sets published_at commits.  Guarantees 2, 3 and 6:
# nothing is lost, the event is sent again with the same event_id header,
# and the outbox row ends up published where the re-send landed.
#
# The window is made deterministic with a row lock: once the claim has
# committed (the relay holds no lock while it waits on Kafka), a test
# session locks the event's row; the relay's UPDATE of that row, after the
# acknowledgement, then waits on the lock, and the relay is killed there.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $t0 = time();
my $mock = start_mock();
my $topic = 'orders.crash_after_ack.v1';

# One worker, so exactly one relay holds the batch.  The lease is short, so
# that the dead worker's lease ends soon after the crash even if nothing
# releases it earlier; a live worker renews it every third of it while it
# waits on Kafka.  The test harness turns restart_after_crash off; a crash
# here must be recovered from.
my $node = obx_node('crash_after_ack', $mock,
	'restart_after_crash' => 'on',
	'obx.workers' => 1,
	'obx.lease_timeout' => "'9s'",
	'log_min_messages' => 'warning');

$node->poll_query_until('postgres',
	"SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'obx relay'")
  or die 'the relay worker did not start';

# Brokers down: whatever the relay claims stays in flight.
mock_cmd($mock, 'down all');

# The victim and two batch-mates on other keys commit together, so the relay
# claims them as one batch; then, in transactions of their own, a later
# event on the victim's key and one on a fourth key, which the single
# worker can only claim after the crash.
my @batch = split /\n/, $node->safe_psql('postgres', qq{
	BEGIN;
	SELECT obx.enqueue('$topic', 'ord_1', '{"n": 1}');
	SELECT obx.enqueue('$topic', 'ord_2', '{"n": 1}');
	SELECT obx.enqueue('$topic', 'ord_3', '{"n": 1}');
	COMMIT;});
is(scalar(@batch), 3, 'three events committed in one transaction');
my $victim = $batch[0];
my @later;
push @later, $node->safe_psql('postgres',
	"SELECT obx.enqueue('$topic', 'ord_1', '{\"n\": 2}')");
push @later, $node->safe_psql('postgres',
	"SELECT obx.enqueue('$topic', 'ord_4', '{\"n\": 1}')");
my %committed = map { $_ => 1 } (@batch, @later);

# The claim has committed: the victim is leased to the relay.
$node->poll_query_until('postgres',
	"SELECT count(*) = 1 FROM obx.leased_events WHERE id = '$victim'")
  or die 'the victim was never leased';
is($node->safe_psql('postgres', 'SELECT count(DISTINCT lease_id) FROM obx.leased_events WHERE id IN (' .
	join(',', map { "'$_'" } @batch) . ')'),
	'1', 'the three events form one claimed batch');

# Take the row lock right after a lease renewal, the sign that the relay
# is alive and waiting on Kafka (a renewal writes obx.leases, never an
# event's row, so the lock below cannot stall it).
my $lease0 = $node->safe_psql('postgres',
	"SELECT lease_until FROM obx.leased_events WHERE id = '$victim'");
$node->poll_query_until('postgres',
	"SELECT lease_until > '$lease0' FROM obx.leased_events WHERE id = '$victim'")
  or die 'the lease was never renewed';

my $bg = $node->background_psql('postgres', on_error_stop => 0);
my $bg_pid = $bg->query_safe('SELECT pg_backend_pid()');
my $t_lock = time();
# lock_timeout: a relay holding a row lock across the network fails the
# test here instead of hanging it.
$bg->query_safe(
	"SET lock_timeout = '10s'; BEGIN; SELECT 1 FROM obx.outbox_events WHERE id = '$victim' FOR UPDATE;");
my $t_locked = time() - $t_lock;
note(sprintf('row lock granted in %.3f s (the relay holds no lock while it waits on Kafka)',
	$t_locked));
is($node->safe_psql('postgres',
	"SELECT count(*) FROM obx.outbox_events WHERE published_at IS NOT NULL"),
	'0', 'nothing is published while the brokers are down');

mock_cmd($mock, 'up all');

# The acknowledged batch is at the broker ...
wait_for_broker($mock, $topic, sub {
	my $seen = event_ids_at_broker(shift);
	!grep { !$seen->{$_} } @batch }, 'the claimed batch at the broker');

# ... and the relay waits on our lock: published_at is not set yet.
my ($relay_pid, $relay_query);
$node->poll_query_until('postgres', qq{
	SELECT count(*) = 1 FROM pg_stat_activity
	 WHERE backend_type = 'obx relay' AND wait_event_type = 'Lock'
	   AND $bg_pid = ANY (pg_blocking_pids(pid))})
  or die 'the relay never waited on the row lock';
($relay_pid, $relay_query) = split /\|/, $node->safe_psql('postgres', q{
	SELECT pid, query FROM pg_stat_activity
	 WHERE backend_type = 'obx relay' AND wait_event_type = 'Lock'});
note("relay $relay_pid blocked in: $relay_query");
is($node->safe_psql('postgres',
	"SELECT published_at IS NULL FROM obx.outbox_events WHERE id = '$victim'"),
	't', 'acknowledged by Kafka, not yet recorded as published');

# A real SIGKILL: the postmaster treats it as a crash and restarts everything.
my $log_offset = -s $node->logfile;
ok(kill('KILL', $relay_pid), "SIGKILL sent to relay $relay_pid");

# Our session died with the crash (the postmaster ends every backend), and
# its lock with it; psql itself only notices at its next command.
eval { $bg->quit; };

ok($node->poll_query_until('postgres',
	"SELECT published_at IS NOT NULL FROM obx.outbox_events WHERE id = '$victim'"),
	'the victim is published after crash recovery');
ok(all_published($node), 'the outbox has nothing left to publish');

my $log = slurp_file($node->logfile, $log_offset);
like($log, qr/\(PID $relay_pid\) was terminated by signal 9/,
	'the postmaster saw the relay die of SIGKILL');
like($log, qr/all server processes terminated; reinitializing/,
	'the instance went through crash recovery');
my $new_pids = relay_pids($node);
ok(@$new_pids == 1 && $new_pids->[0] != $relay_pid, 'a new relay took over');

# At least twice at the broker, with the same event_id header both times.
my $msgs = wait_for_broker($mock, $topic, sub {
	my $seen = event_ids_at_broker(shift);
	!grep { ($seen->{$_} // 0) < 2 } @batch and !grep { !$seen->{$_} } keys %committed },
	'the re-sent batch and every committed event at the broker');
my $seen = event_ids_at_broker($msgs);
for my $id (@batch)
{
	cmp_ok($seen->{$id}, '>=', 2,
		"event $id of the unrecorded batch reached the broker $seen->{$id} times, with its event_id header each time");
}
my %key_of = map { $_->{event_id} => $_->{key} } @$msgs;
is(scalar(grep { !defined $_->{event_id} || $_->{key} ne $key_of{ $_->{event_id} } } @$msgs),
	0, 'every message carries an event_id header, and every copy of an event the same key');

# Set equality: exactly the committed ids, nothing lost, nothing foreign.
is_deeply([ sort keys %$seen ], [ sort keys %committed ],
	'the broker holds exactly the committed events');

# The outbox records where the event landed, and a copy is there.
my ($p, $o) = split /\|/, $node->safe_psql('postgres',
	"SELECT kafka_partition, kafka_offset FROM obx.outbox_events WHERE id = '$victim'");
ok((grep { $_->{partition} == $p && $_->{offset} == $o && $_->{event_id} eq $victim } @$msgs),
	"the recorded partition $p offset $o holds the victim");

# Re-sends are duplicates, not reorders.
is_deeply(first_occurrences($msgs), committed_ids($node),
	'per key, broker order equals enqueue order');

note(sprintf('duplicates at the broker: %d; wall time %.1f s',
	scalar(@$msgs) - scalar(keys %$seen), time() - $t0));

done_testing();
