# An acknowledgement without an offset is not proof that the broker holds
# the event: the relay sends the event again.
#
# With idempotence, librdkafka reports a message as delivered, with no
# offset, when the broker answers a retried request with
# DUPLICATE_SEQUENCE_NUMBER: it infers that an earlier attempt was
# written.  A Kafka 3.9 broker that accepted a later request of the
# producer first, because the earlier one reached the leader before it
# knew the partition (KAFKA-15591), answers so for a message it never
# wrote; t/061_kafka_failover.pl lost the first event of a new topic that
# way.  Here the stand-in refuses the first produce request with a
# retriable error and the retry with DUPLICATE_SEQUENCE_NUMBER, and stores
# nothing of either: the event must still reach it, once more, with its
# id, be recorded with the offset the broker gave the copy that landed,
# and the relay must say what happened.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $topic = 'orders.unconfirmed.v1';

my $mock = start_mock();
my $node = obx_node('unconfirmed', $mock, 'obx.workers' => 1);
relay_ready($node, 1);
mock_cmd($mock, "topic-create $topic 1 3");

# The producer learns the topic first, and gets its producer id.
my $warmup = $node->safe_psql('postgres',
	qq{SELECT obx.enqueue('$topic', 'ord_0', '{"n": 0}')});
wait_for_broker($mock, $topic, sub { event_ids_at_broker(shift)->{$warmup} },
	'the warm-up event at the broker');
all_published($node) or die 'the warm-up event was not recorded';

my $log_offset = -s $node->logfile;
mock_cmd($mock, 'produce-errors 2 NOT_LEADER_FOR_PARTITION DUPLICATE_SEQUENCE_NUMBER');
my $id = $node->safe_psql('postgres',
	qq{SELECT obx.enqueue('$topic', 'ord_1', '{"n": 1}')});

my $msgs = wait_for_broker($mock, $topic, sub { event_ids_at_broker(shift)->{$id} },
	'the event at the broker');
is(event_ids_at_broker($msgs)->{$id}, 1, 'the broker holds the event once');
all_published($node) or die 'the event was not recorded';
my ($at) = grep { ($_->{event_id} // '') eq $id } @$msgs;
is($node->safe_psql('postgres',
		qq{SELECT kafka_partition || ':' || kafka_offset FROM obx.outbox_events WHERE id = '$id'}),
	"$at->{partition}:$at->{offset}",
	'its record names the partition and offset of the copy the broker holds');
like(slurp_file($node->logfile, $log_offset),
	qr/WARNING:  obx: Kafka reported event $id as delivered to $topic \[0\] without an offset; it is sent again/,
	'the relay says it sends the event again, and why');

done_testing();
