# Window: large events pile up while the brokers are down.
#
# A claim takes at most obx.batch_size events, and stops earlier once
# their payloads reach 16 MB (the event that crosses the mark included):
# a worker holds up to two batches in memory, payloads included, and
# librdkafka a copy of them.  40 events of about 600 kB (24 MB) must
# therefore be claimed in more than one batch, no batch may hold more than
# 16 MB before its last event, and once the brokers are back all 40 are
# acknowledged (guarantee 2 across the smaller batches).  The stand-in
# keeps only the last few messages this large in its log, so the
# acknowledgements are checked by where they landed: 40 distinct
# partition and offset pairs.
# Each event has a key of its own, so that the events the first batch
# leaves behind are not blocked behind it.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $topic = 'orders.large.v1';
my $budget = 16 * 1024 * 1024;
my $nevents = 40;

my $mock = start_mock();
my $node = obx_node('batch_bytes', $mock,
	'obx.workers' => 1,
	'log_min_messages' => 'error');

relay_ready($node, 1);

mock_cmd($mock, 'down all');

# About 600 kB of payload per event.
$node->safe_psql('postgres', qq{
	SELECT obx.enqueue('$topic', 'ord_' || i, jsonb_build_object('n', i, 'blob', repeat('x', 600000)))
	  FROM generate_series(1, $nevents) i});

# With the brokers down, the worker holds its batches: two at most.
$node->poll_query_until('postgres', qq{
	SELECT coalesce(sum(cardinality(ids)), 0) = $nevents FROM obx.leases})
  or die 'the worker did not claim every event';

my $batches = $node->safe_psql('postgres', qq{
	SELECT count(*) || ' ' || max(cardinality(l.ids)) || ' ' ||
	       bool_and(b.before_last < $budget)
	  FROM obx.leases l,
	       LATERAL (SELECT sum(octet_length(e.payload::text))
	                       - (array_agg(octet_length(e.payload::text) ORDER BY e.seq DESC))[1]
	                  FROM obx.outbox_events e WHERE e.id = ANY (l.ids)) AS b(before_last)});
my ($nbatches, $largest, $within) = split / /, $batches;
cmp_ok($nbatches, '>', 1, "the 24 MB of events were claimed in $nbatches batches, not one");
cmp_ok($largest, '<', $nevents, "the largest batch holds $largest of $nevents events");
is($within, 'true', 'no batch holds more than 16 MB of payload before its last event');

mock_cmd($mock, 'up all');
all_published($node) or die 'the events were not published';
is($node->safe_psql('postgres', qq{
	SELECT count(*) || ' ' || count(DISTINCT (kafka_partition, kafka_offset))
	  FROM obx.outbox_events WHERE topic = '$topic' AND kafka_offset IS NOT NULL}),
	"$nevents $nevents", "all $nevents events acknowledged, each at a partition and offset of its own");

done_testing();
