# Consumer: a subscription's max_attempts bounds the transient failures of
# one message.  The handler of a "poison" event raises a transient error
# (40001 on one partition, a code listed in retry_sqlstates on another) on
# every call; with max_attempts 3 its handler is called exactly three
# times, the third failure dead-letters the message with the handler's
# error and the attempt count, and the later messages of its partition
# follow in order, once each.  A message that fails twice and then
# succeeds is applied, not dead-lettered: the count is per message.  The
# dead letter replays once the cause is gone.
#
# Each handler call advances a sequence of its event (not rolled back with
# the failed subtransaction), so the calls are counted: a poison event's
# calls are exactly its failures.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use ObxConsumer;
use PostgreSQL::Test::Utils;
use Test::More;

my $mock = start_mock();
my $topic = 'stock.attempts.v1';
my $consumer = 'stock-attempts';

# One consumer worker: one member, so no rebalance resets what it counts.
my $node = consumer_node('consumer_attempts', $mock, topics => { $topic => 4 });

sub q1 { $node->safe_psql('postgres', $_[0]) }

q1(q{
	CREATE TABLE shop.knobs (healthy boolean NOT NULL);
	INSERT INTO shop.knobs VALUES (false);
	CREATE TABLE shop.calls (event_id text PRIMARY KEY, calls regclass NOT NULL);
	CREATE SEQUENCE shop.calls_poison_40001;
	CREATE SEQUENCE shop.calls_poison_listed;
	CREATE SEQUENCE shop.calls_twice;
	INSERT INTO shop.calls VALUES
		('evt-poison-40001', 'shop.calls_poison_40001'),
		('evt-poison-listed', 'shop.calls_poison_listed'),
		('evt-twice', 'shop.calls_twice');
});
subscribe($node, $consumer, [$topic], handler($node, 'shop.reserve', q{
		PERFORM nextval('shop.handler_calls');
		SELECT nextval(calls) INTO n FROM shop.calls WHERE event_id = e.event_id;
		IF NOT (SELECT healthy FROM shop.knobs) THEN
			IF e.event_id = 'evt-poison-40001' THEN
				RAISE EXCEPTION 'stock service busy'
					USING ERRCODE = 'serialization_failure';
			ELSIF e.event_id = 'evt-poison-listed' THEN
				RAISE EXCEPTION 'stock service still warming up' USING ERRCODE = 'OB001';
			ELSIF e.event_id = 'evt-twice' AND n <= 2 THEN
				RAISE EXCEPTION 'stock service busy for a moment'
					USING ERRCODE = 'serialization_failure';
			END IF;
		END IF;
		PERFORM shop.record(e);}, declare => 'n bigint;'),
	retry_sqlstates => ['OB001'], max_attempts => 3);

sub calls { q1("SELECT last_value - 1 + is_called::int FROM $_[0]") }

# Partition 1: a 40001 poison between others; partition 2: a poison whose
# code the subscription lists; partition 3: fails twice, then succeeds.
my @expected = (
	[ 1, 'evt-1-before', 'evt-1-after-1', 'evt-1-after-2' ],
	[ 2, 'evt-2-before', 'evt-2-after' ],
	[ 3, 'evt-3-before', 'evt-twice', 'evt-3-after' ]);
produce($mock, $topic,
	(map { sku_message(1, $_) } 'evt-1-before', 'evt-poison-40001', 'evt-1-after-1', 'evt-1-after-2'),
	(map { sku_message(2, $_) } 'evt-2-before', 'evt-poison-listed', 'evt-2-after'),
	(map { sku_message(3, $_) } 'evt-3-before', 'evt-twice', 'evt-3-after'));
my $ends = partition_ends($mock, $topic);
wait_caught_up($node, $consumer, $topic, $ends, 'every message, poison included, to be settled');

is(calls('shop.calls_poison_40001'), '3', 'the 40001 poison: its handler was called 3 times');
is(calls('shop.calls_poison_listed'), '3', 'the listed-code poison: its handler was called 3 times');
# Its two failures are its first two calls; a successful call can come
# twice when its group is rolled back for a later message's failure.
cmp_ok(calls('shop.calls_twice'), '>=', 3, 'the event that failed twice was called again');

is(q1(qq{SELECT string_agg(format('%s %s %s %s', event_id, kafka_partition, error_class, error_sqlstate),
		', ' ORDER BY kafka_partition)
	FROM obx.dead_letters WHERE consumer_name = '$consumer'}),
	'evt-poison-40001 1 handler 40001, evt-poison-listed 2 handler OB001',
	'both poison messages, and only they, are dead letters with the handler\'s SQLSTATE');
like(q1(qq{SELECT error_message FROM obx.dead_letters WHERE event_id = 'evt-poison-40001'}),
	qr/^stock service busy \(attempt 3 of max_attempts 3\)$/,
	'the dead letter gives the handler\'s error and the attempt count');

my $effects = effects_per_event($node);
for my $e (@expected)
{
	my ($p, @ids) = @$e;
	is(q1(qq{SELECT string_agg(event_id, ' ' ORDER BY kafka_offset)
		FROM shop.effects WHERE kafka_partition = $p}),
		join(' ', @ids), "partition $p: the applied events in offset order");
}
is_deeply([ grep { $effects->{$_} != 1 } sort keys %$effects ], [],
	'every applied event has its effect exactly once');
ok(!exists $effects->{'evt-poison-40001'} && !exists $effects->{'evt-poison-listed'},
	'the poison events have no effect');

my $s = partition_status($node, $consumer, $topic);
is("$s->{1}{retries} $s->{1}{dead_lettered} $s->{2}{retries} $s->{2}{dead_lettered} "
	. "$s->{3}{retries} $s->{3}{dead_lettered}", '2 1 2 1 2 0',
	'consumer_status: two retries before each dead letter, two before the recovered event');

# The cause goes away: the dead letters replay, once.
q1('UPDATE shop.knobs SET healthy = true');
is(q1(qq{SELECT obx.replay_dead_letter('$consumer')}), '2',
	'both dead letters replay once the handler succeeds');
$effects = effects_per_event($node);
is(($effects->{'evt-poison-40001'} // 0) . ' ' . ($effects->{'evt-poison-listed'} // 0), '1 1',
	'each poison event now has its effect once');

$node->stop;
done_testing();
