# Consumer windows inside one batch (obx.consumer_batch_size: one
# transaction for many messages, each in a subtransaction of its own):
#
# 1. A message whose handler fails (a non-transient error) in the middle of
#    its partition's messages in a batch is dead-lettered, its effect rolled
#    back with its subtransaction; the messages before and after it in the
#    batch are applied exactly once, in offset order.  A second message
#    with the event id of one earlier in the same batch is a duplicate.
# 2. A message that fails transiently in the middle of another partition's
#    messages holds only that partition: the messages of that partition
#    after it in the batch are not applied while it fails (the rest of the
#    batch commits), its partition's offset stays on it, and once it
#    succeeds it and the later ones are applied once, in order.
#
# Every message is at the broker, sent by one kcat run per partition (the
# event id is in the payload), before the subscription exists, so the
# consumer's first fetch brings them all into its first batch.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use ObxConsumer;
use PostgreSQL::Test::Utils;
use Test::More;

my $mock = start_mock();
my $topic = 'stock.batchfail.v1';
my $consumer = 'stock-batch-fail';

my $node = consumer_node('consumer_batch_fail', $mock, topics => { $topic => 2 },
	conf => { 'obx.consumer_batch_size' => 500, 'obx.consumer_batch_time' => "'1s'" });

sub q1 { $node->safe_psql('postgres', $_[0]) }

q1(q{
	CREATE TABLE shop.knobs (fail_through bigint NOT NULL);
	INSERT INTO shop.knobs VALUES (1000000000);
	CREATE SEQUENCE shop.flaky_attempts;
});

sub msg
{
	my ($partition, $id, %extra) = @_;
	return { partition => $partition, key => "sku-$partition",
		payload => '{"eventId": "' . $id . '", "sku": "sku-' . $partition . '"'
		  . join('', map { qq{, "$_": "$extra{$_}"} } sort keys %extra) . '}' };
}

sub applied
{
	my ($id) = @_;
	return q1("SELECT count(*) FROM shop.effects WHERE event_id = '$id'");
}

sub order_of
{
	my ($partition) = @_;
	return q1(qq{SELECT string_agg(event_id, ' ' ORDER BY n) FROM shop.effects
		WHERE kafka_partition = $partition});
}

my ($p, $q) = (0, 1);
produce($mock, $topic,
	msg($p, 'a-1'), msg($p, 'a-2'), msg($p, 'a-bad', bad => 'yes'),
	msg($p, 'a-4'), msg($p, 'a-2', copy => 'yes'), msg($p, 'a-5'),
	msg($q, 'b-1'), msg($q, 'b-flaky', flaky => 'yes'), msg($q, 'b-3'), msg($q, 'b-4'));

# The effect is recorded first, then the handler fails: the dead letter's
# and the transient failure's effects must be rolled back with their
# subtransactions.
subscribe($node, $consumer, [$topic], handler($node, 'shop.reserve', q{
		PERFORM shop.record(e);
		IF e.payload->>'bad' = 'yes' THEN
			RAISE EXCEPTION 'no such sku' USING ERRCODE = 'P0001';
		END IF;
		IF e.payload->>'flaky' = 'yes' THEN
			IF nextval('shop.flaky_attempts') <= (SELECT fail_through FROM shop.knobs) THEN
				RAISE EXCEPTION 'stock service busy, try again'
					USING ERRCODE = 'serialization_failure';
			END IF;
		END IF;}));

############################################################################
# 1. The failing message in the middle of partition 0.
############################################################################
wait_caught_up($node, $consumer, $topic, { $p => 6 }, "partition $p");
is(order_of($p), 'a-1 a-2 a-4 a-5',
	'the messages before and after the failing one are applied once, in offset order');
is(applied('a-bad'), '0', 'the failing message left no effect');
is(q1(qq{SELECT string_agg(kafka_offset || ' ' || event_id || ' ' || error_class, ', ')
		 FROM obx.dead_letters WHERE consumer_name = '$consumer'}),
	'2 a-bad handler', 'it is dead-lettered, and nothing else is');
my $s = partition_status($node, $consumer, $topic)->{$p};
is("$s->{processed} $s->{duplicates} $s->{dead_lettered}", '4 1 1',
	"consumer_status of partition $p: 4 processed, 1 duplicate (the copy of a-2), 1 dead-lettered");

############################################################################
# 2. The transient failure in the middle of partition 1.
############################################################################
ok($node->poll_query_until('postgres', qq{
	SELECT retries >= 2 FROM obx.consumer_status
	 WHERE consumer_name = '$consumer' AND topic = '$topic' AND kafka_partition = $q}),
	'the flaky message failed at least twice');
is(order_of($q), 'b-1', 'only the message before the flaky one is applied');
is(applied('b-flaky') . applied('b-3') . applied('b-4'), '000',
	'neither the flaky message nor the later ones of its partition has an effect');
is(q1(q{SELECT count(*) FROM obx.processed_events WHERE event_id IN ('b-flaky', 'b-3', 'b-4')}),
	'0', 'none of them is marked processed');
is(partition_status($node, $consumer, $topic)->{$q}{next_offset}, '1',
	"next_offset of partition $q stays at the flaky message");

q1(q{UPDATE shop.knobs SET fail_through = (SELECT last_value FROM shop.flaky_attempts) + 1});
wait_caught_up($node, $consumer, $topic, partition_ends($mock, $topic), 'after the recovery');
is(order_of($q), 'b-1 b-flaky b-3 b-4',
	'once it succeeds, it and the later messages are applied in offset order');
is_deeply(effects_per_event($node),
	{ map { $_ => 1 } qw(a-1 a-2 a-4 a-5 b-1 b-flaky b-3 b-4) },
	'every effect is applied exactly once');
is(order_of($p), 'a-1 a-2 a-4 a-5', 'partition 0 was not applied again');
$s = partition_status($node, $consumer, $topic)->{$q};
is("$s->{processed} $s->{dead_lettered}", '4 0',
	"consumer_status of partition $q: 4 processed, none dead-lettered");

done_testing();
