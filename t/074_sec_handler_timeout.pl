# Reliability: a handler that never returns cannot block its partition.
# The subscription's handler_timeout_ms (default 30 s) is enforced by the
# worker around each call: the call is cancelled when it passes, the
# message is dead-lettered at once (error class handler, SQLSTATE 57014),
# and the next message is applied.  The handler's own statement_timeout
# setting does not matter.  A handler that catches query_canceled and goes
# on looping is cancelled again every second; five seconds on, the worker
# ends itself and its successor dead-letters the message without calling
# the handler again, and the next message is applied.  Bad values of the
# option are refused by obx.subscribe.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use ObxConsumer;
use PostgreSQL::Test::Utils;
use Test::More;

my $mock = start_mock();
my $topic = 'sec.timeout.v1';
my $consumer = 'stock-timeout';

my $node = consumer_node('sec_handler_timeout', $mock, topics => { $topic => 1 });

sub q1 { $node->safe_psql('postgres', $_[0]) }

my $reserve = handler($node, 'shop.reserve', q{
		-- The handlers under test loop forever; their sleeps are the loops'
		-- bodies, not waits of the test (which polls for the dead letters).
		IF e.payload->>'loop' = 'yes' THEN
			LOOP
				PERFORM pg_catalog.pg_sleep(0.05);    -- the loop's body, not a wait
			END LOOP;
		END IF;
		IF e.payload->>'loop' = 'stubborn' THEN
			LOOP
				BEGIN
					PERFORM pg_catalog.pg_sleep(0.05);    -- the loop's body, not a wait
				EXCEPTION WHEN query_canceled THEN
					NULL;
				END;
			END LOOP;
		END IF;
		PERFORM shop.record(e);},
	set => 'statement_timeout = 0');

# Bad values of the option.
for my $bad ('-1', '"1000"', '1.5', '{}', '2147483648')
{
	my ($rc, $out, $err) = $node->psql('postgres', qq{
		SELECT obx.subscribe('$consumer', ARRAY['$topic'], 'shop.reserve(obx.inbound_event)',
			'{"handler_timeout_ms": $bad}')});
	like($err, qr/option "handler_timeout_ms" must be a whole number of milliseconds/,
		"handler_timeout_ms $bad is refused");
}

subscribe($node, $consumer, [$topic], $reserve, handler_timeout_ms => 1000);

produce($mock, $topic,
	{ partition => 0, key => 'a', headers => [ event_id => 'to-1' ], payload => '{"loop": "no"}' },
	{ partition => 0, key => 'b', headers => [ event_id => 'to-loop' ], payload => '{"loop": "yes"}' },
	{ partition => 0, key => 'c', headers => [ event_id => 'to-2' ], payload => '{"loop": "no"}' });
wait_caught_up($node, $consumer, $topic, partition_ends($mock, $topic),
	'the looping handler was stopped and the next message applied');

is_deeply(effects_per_event($node), { 'to-1' => 1, 'to-2' => 1 },
	'the messages before and after the looping one were applied once');
is(q1(qq{SELECT kafka_offset || ' ' || event_id || ' ' || error_class || ' ' || error_sqlstate
		  FROM obx.dead_letters WHERE consumer_name = '$consumer'}),
	'1 to-loop handler 57014', 'the looping one is a dead letter: class handler, SQLSTATE 57014');
like(q1(qq{SELECT error_message FROM obx.dead_letters WHERE consumer_name = '$consumer'}),
	qr/obx handler shop\.reserve\(obx\.inbound_event\) ran longer than its timeout of 1000 ms/,
	'its error says the handler ran past its timeout');
is(q1(qq{SELECT retries FROM obx.consumer_status WHERE consumer_name = '$consumer'}), '0',
	'the timeout was not retried');

# The worker goes on after a timeout: another message is applied.
produce($mock, $topic,
	{ partition => 0, key => 'd', headers => [ event_id => 'to-3' ], payload => '{"loop": "no"}' });
wait_caught_up($node, $consumer, $topic, partition_ends($mock, $topic), 'a later message');
is(effects_per_event($node)->{'to-3'}, 1, 'a later message was applied');

# A handler that catches the cancel.
my ($pid) = @{ consumer_pids($node) };
produce($mock, $topic,
	{ partition => 0, key => 'e', headers => [ event_id => 'to-stubborn' ], payload => '{"loop": "stubborn"}' },
	{ partition => 0, key => 'f', headers => [ event_id => 'to-4' ], payload => '{"loop": "no"}' });
wait_caught_up($node, $consumer, $topic, partition_ends($mock, $topic),
	'the handler that caught the cancel was stopped and the next message applied');
is(effects_per_event($node)->{'to-4'}, 1, 'the message after it was applied once');
is(q1(qq{SELECT error_class || ' ' || error_sqlstate FROM obx.dead_letters
		  WHERE consumer_name = '$consumer' AND event_id = 'to-stubborn'}),
	'handler 57014', 'the stubborn one is a dead letter: class handler, SQLSTATE 57014');
like(q1(qq{SELECT error_message FROM obx.dead_letters
		    WHERE consumer_name = '$consumer' AND event_id = 'to-stubborn'}),
	qr/did not stop after its timeout of 1000 ms, and its consumer worker was restarted/,
	'its error says the worker was restarted');
isnt(consumer_pids($node)->[0], $pid, 'the consumer worker was restarted');
is(q1(qq{SELECT count(*) FROM obx.dead_letters WHERE consumer_name = '$consumer'}), '2',
	'two dead letters in all');

done_testing();
