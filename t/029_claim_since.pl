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
# Parts 1, 2, 4 and 5 are ObxClaimSince's, which t/105 runs on obx-relay.
# The poison is the producer's own size limit, as in t/022.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use ObxClaimSince;
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

sub enqueue { return since_enqueue($node, $topic, @_) }

my $first = enqueue('k0', 0);
ok(all_published($node), 'the first event is published');

my ($p, $b, $c) = since_held_back($node, $topic);
my ($l, $d) = since_late_committer($node, $topic);

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

my @burst = since_burst($node, $topic);
my ($e1, $e2, $f) = since_foreign_lease($node, $topic);

since_final_checks($node, $mock, $topic,
	ids => [ $first, $b, $c, $d, $l, $a, $a2, $b2, $f ],
	burst => \@burst, k9 => [ $e1, $e2 ], poison => $p);

$node->stop;
done_testing();
