# A retried or replayed event holds its key while it is in flight.
#
# Such an event is claimed from obx.event_states, and for the floor it is
# done already (docs/internals.md, "The outbox log"): the floor may pass it
# while its batch is out.  The lease holding it must still be read by every
# later claim (obx._live_leases), or a claim would take the event again,
# and the next events of its key with it, while the first copy is still in
# flight: a second copy, and per-key order left to the race between two
# batches.
#
# Every broker answers 1.5 s late (the stand-in's rtt).  Event A of key
# ord_1 is published, then replayed; while the replay is in flight, B of
# the same key and C of another key commit, and their commits wake the
# relays.  C must be claimed and published beside the replay; B must wait
# for the replay's record.  At the broker: A twice (the publication and the
# replay), never a third time, then B; C once.  An event retried after a
# failure (its backoff over, or taken back from quarantine by obx.retry) is
# claimed from obx.event_states the same way.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $topic = 'orders.retry_in_flight.v1';
my $rtt_ms = 1500;

my $mock = start_mock();
my $node = obx_node('retry_in_flight', $mock, 'obx.workers' => 2);
relay_ready($node, 2);
sub q1 { $node->safe_psql('postgres', $_[0]) }
sub enqueue { q1(qq{SELECT obx.enqueue('$topic', '$_[0]', '{"n": $_[1]}')}) }

# claims_holding($id): how many batches have held the event.
sub claims_holding { q1(qq{SELECT count(*) FROM obx.claims WHERE '$_[0]' = ANY (ids)}) }

my $a = enqueue('ord_1', 1);
wait_for_broker($mock, $topic, sub { event_ids_at_broker(shift)->{$a} }, 'A at the broker');
mock_cmd($mock, "rtt all $rtt_ms");

is(q1(qq{SELECT obx.replay(ARRAY['$a']::uuid[])}), '1', 'A is replayed');
$node->poll_query_until('postgres', qq{SELECT count(*) = 2 FROM obx.claims WHERE '$a' = ANY (ids)})
  or die 'the replay of A was not claimed';
my $b = enqueue('ord_1', 2);
my $c = enqueue('other_1', 3);
$node->poll_query_until('postgres', qq{SELECT count(*) = 1 FROM obx.claims WHERE '$c' = ANY (ids)})
  or die 'C was not claimed';
is(q1(qq{SELECT count(*) FROM obx.records WHERE '$a' = ANY (ids)}), '1',
	'C was claimed while the replay of A was still in flight');
is(q1(qq{SELECT count(*) FROM obx.leases WHERE '$a' = ANY (ids)}), '1',
	'obx.leases shows the replay in flight');

ok(all_published($node), 'everything is published');
mock_cmd($mock, 'rtt all 0');
my $msgs = wait_for_broker($mock, $topic, sub {
	my $seen = event_ids_at_broker(shift);
	$seen->{$b} && $seen->{$c} }, 'B and C at the broker');

is_deeply(copies_of_key($msgs, 'ord_1'), [ $a, $a, $b ],
	'key ord_1 at the broker: A, its replay, then B; no third copy of A');
is_deeply(copies_of_key($msgs, 'other_1'), [$c], 'C once');
is(claims_holding($a), '2', 'no batch took A a third time');

done_testing();
