# The consumer applies a batch's messages in groups: one subtransaction, one
# statement marking every event of the group, one prepared handler call
# (src/consumer/inbox_group.c).  What a group must keep of the per-message path:
#
# 1. A LANGUAGE sql handler, whose plans a group keeps from one call to the
#    next, still sees the effects of every earlier message: each call
#    counts the rows before its own, and the counts run 0, 1, 2, ... in
#    offset order.
# 2. Each handler call has its own GUC nest level: what one call sets
#    locally is gone for the next call of the same group.  A handler that
#    fails in the middle of a group is called once, not again when its
#    message is applied alone: it is dead-lettered with the error of that
#    one call, and the messages around it are applied exactly once, in
#    order.
# 3. Subtransaction ids: a handler with an exception block that writes
#    takes one per call.  After a batch that overflowed the backend's
#    cache of 64, the worker makes its batches small enough to stay under
#    it: every transaction after the first one above 48 messages applies
#    at most 48, though obx.consumer_batch_size is 500.  (A batch holds
#    what the consumer has fetched, so one before it may be smaller.)
#
# Every message is at the broker before its subscription exists, so the
# first fetch brings many of them into one batch.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use ObxConsumer;
use PostgreSQL::Test::Utils;
use Test::More;

my $mock = start_mock();
my ($t_sql, $t_fail, $t_sub) = ('stock.groups.sql.v1', 'stock.groups.fail.v1',
	'stock.groups.subxids.v1');

my $node = consumer_node('consumer_groups', $mock,
	topics => { $t_sql => 1, $t_fail => 1, $t_sub => 1 },
	conf => { 'obx.consumer_batch_size' => 500, 'obx.consumer_batch_time' => "'1s'" });

sub q1 { $node->safe_psql('postgres', $_[0]) }

sub msgs
{
	my ($prefix, $n, %extra) = @_;
	return map {
		my $id = "$prefix-$_";
		my $x = $extra{$id} ? qq{, "bad": "yes"} : '';
		{ partition => 0, key => 'sku-1', payload => qq({"eventId": "$id"$x}) }
	} 1 .. $n;
}

sub in_order
{
	my ($table, $topic) = @_;
	return q1(qq{SELECT string_agg(event_id, ' ' ORDER BY n) FROM $table WHERE topic = '$topic'});
}

############################################################################
# 1. A LANGUAGE sql handler sees every earlier effect.
############################################################################
q1(q{
	CREATE TABLE shop.counted (n bigserial PRIMARY KEY, event_id text, topic text,
		kafka_offset bigint, rows_before bigint);
	CREATE FUNCTION shop.count_in(e obx.inbound_event) RETURNS void
	LANGUAGE sql AS $$
		INSERT INTO shop.counted (event_id, topic, kafka_offset, rows_before)
		SELECT e.event_id, e.topic, e.kafka_offset, count(*) FROM shop.counted
	$$;
});
produce($mock, $t_sql, msgs('s', 40));
subscribe($node, 'groups-sql', [$t_sql], 'shop.count_in(obx.inbound_event)');
wait_caught_up($node, 'groups-sql', $t_sql, { 0 => 40 }, 'the sql handler');
is(q1(q{SELECT string_agg(kafka_offset || ':' || rows_before, ' ' ORDER BY n) FROM shop.counted}),
	join(' ', map { "$_:$_" } 0 .. 39),
	'each call of the sql handler saw the rows of every message before it, in offset order');

############################################################################
# 2. Settings do not leak from one call to the next; a failing handler is
#    called once.
############################################################################
q1(q{
	CREATE TABLE shop.settings_seen (event_id text, leaked text);
	CREATE SEQUENCE shop.bad_calls;
});
produce($mock, $t_fail, msgs('f', 30, 'f-17' => 1));
subscribe($node, 'groups-fail', [$t_fail], handler($node, 'shop.reserve', q{
		INSERT INTO shop.settings_seen VALUES (e.event_id, current_setting('obx_test.last', true));
		PERFORM set_config('obx_test.last', e.event_id, true);
		PERFORM shop.record(e);
		IF e.payload->>'bad' = 'yes' THEN
			PERFORM nextval('shop.bad_calls');
			RAISE EXCEPTION 'no such sku' USING ERRCODE = 'P0001';
		END IF;}));
wait_caught_up($node, 'groups-fail', $t_fail, { 0 => 30 }, 'the failing handler');
is(in_order('shop.effects', $t_fail), join(' ', map { "f-$_" } grep { $_ != 17 } 1 .. 30),
	'the messages around the failing one are applied once each, in offset order');
is(q1(qq{SELECT string_agg(kafka_offset || ' ' || event_id || ' ' || error_class, ', ')
		 FROM obx.dead_letters WHERE consumer_name = 'groups-fail'}),
	'16 f-17 handler', 'the failing message is dead-lettered, and nothing else is');
is(q1(q{SELECT last_value || ' ' || is_called FROM shop.bad_calls}), '1 true',
	'its handler was called once: not again when its message was applied alone');
is(q1(q{SELECT count(*) FROM shop.settings_seen WHERE coalesce(leaked, '') <> ''}), '0',
	'no handler call saw a setting an earlier call had set locally');
is(q1(q{SELECT count(*) FROM shop.settings_seen}), '29',
	'every applied message recorded what it saw');

############################################################################
# 3. Batches stay under the backend's cache of subtransaction ids.
############################################################################
my $n = 1200;
q1(q{
	CREATE TABLE shop.tx (event_id text PRIMARY KEY, top_xid xid8);
});
produce($mock, $t_sub, msgs('x', $n));
subscribe($node, 'groups-subxids', [$t_sub], handler($node, 'shop.reserve_sub', q{
		BEGIN
			INSERT INTO shop.tx VALUES (e.event_id, pg_current_xact_id());
		EXCEPTION WHEN unique_violation THEN
			RAISE;
		END;}));
wait_caught_up($node, 'groups-subxids', $t_sub, { 0 => $n }, 'the exception-block handler');
is(q1(q{SELECT count(*) FROM shop.tx}), $n, "all $n messages applied");
my @sizes = split /\n/, q1(q{
	SELECT count(*) FROM shop.tx GROUP BY top_xid ORDER BY min(split_part(event_id, '-', 2)::int)});
note('messages per transaction: ' . join(' ', @sizes));
cmp_ok(scalar(@sizes), '>=', 2, 'the messages took more than one transaction');
my ($first_big) = grep { $sizes[$_] > 48 } 0 .. $#sizes;
$first_big //= -1;
my @later = @sizes[ $first_big + 1 .. $#sizes ];
my @big = grep { $_ > 48 } @later;
is(scalar(@big), 0,
	'every transaction after the first above 48 messages applied at most 48 (none overflowed the cache of 64 subtransaction ids)');

done_testing();
