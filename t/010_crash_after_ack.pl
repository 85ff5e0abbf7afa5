# Window: Kafka acknowledged, the worker dies before published_at is set.
#
# The relay claims a batch, produces it, gets the acknowledgement, and is
# killed (SIGKILL, then crash recovery of the whole instance) before the
# short transaction that records the batch (obx.records) commits.
# Guarantees 2, 3 and 6: nothing is lost, the event is sent again with the
# same event_id header, and the outbox ends up showing it published where
# the re-send landed.
#
# The window is made deterministic with a lock: once the claim has
# committed (the relay holds no lock while it waits on Kafka), a test
# session takes a SHARE lock on obx.records; the relay's record, after the
# acknowledgement, then waits on the lock, and the relay is killed there.
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
my @batch = one_batch($node, $topic, '');
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

# Take the lock right after a lease renewal, the sign that the relay
# is alive and waiting on Kafka (a renewal writes obx.renewals, not
# obx.records, so the lock below cannot stall it).
my $lease0 = $node->safe_psql('postgres',
	"SELECT lease_until FROM obx.leased_events WHERE id = '$victim'");
$node->poll_query_until('postgres',
	"SELECT lease_until > '$lease0' FROM obx.leased_events WHERE id = '$victim'")
  or die 'the lease was never renewed';

# Take the lock, with the brokers down: nothing is published yet.
# Then up: the batch is acknowledged and the relay waits to record it.
my ($relay_pid, $bg) = relay_waits_on_record($node, $mock, $topic, \@batch, sub {
	is($node->safe_psql('postgres',
		"SELECT count(*) FROM obx.outbox_events WHERE published_at IS NOT NULL"),
		'0', 'nothing is published while the brokers are down');
	mock_cmd($mock, 'up all');
}, '');

# A real SIGKILL: the postmaster treats it as a crash and restarts everything.
crash_relay_at_record($node, $relay_pid, $bg, $victim, '');
my $new_pids = relay_pids($node);
ok(@$new_pids == 1 && $new_pids->[0] != $relay_pid, 'a new relay took over');

# At least twice at the broker, with the same event_id header both times.
my $msgs = resent_batch($mock, $topic, \@batch, [ keys %committed ], '');
my $seen = event_ids_at_broker($msgs);
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
