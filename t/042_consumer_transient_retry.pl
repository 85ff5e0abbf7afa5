# Consumer window: the handler fails with a transient error (SQLSTATE
# 40001, serialization_failure) again and again, then succeeds.  While it
# fails: the transaction is rolled back (no effect, no mark in
# obx.processed_events), the partition's offset does not move
# (consumer_status.next_offset stays at the failing message) while
# consumer_status.retries grows, the later messages of that partition
# wait, the other partitions keep flowing, and nothing is dead-lettered.
# Once the cause is gone the event's effect is applied exactly once and
# its partition's later messages follow, in order.  Also: an extra
# SQLSTATE listed in the subscription's retry_sqlstates is transient too.
#
# The handler fails while nextval() of a sequence (not rolled back with
# the failed transaction) is at most a limit read from a table; the limit
# starts huge, so the failing lasts until the test has seen what it must
# see, then it is set to "two more failures".
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use ObxConsumer;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $mock = start_mock();
my $topic = 'stock.retry.v1';
my $consumer = 'stock-retry';

# One consumer worker: it must keep the other partitions going itself
# while one partition waits.  obx_node sets obx.backoff_min = 50ms,
# obx.backoff_max = 1s.  No relay: kcat chooses the partitions.
my $node = consumer_node('consumer_retry', $mock, topics => { $topic => 4 });

sub q1 { $node->safe_psql('postgres', $_[0]) }

q1(q{
	CREATE TABLE shop.knobs (fail_through bigint NOT NULL);
	INSERT INTO shop.knobs VALUES (1000000000);
	CREATE SEQUENCE shop.flaky_attempts;
});
subscribe($node, $consumer, [$topic], handler($node, 'shop.reserve', q{
		PERFORM nextval('shop.handler_calls');
		IF e.payload->>'flaky' = 'yes' THEN
			IF nextval('shop.flaky_attempts') <= (SELECT fail_through FROM shop.knobs) THEN
				RAISE EXCEPTION 'stock service busy, try again'
					USING ERRCODE = 'serialization_failure';
			END IF;
		END IF;
		PERFORM shop.record(e);}));

sub applied
{
	my ($id) = @_;
	return q1("SELECT count(*) FROM shop.effects WHERE event_id = '$id'");
}

############################################################################
# 1. The flaky event fails; its partition waits, the others flow.
############################################################################
my $p = 1;          # the flaky event's partition
my $q = 2;          # another partition
my $t_start = time();
produce($mock, $topic,
	sku_message($p, 'evt-before'),
	sku_message($p, 'evt-flaky', flaky => 'yes'),
	sku_message($p, 'evt-later-1'),
	sku_message($p, 'evt-later-2'),
	sku_message($q, 'evt-other-1'),
	sku_message($q, 'evt-other-2'));
