# published_at is when Kafka acknowledged each event, not when the relay
# got round to recording its batch.
#
# docs/sql.md: published_at is the moment the relay's producer received
# the event's acknowledgement.  A batch spans partitions led by different brokers, and
# the relay records it once every report is in; so if published_at were
# the time of that record, all events of a batch would share it.  Here
# broker 1 leads partitions 0 and 1 and broker 2 partitions 2 and 3 (the
# stand-in would pick leaders at random), broker 1 answers 1 s late (the
# stand-in's rtt), 40 events with 40 keys
# commit in one transaction and are claimed as one batch (the test sees
# the single lease), and the events on partitions broker 1 leads must be
# marked published at least 0.5 s after the others.  Every published_at
# also lies after the event's Kafka CreateTime (when the relay handed it
# to librdkafka) and no later than when the test saw it published.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $topic = 'orders.acked.v1';
my $nevents = 40;
my $rtt_ms = 1000;

my $mock = start_mock();
my $node = obx_node('published_at', $mock,
	'obx.workers' => 1,
	'log_min_messages' => 'warning');

relay_ready($node, 1);

mock_cmd($mock, "topic-create $topic 4 3");
mock_cmd($mock, "leader $topic $_ 1") for 0, 1;
mock_cmd($mock, "leader $topic $_ 2") for 2, 3;

# The producer learns the topic's partitions and leaders first.
my $warmup = $node->safe_psql('postgres',
	qq{SELECT obx.enqueue('$topic', 'ord_0', '{"n": 0}')});
wait_for_broker($mock, $topic, sub { event_ids_at_broker(shift)->{$warmup} },
	'the warm-up event at the broker');

mock_cmd($mock, "rtt 1 $rtt_ms");

$node->safe_psql('postgres', qq{
	SELECT obx.enqueue('$topic', 'ord_' || i, jsonb_build_object('n', i))
	  FROM generate_series(1, $nevents) i});

# They became visible together, so one claim took them all.
$node->poll_query_until('postgres', qq{
	SELECT count(*) = 1 AND max(cardinality(ids)) = $nevents FROM obx.leases})
  or die 'the events were not claimed as one batch';
pass("one batch holds all $nevents events while broker 1 delays its answers");

all_published($node) or die 'the events were not published';
my $seen_at = time();

my $msgs = read_topic($mock, $topic);
my %created_ms = map { ($_->{event_id} // '') => $_->{timestamp} } @$msgs;

my @rows = map { [ split /\|/ ] } split /\n/, $node->safe_psql('postgres', qq{
	SELECT id, kafka_partition, extract(epoch FROM published_at)
	  FROM obx.outbox_events WHERE topic = '$topic' AND id <> '$warmup'});
is(scalar @rows, $nevents, "all $nevents events are published");

my $bad_bounds = 0;
my (@slow, @fast);
for my $r (@rows)
{
	my ($id, $partition, $published) = @$r;
	my $created = $created_ms{$id};
	# CreateTime has millisecond resolution.
	$bad_bounds++
	  unless defined $created && $published * 1000 >= $created - 1 && $published <= $seen_at;
	push @{ $partition <= 1 ? \@slow : \@fast }, $published;
}
is($bad_bounds, 0,
	'every published_at lies between the Kafka CreateTime and the moment the test saw it published');

ok(@slow && @fast,
	sprintf('the batch went to both brokers: %d events to broker 1, %d to broker 2',
		scalar @slow, scalar @fast));
my ($slow_first) = sort { $a <=> $b } @slow;
my ($fast_last) = sort { $b <=> $a } @fast;
cmp_ok($slow_first - $fast_last, '>=', $rtt_ms / 2000,
	sprintf('events acknowledged by the slow broker are marked %.2f s after the last of the others',
		$slow_first - $fast_last));

done_testing();
