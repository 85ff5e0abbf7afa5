# Reliability: a handler that never returns cannot block its partition.
# The subscription's handler_timeout_ms (default 30 s) is enforced by the
# worker around each call: the call is cancelled when it passes, the
# message is dead-lettered at once (error class handler, SQLSTATE 57014),
# and the next message is applied.  The handler's own statement_timeout
# setting does not matter.  Bad values of the option are refused by
# obx.subscribe.
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
mock_cmd($mock, "topic-create $topic 1");

my $node = obx_node('sec_handler_timeout', $mock,
	'obx.workers' => 0,
	'obx.consumer_workers' => 1);
wait_consumer_pids($node, 1);

sub q1 { $node->safe_psql('postgres', $_[0]) }

create_effects($node);
q1(q{
	CREATE FUNCTION shop.reserve(e obx.inbound_event) RETURNS void
	LANGUAGE plpgsql SET statement_timeout = 0 AS $$
	BEGIN
		IF e.payload->>'loop' = 'yes' THEN
			LOOP
				PERFORM pg_catalog.pg_sleep(0.05);
			END LOOP;
		END IF;
		PERFORM shop.record(e);
	END $$;
});

# Bad values of the option.
for my $bad ('-1', '"1000"', '1.5', '{}', '2147483648')
{
	my ($rc, $out, $err) = $node->psql('postgres', qq{
		SELECT obx.subscribe('$consumer', ARRAY['$topic'], 'shop.reserve(obx.inbound_event)',
			'{"handler_timeout_ms": $bad}')});
	like($err, qr/option "handler_timeout_ms" must be a whole number of milliseconds/,
		"handler_timeout_ms $bad is refused");
}

q1(qq{SELECT obx.subscribe('$consumer', ARRAY['$topic'], 'shop.reserve(obx.inbound_event)',
	'{"handler_timeout_ms": 1000}')});

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

done_testing();
