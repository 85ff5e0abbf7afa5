# The claim since a complete tick (docs/internals.md, "The claim since a
# complete tick"): a worker whose latest claim held nothing back, with its
# batches all delivered, reads only the events of the transactions that
# claim's snapshot did not see committed.  Five ways that could lose an
# event, each tried with one worker:
#
# 1. A claim that held an event back is not complete.  P is quarantined,
#    so its key k1 is blocked; B (k1) and C (k2) commit together; the
#    claim takes C and holds B back.  Once P is skipped, B must be
#    published: a claim that counted as complete would send the next ones
#    past B, which its snapshot saw.
# 2. A late committer is one of the unseen.  A transaction enqueues L and
#    stays open while D is claimed and published; L commits afterwards,
#    with a lower seq than D, and must be published: its transaction was
#    running when the ticks since were taken.
# 3. A batch that comes back with events not delivered sends the next
#    claim back to the floor.  With every broker answering 2 s late, A is
#    in flight alone when a change of Kafka settings makes the relay give
#    its flights up: A is released unsent, and must be published.  Then A2
#    is in flight and B2 (another key) is claimed beside it, which must
#    not count as a claim since A2's tick: both are released, and A2 must
#    be published too.
# 4. A transaction of more than a batch (obx.batch_size is 5 here): the
#    claim since reads one batch and one more of its events, and takes a
#    full batch, which is not complete; all 12 are published, in order.
# 5. A claim that found a lease live is not complete either, for the claim
#    since reads no lease.  Another claimant's lease on E1 is live while
#    E2 (its key) and F commit; the claim takes F and holds E2 back.  Once
#    the lease runs out, E1 and E2 must be published, in that order.
#
# The poison is the producer's own size limit, as in t/022.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use ObxWindows;
use PostgreSQL::Test::Utils;
use Test::More;

my $topic = 'orders.since.v1';
my $mock = start_mock();
my $node = obx_node('claim_since', $mock,
	'obx.workers' => 1,
	'obx.batch_size' => 5,
	'obx.kafka_properties' => "'message.max.bytes=20000'",
	'obx.max_payload_size' => "'1MB'",
	'obx.max_attempts' => 1);
relay_ready($node, 1);

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
is($node->safe_psql('postgres', qq{
	SELECT (SELECT seq FROM obx.events WHERE id = '$l') < (SELECT seq FROM obx.events WHERE id = '$d')}),
	't', 'L took its seq before D');

# 3. Batches released unsent.
sub leased
{
	my ($id) = @_;
	return $node->safe_psql('postgres',
		qq{SELECT count(*) = 1 FROM obx.leases WHERE '$id' = ANY (ids)}) eq 't';
}

sub released
{
	my ($id) = @_;
	return $node->safe_psql('postgres', qq{
		SELECT count(*) > 0 FROM obx.claims c JOIN obx.records r USING (lease_id)
		 WHERE '$id' = ANY (c.ids) AND cardinality(r.ids) = 0}) eq 't';
}

my $limit = 20000;
sub give_flights_up
{
	$limit++;
	$node->safe_psql('postgres', qq{
		ALTER SYSTEM SET obx.kafka_properties = 'message.max.bytes=$limit';
		SELECT pg_reload_conf()});
}

mock_cmd($mock, "rtt $_ 2000") for 1 .. 3;
my $a = enqueue('k5', 5);
wait_until(sub { leased($a) }, 'A is claimed');
give_flights_up();
wait_until(sub { released($a) }, 'A, in flight alone, is released unsent');
ok(all_published($node), 'A is published');

my $a2 = enqueue('k6', 6);
wait_until(sub { leased($a2) }, 'A2 is claimed');
my $b2 = enqueue('k7', 7);
wait_until(sub { leased($b2) }, 'B2 is claimed while A2 is in flight');
ok(!released($a2), 'A2 is still in flight');
give_flights_up();
wait_until(sub { released($a2) && released($b2) }, 'A2 and B2 are released unsent');
mock_cmd($mock, "rtt $_ 0") for 1 .. 3;
ok(all_published($node), 'A2 and B2 are published');

# 4. More than a batch in one transaction.
my @burst = split /\n/, $node->safe_psql('postgres', qq{
	SELECT obx.enqueue('$topic', 'k8', jsonb_build_object('n', i))
	  FROM generate_series(1, 12) i ORDER BY i});
is(scalar @burst, 12, 'one transaction enqueued 12 events of key k8');

# 5. A live lease of another claimant.  Under the claim lock, a lease on
# E1 is written by hand from the latest tick, as a stalled obx-relay or
# worker would have left it (its floor no higher than E1, as a claim's);
# E2 (the same key) and F commit beside it.
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

ok(all_published($node), 'nothing is left unpublished');
my $at_broker = event_ids_at_broker(read_topic($mock, $topic));
ok($at_broker->{$_}, "event $_ reached the broker") for ($first, $b, $c, $d, $l, $a, $a2, $b2, $f);
is_deeply(first_occurrences(read_topic($mock, $topic))->{k8}, \@burst,
	'the broker holds the 12 events of key k8 in enqueue order');
is_deeply(first_occurrences(read_topic($mock, $topic))->{k9}, [ $e1, $e2 ],
	'the broker holds E1 before E2');
ok(!$at_broker->{$p}, 'the skipped poison event never reached the broker');

$node->stop;
done_testing();
