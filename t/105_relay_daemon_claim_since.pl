# obx-relay's claim since a complete tick (docs/internals.md, "The claim
# since a complete tick"), on the SQL-only install: the daemon's claims
# after a complete one of its own read only the events of the
# transactions that claim's snapshot did not see committed.  The ways
# that could lose an event or break per-key order, with one daemon:
#
# 1. A claim that held an event back is not complete.  P fails for good
#    (too large for the producer) and is quarantined, which holds its key
#    k1; B (k1) and C (k2) commit together, and the claim takes C alone.
#    Once P is skipped, B must be published.
# 2. A late committer is one of the unseen: L's transaction stays open
#    while D is claimed and published; L commits afterwards, with a lower
#    seq than D, and must be published.
# 3. More than a batch in one transaction (batch_size is 5): all 12 are
#    published, in order.
# 4. A claim that found a lease live is not complete: another claimant's
#    lease on E1 is live while E2 (its key) and F commit.  F is published,
#    E1 and E2 wait, and once the lease runs out go out in that order.
# 5. A stall past the lease: the daemon is stopped (SIGSTOP) with G in
#    flight, every broker answering later than delivery_timeout, until
#    its lease has run out.  Resumed, it must not renew that lease (a
#    claim may have taken G over, and a lease a claim saw run out must
#    never be live again).  G then times out, a failure the daemon cannot
#    record under a lease it lost, so its next claim must read from the
#    floor again, and G must be published.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxDaemon;
use ObxTest;
use ObxWindows;
use PostgreSQL::Test::Utils;
use Test::More;

my $topic = 'orders.daemon_since.v1';
my $mock = start_mock();
my $dir = PostgreSQL::Test::Utils::tempdir('relay');
my $node = sql_only_node('daemon_since');
my $relay = start_relay(relay_config($node, $mock, $dir,
	batch_size => 5,
	max_attempts => 1,
	lease_timeout => 1,
	delivery_timeout => 6000,
	'kafka.message.max.bytes' => 20000));

my $stopped;
sub resume
{
	kill('CONT', $stopped) if $stopped;
	$stopped = undef;
}
END { resume(); }

sub enqueue
{
	my ($key, $n) = @_;
	return $node->safe_psql('postgres',
		qq{SELECT obx.enqueue('$topic', '$key', '{"n": $n}')});
}

sub published
{
	my ($id) = @_;
	return $node->safe_psql('postgres',
		qq{SELECT published_at IS NOT NULL FROM obx.outbox_events WHERE id = '$id'}) eq 't';
}

my $first = enqueue('k0', 0);
ok(all_published($node), 'the first event is published');

# 1. A claim that held an event back.
my $p = $node->safe_psql('postgres', qq{
	SELECT obx.enqueue('$topic', 'k1',
		jsonb_build_object('poison', true, 'blob', repeat('x', 50000)))});
$node->poll_query_until('postgres',
	qq{SELECT count(*) = 1 FROM obx.quarantine WHERE id = '$p'})
  or die 'the poison event was not quarantined';
my ($b, $c) = split /\n/, $node->safe_psql('postgres', qq{
	BEGIN;
	SELECT obx.enqueue('$topic', 'k1', '{"n": 2}');
	SELECT obx.enqueue('$topic', 'k2', '{"n": 3}');
	COMMIT;});
wait_until(sub { published($c) }, 'C, of a free key, is published');
ok(!published($b), 'B waits behind the quarantined P of its key');
$node->safe_psql('postgres', qq{SELECT obx.skip('$p', 'poison, for the test')});
wait_until(sub { published($b) }, 'B is published once P is skipped');

# 2. A late committer.
my ($late, $l) = late_committer($node, $topic);
my $d = enqueue('k4', 4);
wait_until(sub { published($d) }, 'D, committed after L was enqueued, is published');
ok(!published($l), 'L is not published while its transaction is open');
$late->query_safe('COMMIT');
$late->quit;
wait_until(sub { published($l) }, 'L is published once it commits');

# 3. More than a batch in one transaction.
my @burst = split /\n/, $node->safe_psql('postgres', qq{
	SELECT obx.enqueue('$topic', 'k8', jsonb_build_object('n', i))
	  FROM generate_series(1, 12) i ORDER BY i});
