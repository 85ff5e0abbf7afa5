# Consumer window: the handler's transaction commits, and the consumer
# dies (SIGKILL, then crash recovery of the whole instance) before the
# Kafka offset is committed.  After the restart the group re-reads from
# its last committed offset, so every event handled before the crash is
# delivered again: each is recognized as a duplicate (the handler does not
# run, consumer_status.duplicates counts it) and every effect is applied
# exactly once.  The seed's "crash after reserving stock and before the
# offset commit".
#
# The window is held open for the whole test: the subscription sets
# auto.commit.interval.ms to an hour, so librdkafka commits no offset
# before the crash.  Also: one event is inside its handler, its
# transaction not committed, when the consumer dies; it is not lost, it is
# handled after the restart, once.  And events sent after the crash are
# handled.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use ObxConsumer;
use PostgreSQL::Test::Utils;
use Test::More;

my $mock = start_mock();
my $topic = 'stock.crash.v1';
my $consumer = 'stock-crash';

# The test harness turns restart_after_crash off; a crash here must be
# recovered from.  Events come through the outbox (one relay worker).
my $node = consumer_node('consumer_crash', $mock, topics => { $topic => 4 },
	relays => 1, conf => { 'restart_after_crash' => 'on' });

sub q1 { $node->safe_psql('postgres', $_[0]) }

# A short session timeout: after the crash the dead member must leave the
# group (it never sends a LeaveGroup) before its partitions are reassigned.
subscribe($node, $consumer, [$topic], handler($node, 'shop.reserve', q{
		IF e.payload->>'gate' = 'hold' THEN
			PERFORM pg_advisory_xact_lock_shared(4141);
		END IF;
		PERFORM shop.record(e);}),
	kafka => { 'auto.commit.interval.ms' => 3600000, 'session.timeout.ms' => 6000 });

# enqueue_events($prefix, $n, %extra): $n events on keys sku-1..sku-8 (so
# on several partitions), each in its own transaction; returns their ids.
sub enqueue_events
{
	my ($prefix, $n, %extra) = @_;
	my $more = join('', map { qq{, "$_": "$extra{$_}"} } sort keys %extra);
	my $sql = '';
	for my $i (1 .. $n)
	{
		my $key = 'sku-' . (1 + $i % 8);
		$sql .= qq{SELECT obx.enqueue('$topic', '$key',
			'{"eventType": "StockReserved", "schemaVersion": 1, "sku": "$key", "n": "$prefix-$i"$more}',
			event_type => 'StockReserved');\n};
	}
	return [ split /\n/, q1($sql) ];
}

############################################################################
# Before the crash: 16 events handled, their offsets not committed.
############################################################################
my $before = enqueue_events('before', 16);
ok(all_published($node), 'the relay published the events');
wait_caught_up($node, $consumer, $topic, partition_ends($mock, $topic),
	'the events sent before the crash');
is_deeply(effects_per_event($node), { map { $_ => 1 } @$before },
	'before the crash every effect is applied once');
my $t0 = consumer_totals($node, $consumer, $topic);
is("$t0->{processed} $t0->{duplicates}", '16 0',
	'consumer_status before the crash: 16 processed, no duplicates');

# One more event, whose handler waits on a lock we hold: the consumer dies
# inside its transaction.
my $gate = $node->background_psql('postgres', on_error_stop => 0);
$gate->query_safe('SELECT pg_advisory_lock(4141)');
my ($inflight) = @{ enqueue_events('inflight', 1, gate => 'hold') };
my $old_pid = handler_held($node, 'the consumer is inside the handler of the in-flight event');
is(q1("SELECT count(*) FROM shop.effects WHERE event_id = '$inflight'"), '0',
	'the in-flight event has no effect yet');
# The relay has recorded it as published, so it does not send it again
# after the crash: every copy seen later comes from the consumer's re-read.
ok(all_published($node), 'the relay recorded every event as published');

############################################################################
# The crash.
############################################################################
my $log_offset = -s $node->logfile;
ok(kill('KILL', $old_pid), "SIGKILL sent to consumer $old_pid");
# The postmaster ends every backend, our lock holder too.
eval { $gate->quit; };

wait_for_crash_restart($node, $log_offset, 'the consumer killed');
my $log = slurp_file($node->logfile, $log_offset);
like($log, qr/\(PID $old_pid\) was terminated by signal 9/,
	'the postmaster saw the consumer die of SIGKILL');
ok($node->poll_query_until('postgres', qq{
	SELECT count(*) = 1 FROM pg_stat_activity
	 WHERE backend_type = 'obx consumer' AND pid <> $old_pid}),
	'a new consumer worker runs after crash recovery');

# Events sent after the crash.
my $after = enqueue_events('after', 8);
ok(all_published($node), 'the relay published the events sent after the crash');

# Per partition the group re-reads from the last committed offset, so
# next_offset reaching the end means every message there was handled again.
wait_caught_up($node, $consumer, $topic, partition_ends($mock, $topic),
	'after the crash');

############################################################################
# Exactly once.
############################################################################
my @all = (@$before, $inflight, @$after);
is_deeply(effects_per_event($node), { map { $_ => 1 } @all },
	'every effect is applied exactly once: before, during and after the crash');
my $t = consumer_totals($node, $consumer, $topic);
# At least 16: with offsets committed hourly, a rebalance after the
# restart (the dead member leaving the group) can deliver a message
# handled since then once more, a duplicate too.
cmp_ok($t->{duplicates} - $t0->{duplicates}, '>=', 16,
	'all 16 events handled before the crash were delivered again (no offset had been committed) and recognized as duplicates');
is($t->{processed}, scalar(@all),
	'processed counts each event once: the redelivered ones are not processed again');
is(q1(qq{SELECT count(*) FROM obx.processed_events WHERE consumer_name = '$consumer'}),
	scalar(@all), 'obx.processed_events holds each event once');
is(q1(qq{SELECT count(*) FROM obx.dead_letters WHERE consumer_name = '$consumer'}), '0',
	'no dead letters');
my $s = partition_status($node, $consumer, $topic);
my $ends = partition_ends($mock, $topic);
is_deeply({ map { $_ => $s->{$_}{next_offset} } keys %$s }, $ends,
	'next_offset of every partition is its end at the broker');

done_testing();
