# The in-database consumer on real Apache Kafka: two consumer workers, one
# consumer group, a 6-partition topic (replication factor 3) of a 3-node
# cluster, fed by obx's own relay from the outbox at about 100 events/s.
# While the events flow:
#   1. one consumer worker is terminated (pg_terminate_backend): it leaves
#      the group, the other worker takes its partitions, and when it comes
#      back a second later the group rebalances again;
#   2. one consumer worker is killed with SIGKILL inside a handler
#      transaction (the handler of one event waits on an advisory lock the
#      test holds): the postmaster reinitializes, both workers come back,
#      the group rebalances once the dead members' sessions time out, and
#      each partition is re-read from the group's committed offset.
# Then every committed event has been applied exactly once (the set of
# applied event ids is the outbox's set, each once), the one whose handler
# was running when its worker died included; per key, in enqueue order; no
# effect without its obx.processed_events row (or the other way).  Offsets
# are committed only after the transaction: while that handler's
# transaction was open, the group coordinator never had an offset past its
# message (read with kafka-consumer-groups), although the worker's auto
# commit runs every 500 ms; and at the end the committed offset of every
# partition is the partition's end offset.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use ObxConsumer;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $topic = 'stock.rebalance.v1';
my $consumer = 'stock-rebalance';
my $commit_ms = 500;    # the consumers' auto.commit.interval.ms

my $kafka = start_kafka(nodes => 3);

# The test harness turns restart_after_crash off; the SIGKILL below must
# be recovered from.
my $node = consumer_node('consumer_rebalance', $kafka, topics => { $topic => 6 },
	relays => 2, consumers => 2, conf => { 'restart_after_crash' => 'on' });

sub q1 { $node->safe_psql('postgres', $_[0]) }

my $apply = handler($node, 'shop.apply', q{
		IF e.payload->>'gate' = 'hold' THEN
			PERFORM pg_advisory_xact_lock_shared(6565);
		END IF;
		PERFORM shop.record(e);});
q1(qq{
	CREATE TABLE shop.flow (stop boolean NOT NULL);
	INSERT INTO shop.flow VALUES (false);
	-- The application: n events (or until shop.flow says stop) on keys
	-- sku-0 .. sku-23, one transaction each, about 100 a second.
	CREATE PROCEDURE shop.produce(tag text, n integer) LANGUAGE plpgsql AS \$\$
	BEGIN
		FOR i IN 1 .. n LOOP
			EXIT WHEN (SELECT stop FROM shop.flow);
			PERFORM obx.enqueue('$topic', 'sku-' || (i % 24),
				jsonb_build_object('eventType', 'StockMoved', 'tag', tag, 'i', i),
				event_type => 'StockMoved');
			COMMIT;
			IF i % 10 = 0 THEN
				PERFORM pg_sleep(0.1);    -- the producer's pace, not a wait
			END IF;
		END LOOP;
	END
	\$\$;
});
# A short session timeout (the broker's minimum): the members that die
# with SIGKILL never leave the group, the rebalance waits for their
# sessions to time out.
subscribe($node, $consumer, [$topic], $apply,
	kafka => { 'auto.commit.interval.ms' => $commit_ms, 'session.timeout.ms' => 6000 });

sub applied { q1('SELECT count(*) FROM shop.effects') }

# wait_applied($n, $what): wait until $n more effects than now exist.
sub wait_applied
{
	my ($n, $what) = @_;
	my $want = applied() + $n;
	return ok($node->poll_query_until('postgres',
		"SELECT count(*) >= $want FROM shop.effects"), $what);
}

my $producer = $node->background_psql('postgres', on_error_stop => 0);
$producer->query_until(qr/producing/, "\\echo producing\nCALL shop.produce('flow', 1000000);\n");

############################################################################
# 1. A worker leaves the group while events flow, and comes back.
############################################################################
ok($node->poll_query_until('postgres',
	'SELECT count(DISTINCT backend_pid) = 2 FROM shop.effects'),
	'both consumer workers apply events: the group shares the partitions between them');
my @before = @{ consumer_pids($node) };
my $victim = $before[0];
my $n_term = applied();
is(q1("SELECT pg_terminate_backend($victim)"), 't', "consumer worker $victim terminated");
ok($node->poll_query_until('postgres', qq{
	SELECT count(*) = 2 FROM pg_stat_activity
	 WHERE backend_type = 'obx consumer' AND pid <> $victim}),
	'the postmaster started the consumer worker again');
my ($back) = grep { $_ != $before[0] && $_ != $before[1] } @{ consumer_pids($node) };
ok($node->poll_query_until('postgres',
	"SELECT count(*) > 0 FROM shop.effects WHERE backend_pid = $back"),
	"the new worker $back rejoined the group and applies events");
wait_applied(100, 'events go on being applied after the rebalance');

############################################################################
# 2. A worker dies with SIGKILL inside a handler transaction.
############################################################################
my $gate = $node->background_psql('postgres', on_error_stop => 0);
$gate->query_safe('SELECT pg_advisory_lock(6565)');
my $gated = q1(qq{SELECT obx.enqueue('$topic', 'sku-gate',
	'{"eventType": "StockMoved", "gate": "hold"}', event_type => 'StockMoved')});
my $held_pid = handler_held($node, 'a consumer worker is inside the handler of the held event');
$node->poll_query_until('postgres',
	"SELECT kafka_offset IS NOT NULL FROM obx.outbox_events WHERE id = '$gated'")
  or die 'the relay did not record where the held event landed';
