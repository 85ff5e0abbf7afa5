# Window: the application commits with synchronous_commit = off, and the
# server crashes right after the relay published the event.
#
# An asynchronous commit is visible to other sessions before its WAL is
# written out, so a crash can take the transaction back after the relay
# has seen it.  Guarantee 1 and docs/guarantees.md ("Asynchronous
# commit"): the relay publishes only events whose commit is durable, so
# Kafka never holds an event of a transaction the crash undid.
#
# The WAL writer is held back (wal_writer_delay = 10s, no flush by volume)
# and has just flushed when the event commits, so for the next 10 s nothing
# but the relay writes that commit out.  The instance is then stopped in
# immediate mode, which discards the WAL still in shared memory.  A relay
# that produced without flushing first fails this test: the event is at
# the broker and gone from the outbox.  So does one whose claim learns no
# commit end from obx.enqueue's commit callback (src/relay/turns.c,
# obx_async_commit_done), which is where the claim flushes to.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $mock = start_mock();
my $node = obx_node('async_commit_crash', $mock,
	'obx.workers' => 1,
	'wal_writer_delay' => "'10s'",
	'wal_writer_flush_after' => "'1GB'",
	'log_min_messages' => 'warning');

relay_ready($node, 1);

# One asynchronous commit first: it wakes the WAL writer, which flushes,
# so for the next 10 s the WAL writer only writes whole pages.
my $warmup = $node->safe_psql('postgres', q{
	SET synchronous_commit = off;
	SELECT obx.enqueue('orders.warmup.v1', 'ord_0', '{"n": 0}')});
wait_for_broker($mock, 'orders.warmup.v1',
	sub { event_ids_at_broker(shift)->{$warmup} }, 'the warm-up event at the broker');

my $id = $node->safe_psql('postgres', q{
	SET synchronous_commit = off;
	SELECT obx.enqueue('orders.async_crash.v1', 'ord_1', '{"n": 1}')});
wait_for_broker($mock, 'orders.async_crash.v1',
	sub { event_ids_at_broker(shift)->{$id} }, 'the event at the broker');

$node->stop('immediate');
$node->start;

is($node->safe_psql('postgres',
		"SELECT count(*) FROM obx.outbox_events WHERE id = '$id'"),
	'1', 'the event Kafka holds survived the crash: its commit was durable before it was published');

done_testing();
