# Tombstones for compacted topics, end to end.
#
#  1. obx.enqueue_tombstone publishes the key with a null value (and its
#     event_id header), in order with the key's other events: event,
#     event, tombstone, event at the broker in enqueue order; a tombstone
#     of a rolled-back transaction is never published.
#  2. The in-database consumer hands a tombstone that has an event_id
#     header to the handler as a deletion (payload NULL), once, even when
#     Kafka delivers it twice; a tombstone without an event_id header is
#     still a malformed message (a dead letter).
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use ObxConsumer;
use IPC::Run;
use PostgreSQL::Test::Utils;
use Test::More;

my $mock = start_mock();
my $topic = 'customers.compacted.v1';
my $node = consumer_node('tombstones', $mock, topics => { $topic => 2 },
	relays => 1, consumers => 1);

sub q1 { $node->safe_psql('postgres', $_[0]) }

subscribe($node, 'customer-view', [$topic], handler($node, 'shop.apply', q{
		PERFORM nextval('shop.handler_calls');
		PERFORM shop.record(e);}));

############################################################################
# 1. At the broker: a null value, in order with the key's events.
############################################################################
my @ids;
push @ids, q1(qq{SELECT obx.enqueue('$topic', 'cust-1', '{"name": "Ada"}')});
push @ids, q1(qq{SELECT obx.enqueue('$topic', 'cust-1', '{"name": "Ada L."}')});
push @ids, q1(qq{SELECT obx.enqueue_tombstone('$topic', 'cust-1', event_type => 'CustomerDeleted')});
push @ids, q1(qq{SELECT obx.enqueue('$topic', 'cust-1', '{"name": "Ada again"}')});
my $gone = q1(qq{BEGIN;
	CREATE TEMP TABLE t ON COMMIT DROP AS
		SELECT obx.enqueue_tombstone('$topic', 'cust-2') AS id;
	SELECT id FROM t;
	ROLLBACK;});

my $msgs = broker_holds_exactly($mock, $node, $topic, \@ids);
my @cust1 = sort { $a->{offset} <=> $b->{offset} } grep { $_->{key} eq 'cust-1' } @$msgs;
is_deeply([ map { $_->{event_id} } @cust1 ], \@ids,
	'event, event, tombstone, event: the broker has them in enqueue order');
# kcat's %s prints nothing for a null value; an empty value would need a
# payload of zero bytes, which obx never sends.
is($cust1[2]{payload}, '', 'the tombstone has no value at the broker');
is($cust1[2]{headers}{event_type}, 'CustomerDeleted', 'and keeps its event_type header');
ok(!grep({ $_->{event_id} eq $gone } @$msgs), 'a rolled-back tombstone is not published');

# kcat -Z: tell a null value from an empty one.
my ($out, $err) = ('', '');
IPC::Run::run([ 'kcat', '-C', '-b', $mock->{bootstrap}, '-t', $topic, '-Z', '-e', '-q',
	'-o', 'beginning', '-f', "%k %S\n" ], '<', \undef, '>', \$out, '2>', \$err);
like($out, qr/^cust-1 -1$/m, 'kcat reads the tombstone\'s value as NULL (size -1)');

############################################################################
# 2. The consumer's handler sees the deletion, once.
############################################################################
ok($node->poll_query_until('postgres',
	"SELECT count(DISTINCT event_id) = 4 FROM shop.effects WHERE event_key = 'cust-1'"),
	'the consumer handled the four events of cust-1');
is(q1("SELECT payload IS NULL FROM shop.effects WHERE event_id = '$ids[2]'"), 't',
	'the handler gets the tombstone with a NULL payload');
is(q1(qq{SELECT string_agg(coalesce(payload->>'name', '<deleted>'), ', ' ORDER BY kafka_offset)
		   FROM shop.effects WHERE event_key = 'cust-1'}),
	'Ada, Ada L., <deleted>, Ada again', 'in order with the key\'s other events');

# Kafka delivers the tombstone again, and a tombstone without an event_id
# header arrives from another producer.
my $p = $cust1[2]{partition};
produce($mock, $topic,
	{ partition => $p, key => 'cust-1', payload => undef,
	  headers => [ event_id => $ids[2], event_type => 'CustomerDeleted' ] },
	{ partition => $p, key => 'cust-3', payload => undef });
wait_caught_up($node, 'customer-view', $topic, partition_ends($mock, $topic),
	'the copy and the anonymous tombstone');
is(q1("SELECT count(*) FROM shop.effects WHERE event_id = '$ids[2]'"), '1',
	'a tombstone delivered twice is applied once');
is(q1(qq{SELECT coalesce(sum(duplicates), 0) FROM obx.consumer_status
		  WHERE consumer_name = 'customer-view'}), '1', 'and counted as a duplicate');
is(q1(qq{SELECT error_class || ' ' || event_key FROM obx.dead_letters
		  WHERE consumer_name = 'customer-view'}),
	'malformed cust-3', 'a tombstone without an event_id header is a malformed dead letter');

done_testing();