wait_until(sub { published($burst[-1]) }, 'the last of 12 events of one transaction is published');

# 4. Another claimant's live lease, written by hand from the latest tick
# under the claim lock, as a stalled relay would have left it (its floor
# no higher than E1, as a claim's).
my $holder = $node->background_psql('postgres');
$holder->query_safe('BEGIN; SELECT pg_advisory_xact_lock(7299704, 1)');
my $e1 = enqueue('k9', 9);
my ($e2, $f) = split /\n/, $node->safe_psql('postgres', qq{
	BEGIN;
	SELECT obx.enqueue('$topic', 'k9', '{"n": 10}');
	SELECT obx.enqueue('$topic', 'k10', '{"n": 11}');
	COMMIT;});
my $lease = $holder->query_safe(qq{
	INSERT INTO obx.claims (lease_id, owner, until, snap, floor, max_seq, ids, topics, keys)
	SELECT nextval('obx.lease_seq'), 99, now() + interval '1 hour', t.snap,
		   least(t.floor, e.seq), e.seq, ARRAY[e.id], ARRAY[e.topic], ARRAY[e.event_key]
	  FROM obx._tick() t, obx.events e WHERE e.id = '$e1'
	RETURNING lease_id});
$holder->query_safe('COMMIT');
$holder->quit;
wait_until(sub { published($f) }, 'F, of a free key, is published');
ok(!published($e1) && !published($e2), 'E1 and E2 wait while the lease on E1 is live');
$node->safe_psql('postgres', qq{
	UPDATE obx.claims SET until = now() - interval '1 second' WHERE lease_id = $lease});
wait_until(sub { published($e1) && published($e2) }, 'E1 and E2 are published once the lease runs out');

# 5. A stall past the lease.
mock_cmd($mock, "rtt $_ 8000") for 1 .. 3;
my $g = enqueue('k11', 12);
$node->poll_query_until('postgres',
	qq{SELECT count(*) = 1 FROM obx.leases WHERE '$g' = ANY (ids)})
  or die 'G was not claimed';
my $g_lease = $node->safe_psql('postgres',
	qq{SELECT max(lease_id) FROM obx.claims WHERE '$g' = ANY (ids)});
kill('STOP', $relay->{pid}) or die "cannot stop obx-relay: $!";
$stopped = $relay->{pid};
$node->poll_query_until('postgres', qq{
	SELECT greatest(c.until, (SELECT max(n.until) FROM obx.renewals n WHERE n.lease_id = c.lease_id))
		   < now() - interval '0.2 seconds'
	  FROM obx.claims c WHERE c.lease_id = $g_lease})
  or die "G's lease did not run out";
my $ran_out = $node->safe_psql('postgres', 'SELECT clock_timestamp()');
resume();
wait_until(sub { relay_log($relay) =~ /lost the lease of 1 failed events/ },
	'G times out under the lost lease');
mock_cmd($mock, "rtt $_ 0") for 1 .. 3;
wait_until(sub { published($g) }, 'G is published after the stall');
is($node->safe_psql('postgres', qq{
	SELECT count(*) FROM obx.renewals WHERE lease_id = $g_lease AND until > '$ran_out'}),
	'0', 'the lease that ran out was not renewed');
like(relay_log($relay), qr/lost the lease on 1 events/, 'the daemon says it lost the lease');

ok(all_published($node), 'nothing is left unpublished');
my $at_broker = event_ids_at_broker(read_topic($mock, $topic));
ok($at_broker->{$_}, "event $_ reached the broker") for ($first, $b, $c, $d, $l, $f, $g);
my $order = first_occurrences(read_topic($mock, $topic));
is_deeply($order->{k8}, \@burst, 'the broker holds the 12 events of key k8 in enqueue order');
is_deeply($order->{k9}, [ $e1, $e2 ], 'the broker holds E1 before E2');
ok(!$at_broker->{$p}, 'the skipped poison event never reached the broker');

is(stop_relay($relay), 0, 'obx-relay stops cleanly');
$node->stop;
done_testing();