my ($gp, $go) = split /\|/,
  q1("SELECT kafka_partition, kafka_offset FROM obx.outbox_events WHERE id = '$gated'");
is(q1("SELECT count(*) FROM shop.effects WHERE event_id = '$gated'"), '0',
	'the held event has no effect yet');

# Watch the group's committed offsets while that transaction is open, for
# at least ten auto-commit intervals: the offset of partition $gp must not
# pass the held message; the other worker's partitions move on.
my $t_gate = time();
my ($looks, $passed, %first, %last) = (0, 0);
wait_until(sub {
	my $o = eval { group_offsets($kafka, $consumer, $topic) };
	if ($o && defined $o->{$gp})
	{
		$looks++;
		$passed++ if $o->{$gp}[0] ne '-' && $o->{$gp}[0] > $go;
		for my $p (keys %$o)
		{
			next if $o->{$p}[0] eq '-';
			$first{$p} //= $o->{$p}[0];
			$last{$p} = $o->{$p}[0];
		}
	}
	return $looks >= 2 && time() - $t_gate >= 10 * $commit_ms / 1000;
}, "two looks at the group's offsets over ten auto-commit intervals", quiet => 1);
ok($looks >= 2, "the group's committed offsets were read $looks times while the transaction was open");
is($passed, 0,
	"the group's committed offset of partition $gp never passed offset $go while that message's transaction was open");
ok(scalar(grep { $last{$_} > $first{$_} } keys %last) > 0,
	'meanwhile committed offsets of other partitions moved on: the auto commit ran');
is(q1("SELECT count(*) FROM shop.effects WHERE event_id = '$gated'"), '0',
	'the held event still has no effect');

my $log_offset = -s $node->logfile;
ok(kill('KILL', $held_pid), "SIGKILL sent to consumer worker $held_pid while events flow");
# The postmaster ends every backend: the lock holder and the producer too.
eval { $gate->quit; };
eval { $producer->quit; };
ok(wait_for_crash_restart($node, $log_offset, 'a consumer killed while events flow'),
	'the postmaster reinitialized after the SIGKILL and accepts connections');
my @old = (@before, $back);
ok($node->poll_query_until('postgres', qq{
	SELECT count(*) = 2 FROM pg_stat_activity
	 WHERE backend_type = 'obx consumer' AND pid NOT IN (@{[ join(', ', @old) ]})}),
	'two new consumer workers run after crash recovery');

# More events while the group rebalances.
q1("CALL shop.produce('after', 500)");

############################################################################
# Exactly once, in order, offsets committed.
############################################################################
ok(all_published($node), 'the relay published every committed event');
my $where = "topic = '$topic'";
my @ids = split /\n/, q1("SELECT id FROM obx.outbox_events WHERE $where ORDER BY seq");
ok(scalar(@ids) > 600, scalar(@ids) . ' events were committed');
broker_holds_exactly($kafka, $node, $topic, \@ids, $where);
my $ends = partition_ends($kafka, $topic);
is(scalar(keys %$ends), 6, 'every partition holds messages');
wait_caught_up($node, $consumer, $topic, $ends, 'after the rebalances');

my $per = effects_per_event($node);
is_deeply([ sort keys %$per ], [ sort @ids ],
	'the set of applied event ids is exactly the set of committed events');
is(scalar(grep { $per->{$_} > 1 } keys %$per), 0, 'no event was applied twice');
is($per->{$gated}, 1, 'the event whose worker died inside its handler was applied once');

my (%applied, %seen);
for my $line (split /\n/, q1('SELECT event_key, event_id FROM shop.effects ORDER BY n'))
{
	my ($k, $id) = split /\|/, $line;
	push @{ $applied{$k} }, $id unless $seen{$id}++;
}
is_deeply(\%applied, committed_ids($node, $where),
	'per key, the effects were applied in enqueue order');

is(q1(qq{SELECT count(*) FROM shop.effects e WHERE NOT EXISTS (
	SELECT 1 FROM obx.processed_events p
	 WHERE p.consumer_name = '$consumer' AND p.event_id = e.event_id)}), '0',
	'no effect without its processed_events row');
is(q1(qq{SELECT count(*) FROM obx.processed_events p
	WHERE p.consumer_name = '$consumer' AND NOT EXISTS (
	SELECT 1 FROM shop.effects e WHERE e.event_id = p.event_id)}), '0',
	'no processed_events row without its effect');
is(q1(qq{SELECT count(*) FROM obx.dead_letters WHERE consumer_name = '$consumer'}), '0',
	'no dead letters');
my $t = consumer_totals($node, $consumer, $topic);
is($t->{processed}, scalar(@ids), 'consumer_status counts each event processed once');
note("messages re-read and recognized as duplicates: $t->{duplicates}");

# The group's committed offsets reach the end of every partition (the
# auto commit follows within $commit_ms ms).
my $final = {};
ok(wait_until(sub {
	$final = eval { group_offsets($kafka, $consumer, $topic) } // {};
	scalar(keys %$final) == scalar(keys %$ends) && !grep { ($final->{$_}[0] // '-') ne $ends->{$_} } keys %$ends },
	'the committed offsets to reach the end of every partition'),
	'the group committed offsets up to the end of every partition');
is_deeply({ map { $_ => $final->{$_}[0] } keys %$final }, $ends,
	"the group's committed offset of every partition is the partition's end offset");

done_testing();
