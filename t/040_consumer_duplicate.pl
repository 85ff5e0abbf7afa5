# Consumer window: the same event delivered more than once to one consumer
# group.  Guarantee 7 as the in-database consumer provides it: the
# handler's effect happens once, the handler is not even called for a copy
# (obx.mark_processed said "already processed"), and
# obx.consumer_status.duplicates counts every copy.
#
# Copies here are what Kafka really delivers twice: a re-send of the same
# event (same event_id header) on the same partition, on another partition
# under another key, and twice in a row; one whose id is only in the
# payload (eventId); and copies on two partitions owned by two different
# consumer workers that are handled at the same moment.  That race is made
# deterministic with an advisory lock the handler waits on: one worker is
# inside the handler of the first copy, holding its uncommitted
# mark_processed, while the other worker is at the second copy; both are
# seen blocked before the lock is released.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use ObxConsumer;
use PostgreSQL::Test::Utils;
use Test::More;

my $mock = start_mock();
my $topic = 'stock.dup.v1';
my $consumer = 'stock-dup';

# Two consumer workers: one consumer group of two members, which split the
# topic's partitions.  One relay worker, for an event sent through the outbox.
my $node = consumer_node('consumer_dup', $mock, topics => { $topic => 4 },
	relays => 1, consumers => 2);

sub q1 { $node->safe_psql('postgres', $_[0]) }

# subscribe's short session timeout lets a rebalance (the second worker
# joining the group) complete in seconds on the stand-in.
subscribe($node, $consumer, [$topic], handler($node, 'shop.reserve', q{
		PERFORM nextval('shop.handler_calls');
		IF e.payload->>'gate' = 'hold' THEN
			PERFORM pg_advisory_xact_lock_shared(4040);
		END IF;
		PERFORM shop.record(e);}));

my %distinct;    # every event id the test sends, once
my $copies = 0;  # how many extra copies of them it sends

sub payload
{
	my ($sku, %extra) = @_;
	return '{"eventType": "StockReserved", "schemaVersion": 1, "sku": "' . $sku
	  . '", "qty": 1' . join('', map { qq{, "$_": "$extra{$_}"} } sort keys %extra) . '}';
}

############################################################################
# 1. Copies one after the other.
############################################################################

# An event through the outbox, as obx's relay sends it.
my $e1_payload = payload('sku-1');
my $e1 = q1(qq{SELECT obx.enqueue('$topic', 'sku-1', \$\$$e1_payload\$\$,
	event_type => 'StockReserved')});
$distinct{$e1} = 1;
ok($node->poll_query_until('postgres',
	"SELECT count(*) > 0 FROM shop.effects WHERE event_id = '$e1'"),
	'the event sent through the outbox is handled');
my $p1 = q1("SELECT kafka_partition FROM shop.effects WHERE event_id = '$e1'");
my $p_other = ($p1 + 1) % 4;

# The same event again on its own partition, and on another partition under
# another key (a producer that re-sent it after a crash, with a new key).
produce($mock, $topic,
	{ partition => $p1, key => 'sku-1', payload => $e1_payload,
	  headers => [ event_id => $e1, event_type => 'StockReserved' ] },
	{ partition => $p_other, key => 'sku-1-resent', payload => $e1_payload,
	  headers => [ event_id => $e1, event_type => 'StockReserved' ] });
$copies += 2;

# An event delivered twice in a row on one partition.
produce($mock, $topic,
	map { { partition => 2, key => 'sku-2', payload => payload('sku-2'),
			headers => [ event_id => 'evt-dup-e2' ] } } 1 .. 2);
$distinct{'evt-dup-e2'} = 1;
$copies += 1;

# An event identified only by the eventId in its payload, on partitions 0 and 3.
produce($mock, $topic,
	map { { partition => $_, key => "sku-3-$_",
			payload => payload('sku-3', eventId => 'evt-dup-e3') } } (0, 3));
$distinct{'evt-dup-e3'} = 1;
$copies += 1;

wait_caught_up($node, $consumer, $topic, partition_ends($mock, $topic),
	'sequential copies');
is_deeply(effects_per_event($node), { map { $_ => 1 } keys %distinct },
	'each event sent one after the other had its effect exactly once');
is(handler_calls($node), scalar(keys %distinct),
	'the handler ran once per event, never for a copy');
{
	my $t = consumer_totals($node, $consumer, $topic);
	is("$t->{processed} $t->{duplicates} $t->{dead_lettered}",
		scalar(keys %distinct) . " $copies 0",
		"consumer_status: processed $t->{processed}, duplicates $t->{duplicates}, dead-lettered $t->{dead_lettered}");
	my $s = partition_status($node, $consumer, $topic);
	cmp_ok($s->{$p_other}{duplicates}, '>=', 1,
		"the copy on another partition ($p_other) than the original ($p1) counts as a duplicate there");
	cmp_ok($s->{2}{duplicates}, '>=', 1,
		'the copy delivered right after the original counts as a duplicate');
}

