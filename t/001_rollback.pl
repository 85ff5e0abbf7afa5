# Window 1: rollback.  Events enqueued in transactions (or savepoints) that
# roll back never reach Kafka; events of committed ones all do.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $mock = start_mock();
my $node = obx_node('rollback', $mock);
my $topic = 'orders.placed.v1';

my ($committed, $rolled_back) = enqueue_with_rollbacks($node, $topic, 20);
is(scalar(keys %$rolled_back), 40, '40 rolled-back event ids were handed out');

# Wait until every committed event is at the broker, then compare sets and,
# per key, the broker order with the enqueue order.
my $msgs = broker_holds_exactly($mock, $node, $topic, [ keys %$committed ]);
ok(all_published($node), 'the outbox has nothing left to publish');

my $seen = event_ids_at_broker($msgs);
is(scalar(grep { $seen->{$_} } keys %$rolled_back), 0,
	'no rolled-back event reached the broker');
is($node->safe_psql('postgres',
	'SELECT count(*) FROM obx.outbox_events WHERE id IN (' .
	join(',', map { "'$_'" } keys %$rolled_back) . ')'), '0',
	'no rolled-back event exists in the outbox');

done_testing();
