# A worker skips a claim only when nothing changed since the latest claim
# that took everything it could (src/relay/turns.c, obx_claim_pointless).  Ending a
# lease frees the events its keys held back, so a worker that records a
# batch claims next whatever the count of changes says (src/relay/relay.c,
# land_flight).
#
# The workers poll once an hour (obx.poll_interval), so only commits and
# changes get events claimed, and every broker answers 1 s late (the
# stand-in's rtt).  Event A of key ord_1 is claimed and in flight; event B
# of the same key commits then: the claim B's commit wakes finds B held
# back by A's lease and takes nothing, and nothing commits after B.  When
# A's batch is recorded, B must be claimed and published, after A at the
# broker.  A relay that did not claim after the record would leave B
# waiting for the hourly poll, and this test would time out.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $topic = 'orders.record_change.v1';
my $rtt_ms = 1000;

my $mock = start_mock();
my $node = obx_node('claim_after_record', $mock, 'obx.workers' => 2);
relay_ready($node, 2);

# The producers learn the topic first, then the workers stop polling.
my $warmup = $node->safe_psql('postgres',
	qq{SELECT obx.enqueue('$topic', 'ord_0', '{"n": 0}')});
wait_for_broker($mock, $topic, sub { event_ids_at_broker(shift)->{$warmup} },
	'the warm-up event at the broker');
$node->safe_psql('postgres',
	q{ALTER SYSTEM SET obx.poll_interval = '1h'; SELECT pg_reload_conf()});
$node->poll_query_until('postgres',
	q{SELECT setting = '3600000' FROM pg_settings WHERE name = 'obx.poll_interval'})
  or die 'obx.poll_interval was not reloaded';
mock_cmd($mock, "rtt $_ $rtt_ms") for 1 .. 3;

my $a = $node->safe_psql('postgres',
	qq{SELECT obx.enqueue('$topic', 'ord_1', '{"n": 1}')});
$node->poll_query_until('postgres',
	qq{SELECT count(*) = 1 FROM obx.leases WHERE '$a' = ANY (ids)})
  or die 'event A was not claimed';

my $b = $node->safe_psql('postgres',
	qq{SELECT obx.enqueue('$topic', 'ord_1', '{"n": 2}')});
is($node->safe_psql('postgres', qq{
	SELECT (SELECT published_at IS NULL FROM obx.outbox_events WHERE id = '$a')
	   AND NOT EXISTS (SELECT 1 FROM obx.leases WHERE '$b' = ANY (ids))}),
	't', 'B committed while A was in flight, and B is not leased');

ok(all_published($node), 'B is published without a poll, after A was recorded');

my $order = first_occurrences(read_topic($mock, $topic));
is_deeply($order->{ord_1}, [ $a, $b ], 'the broker holds A then B for key ord_1');

done_testing();