############################################################################
# 2. Two copies handled at the same moment by two workers.
############################################################################

# Learn which worker owns which partition: the handler records its backend
# pid.  Send a round of one event per partition until both workers show up
# in one round (the second member may join the group, and the group
# rebalance, after the first round).
my ($round, %owner) = (0);
wait_until(sub {
	$round++;
	produce($mock, $topic,
		map { { partition => $_, key => "warm-$_",
				payload => payload("warm-$_", eventId => "evt-warm-$round-$_") } } 0 .. 3);
	$distinct{"evt-warm-$round-$_"} = 1 for 0 .. 3;
	$node->poll_query_until('postgres', qq{
		SELECT count(DISTINCT event_id) = 4 FROM shop.effects
		 WHERE event_id LIKE 'evt-warm-$round-%'}) or return 0;
	%owner = map { split /\|/ } split /\n/, q1(qq{
		SELECT kafka_partition, backend_pid FROM shop.effects
		 WHERE event_id LIKE 'evt-warm-$round-%'});
	my %pids = map { $_ => 1 } values %owner;
	scalar(keys %pids) == 2;
}, 'the two consumer workers to share the partitions');
my ($pa) = sort keys %owner;
my ($pb) = grep { $owner{$_} != $owner{$pa} } sort keys %owner;
note("after $round round(s): partition $pa is handled by $owner{$pa}, $pb by $owner{$pb}");

# Close the gate, then send three events, each as two copies: one on $pa
# and one on $pb, under different keys.
my $gate = $node->background_psql('postgres');
$gate->query_safe('SELECT pg_advisory_lock(4040)');
for my $i (1 .. 3)
{
	produce($mock, $topic,
		map { { partition => $_, key => "race-$i-$_", payload => payload("race-$i", gate => 'hold'),
				headers => [ event_id => "evt-race-$i" ] } } ($pa, $pb));
	$distinct{"evt-race-$i"} = 1;
	$copies += 1;
}

# Both workers are stuck at the same event: one in the handler, on the
# gate; the other at the copy, behind the first one's transaction (or in
# the handler too, if the copy is not recognized as one).
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 2 FROM pg_stat_activity
	 WHERE backend_type = 'obx consumer' AND wait_event_type = 'Lock'}),
	'both consumer workers are blocked at the same moment on the two copies of evt-race-1');
note('they wait on: ' . q1(q{
	SELECT string_agg(wait_event, ', ' ORDER BY wait_event) FROM pg_stat_activity
	 WHERE backend_type = 'obx consumer' AND wait_event_type = 'Lock'}));
is(q1(q{SELECT count(*) FROM shop.effects WHERE event_id LIKE 'evt-race-%'}), '0',
	'nothing of the racing events is applied while the gate is closed');
$gate->query_safe('SELECT pg_advisory_unlock(4040)');
$gate->quit;

wait_caught_up($node, $consumer, $topic, partition_ends($mock, $topic),
	'racing copies');

############################################################################
# Everything, in the end.
############################################################################
is_deeply(effects_per_event($node), { map { $_ => 1 } keys %distinct },
	'every event had its effect exactly once, racing copies included');
is(handler_calls($node), scalar(keys %distinct),
	'the handler ran once per event, never for a copy');
is(q1(qq{SELECT count(*) FROM obx.processed_events WHERE consumer_name = '$consumer'}),
	scalar(keys %distinct), 'obx.processed_events holds each event once');
my $t = consumer_totals($node, $consumer, $topic);
is("$t->{processed} $t->{duplicates} $t->{dead_lettered}",
	scalar(keys %distinct) . " $copies 0",
	'consumer_status counts each event once as processed and each copy as a duplicate');
my $s = partition_status($node, $consumer, $topic);
my $ends = partition_ends($mock, $topic);
for my $p (sort keys %$ends)
{
	is($s->{$p}{processed} + $s->{$p}{duplicates} + $s->{$p}{dead_lettered}, $ends->{$p},
		"partition $p: each of its $ends->{$p} messages is counted exactly once");
}
is(q1(qq{SELECT processed || ' ' || duplicates || ' ' || dead_lettered
		   FROM obx.consumers WHERE consumer_name = '$consumer'}),
	"$t->{processed} $t->{duplicates} 0", 'obx.consumers shows the same totals');
is(q1(qq{SELECT count(*) FROM obx.dead_letters WHERE consumer_name = '$consumer'}), '0',
	'no dead letters');

done_testing();
