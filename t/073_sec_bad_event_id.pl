# Reliability: an event id that could never be recorded does not block its
# partition.  An event_id header of 5,000 characters (and an eventId of
# 5,000 characters in the payload) could not be marked processed: the
# dedupe index refuses it (54000), which used to be classed transient and
# retried forever.  Each is dead-lettered at once as malformed, with the reason,
# and the message after it is applied.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use ObxConsumer;
use PostgreSQL::Test::Utils;
use Test::More;

my $mock = start_mock();
my $topic = 'sec.badid.v1';
my $consumer = 'stock-badid';

my $node = consumer_node('sec_bad_event_id', $mock, topics => { $topic => 1 });

sub q1 { $node->safe_psql('postgres', $_[0]) }

subscribe($node, $consumer, [$topic], 'shop.record(obx.inbound_event)');

# Random characters: a repeated one would compress into the index and fit.
srand(73);
my @chars = ('a' .. 'z', 'A' .. 'Z', '0' .. '9');
my $long = join('', map { $chars[ int(rand(@chars)) ] } 1 .. 5000);
my $long2 = join('', map { $chars[ int(rand(@chars)) ] } 1 .. 5000);
produce($mock, $topic,
	{ partition => 0, key => 'a', headers => [ event_id => $long ], payload => '{"n": 1}' },
	{ partition => 0, key => 'b', headers => [ event_id => 'ok-1' ], payload => '{"n": 2}' },
	{ partition => 0, key => 'c', payload => qq({"eventId": "$long2", "n": 3}) },
	{ partition => 0, key => 'd', headers => [ event_id => 'ok-2' ], payload => '{"n": 4}' });
wait_caught_up($node, $consumer, $topic, partition_ends($mock, $topic),
	'the oversized ids and the events after them');

is_deeply(effects_per_event($node), { 'ok-1' => 1, 'ok-2' => 1 },
	'the events after the oversized ids were applied once; the oversized ones not at all');
is(q1(qq{SELECT pg_catalog.string_agg(kafka_offset || ' ' || error_class || ' '
				|| coalesce(event_id, '-') || ' ' || error_message, E'\n' ORDER BY kafka_offset)
		  FROM obx.dead_letters WHERE consumer_name = '$consumer'}),
	"0 malformed - event id is not valid: 5000 bytes, at most 512 allowed\n"
	  . "2 malformed - event id is not valid: 5000 bytes, at most 512 allowed",
	'both are dead letters, malformed, with the reason');
is(q1(qq{SELECT pg_catalog.length(headers->>'event_id') FROM obx.dead_letters
		  WHERE consumer_name = '$consumer' AND kafka_offset = 0}), '5000',
	'the dead letter keeps the header as received');
is(q1(qq{SELECT processed || ' ' || dead_lettered || ' ' || retries FROM obx.consumer_status
		  WHERE consumer_name = '$consumer'}), '2 2 0',
	'consumer_status: two processed, two dead-lettered, no retry');

done_testing();