my ($flaky) = @{ find_message($mock, $topic, sub { ($_[0]{event_id} // '') eq 'evt-flaky' }) };
is("$flaky->{partition} $flaky->{offset}", "$p 1", 'the flaky event is at offset 1 of its partition');

ok($node->poll_query_until('postgres', qq{
	SELECT (SELECT count(*) = 3 FROM shop.effects
			 WHERE event_id IN ('evt-before', 'evt-other-1', 'evt-other-2'))
	   AND (SELECT retries >= 2 FROM obx.consumer_status
			 WHERE consumer_name = '$consumer' AND topic = '$topic' AND kafka_partition = $p)}),
	'the events around the flaky one are handled while it failed at least twice');
my $s1 = partition_status($node, $consumer, $topic)->{$p};

# More events on the other partition flow while the flaky one keeps failing.
produce($mock, $topic, sku_message($q, 'evt-other-3'), sku_message($q, 'evt-other-4'));
ok($node->poll_query_until('postgres', qq{
	SELECT (SELECT count(*) = 2 FROM shop.effects
			 WHERE event_id IN ('evt-other-3', 'evt-other-4'))
	   AND (SELECT retries > $s1->{retries} FROM obx.consumer_status
			 WHERE consumer_name = '$consumer' AND topic = '$topic' AND kafka_partition = $p)}),
	'the other partition keeps flowing while the flaky event goes on failing');
my $s2 = partition_status($node, $consumer, $topic)->{$p};

is("$s1->{next_offset} $s2->{next_offset}", '1 1',
	"next_offset of partition $p stays at the failing message (retries $s1->{retries}, then $s2->{retries})");
is(applied('evt-flaky') . applied('evt-later-1') . applied('evt-later-2'), '000',
	'neither the failing event nor the later events of its partition has an effect');
is(q1(q{SELECT count(*) FROM obx.processed_events WHERE event_id = 'evt-flaky'}), '0',
	'the failed transactions left no mark in obx.processed_events');
is(q1(qq{SELECT count(*) FROM obx.dead_letters WHERE consumer_name = '$consumer'}), '0',
	'a transient failure is never dead-lettered');
like($s2->{last_error}, qr/stock service busy/, 'consumer_status shows the last error');
note("last_error_class: $s2->{last_error_class}; last_error: $s2->{last_error}");
# Monitoring sees the partition fall behind: the failing message and the
# two after it.
ok($node->poll_query_until('postgres', qq{
	SELECT lag = 3 FROM obx.consumer_status
	 WHERE consumer_name = '$consumer' AND topic = '$topic' AND kafka_partition = $p}),
	"consumer_status.lag of partition $p is 3 while its first message fails");
my $attempts = q1('SELECT last_value FROM shop.flaky_attempts');
my $elapsed = time() - $t_start;
cmp_ok($s2->{retries}, '<=', $attempts,
	"retries ($s2->{retries}) count failed attempts ($attempts so far)");
# obx.backoff_min is 50 ms and doubles: even without the doubling, no more
# than one attempt per 50 ms since the event was sent.
cmp_ok($attempts, '<=', 1 + $elapsed / 0.05,
	sprintf('the retries back off: %d attempts in %.1f s', $attempts, $elapsed));

############################################################################
# 2. The cause goes away: exactly once, then the rest of the partition.
############################################################################
# Two more failures, then success: attempts numbered up to the limit fail.
my $limit = q1(q{
	UPDATE shop.knobs SET fail_through = (SELECT last_value FROM shop.flaky_attempts) + 2
	RETURNING fail_through});
wait_caught_up($node, $consumer, $topic, partition_ends($mock, $topic), 'after the recovery');

is(applied('evt-flaky'), '1', 'the flaky event has its effect exactly once');
is(q1('SELECT last_value FROM shop.flaky_attempts'), $limit + 1,
	"its handler ran $limit times in vain, then once with success, then never again");
my $s = partition_status($node, $consumer, $topic);
is($s->{$p}{retries}, $limit, "consumer_status.retries of partition $p counts the $limit failures");
is("$s->{$p}{processed} $s->{$p}{dead_lettered} $s->{$q}{processed} $s->{$q}{retries}",
	'4 0 4 0', 'every message of both partitions is processed, without retries on the other one');
is(q1(q{SELECT string_agg(event_id, ' ' ORDER BY n) FROM shop.effects
		 WHERE event_id IN ('evt-before', 'evt-flaky', 'evt-later-1', 'evt-later-2')}),
	'evt-before evt-flaky evt-later-1 evt-later-2',
	'the partition\'s events were applied in offset order, the later ones after the flaky one');
is_deeply(effects_per_event($node),
	{ map { $_ => 1 } qw(evt-before evt-flaky evt-later-1 evt-later-2
		evt-other-1 evt-other-2 evt-other-3 evt-other-4) },
	'every event has its effect exactly once');
is(q1(qq{SELECT count(*) FROM obx.dead_letters WHERE consumer_name = '$consumer'}), '0',
	'nothing was dead-lettered');
ok($node->poll_query_until('postgres', qq{
	SELECT lag = 0 FROM obx.consumers WHERE consumer_name = '$consumer'}),
	'obx.consumers shows no lag once every message is handled');

############################################################################
# 3. retry_sqlstates: an error class of the handler's choice is transient.
############################################################################
my $topic2 = 'stock.retry.custom.v1';
my $consumer2 = 'stock-retry-custom';
mock_cmd($mock, "topic-create $topic2 1");
q1(qq{
	CREATE SEQUENCE shop.custom_attempts;
	CREATE FUNCTION shop.reserve_custom(e obx.inbound_event) RETURNS void
	LANGUAGE plpgsql AS \$\$
	BEGIN
		IF nextval('shop.custom_attempts') <= 2 THEN
			RAISE EXCEPTION 'warehouse API says: later';    -- P0001
		END IF;
		PERFORM shop.record(e);
	END
	\$\$;
	SELECT obx.subscribe('$consumer2', ARRAY['$topic2'],
		'shop.reserve_custom(obx.inbound_event)',
		'{"retry_sqlstates": ["P0001"], "kafka": {"session.timeout.ms": "6000"}}');
});
produce($mock, $topic2, sku_message(0, 'evt-custom'));
wait_caught_up($node, $consumer2, $topic2, { 0 => 1 }, 'the event with a retried P0001');
is(applied('evt-custom'), '1', 'an event failing with a listed SQLSTATE is applied once, in the end');
my $c = partition_status($node, $consumer2, $topic2)->{0};
is("$c->{retries} $c->{processed} $c->{dead_lettered}", '2 1 0',
	'its two P0001 failures were retries, not dead letters');
is(q1('SELECT last_value FROM shop.custom_attempts'), '3', 'its handler ran three times');

done_testing();
