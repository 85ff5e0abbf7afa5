# Consumer window: the consumer worker dies (SIGKILL, then crash recovery
# of the whole instance) in the middle of a batch (obx.consumer_batch_size,
# one transaction for many messages, each in a subtransaction).  The batch
# is atomic: while its 10th message waits in its handler, none of the 9
# messages applied before it in the same batch has an effect or a mark
# visible, and after the crash nothing of the batch remains; the group
# re-reads the messages (their offsets were never stored, let alone
# committed) and every event is applied exactly once.
#
# Every message is at the broker, sent by one kcat run per partition (the
# event id is in the payload), before the subscription exists, so the
# consumer's first fetch brings them all and the first batch holds them
# all.  The subscription commits stored offsets every 100 ms and the
# worker is killed only after it has waited a second in the handler: an
# offset stored before the batch commits would reach the broker, and the
# messages before the 10th would never come again.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use ObxConsumer;
use PostgreSQL::Test::Utils;
use Test::More;

my $mock = start_mock();
my $topic = 'stock.batchcrash.v1';
my $consumer = 'stock-batch-crash';

my $node = consumer_node('consumer_batch_crash', $mock, topics => { $topic => 1 },
	conf => { 'restart_after_crash' => 'on', 'obx.consumer_batch_size' => 500,
		'obx.consumer_batch_time' => "'1s'" });

sub q1 { $node->safe_psql('postgres', $_[0]) }

sub msg
{
	my ($id, %extra) = @_;
	return { partition => 0, key => 'sku-1',
		payload => '{"eventId": "' . $id . '", "sku": "sku-1"'
		  . join('', map { qq{, "$_": "$extra{$_}"} } sort keys %extra) . '}' };
}

my @batch = map { "evt-$_" } 1 .. 20;
produce($mock, $topic,
	(map { msg($_) } @batch[0 .. 8]),
	msg($batch[9], gate => 'hold'),
	(map { msg($_) } @batch[10 .. 19]));

my $gate = $node->background_psql('postgres', on_error_stop => 0);
$gate->query_safe('SELECT pg_advisory_lock(4545)');
subscribe($node, $consumer, [$topic], handler($node, 'shop.reserve', q{
		IF e.payload->>'gate' = 'hold' THEN
			PERFORM pg_advisory_xact_lock_shared(4545);
		END IF;
		PERFORM shop.record(e);}),
	kafka => { 'auto.commit.interval.ms' => 100, 'session.timeout.ms' => 6000 });

############################################################################
# The batch is open: its 10th message waits in the handler.
############################################################################
my $old_pid = handler_held($node, 'the consumer is inside the handler of the 10th message');
ok($node->poll_query_until('postgres', q{
	SELECT now() - state_change > interval '1 second' FROM pg_stat_activity
	 WHERE backend_type = 'obx consumer' AND wait_event = 'advisory'}),
	'the handler has waited a second (stored offsets would have been committed)');
is(q1('SELECT count(*) FROM shop.effects'), '0',
	'no effect of the 9 messages applied before it in the batch is visible');
is(q1(qq{SELECT count(*) FROM obx.processed_events WHERE consumer_name = '$consumer'}), '0',
	'no mark of the batch is visible');
is(q1(qq{SELECT coalesce(sum(processed), 0) FROM obx.consumer_status
		 WHERE consumer_name = '$consumer'}), '0',
	'consumer_status counts nothing of the open batch');

############################################################################
# The crash.
############################################################################
my $log_offset = -s $node->logfile;
ok(kill('KILL', $old_pid), "SIGKILL sent to consumer $old_pid inside the batch");
eval { $gate->quit; };
wait_for_crash_restart($node, $log_offset, 'the consumer killed inside its batch');
like(slurp_file($node->logfile, $log_offset), qr/\(PID $old_pid\) was terminated by signal 9/,
	'the postmaster saw the consumer die of SIGKILL');
ok($node->poll_query_until('postgres', qq{
	SELECT count(*) = 1 FROM pg_stat_activity
	 WHERE backend_type = 'obx consumer' AND pid <> $old_pid}),
	'a new consumer worker runs after crash recovery');
is(q1('SELECT count(*) FROM shop.effects'), '0',
	'after crash recovery nothing of the killed batch remains');

my @after = map { "evt-after-$_" } 1 .. 5;
produce($mock, $topic, map { msg($_) } @after);
wait_caught_up($node, $consumer, $topic, partition_ends($mock, $topic), 'after the crash');

############################################################################
# Exactly once, in order.
############################################################################
is_deeply(effects_per_event($node), { map { $_ => 1 } @batch, @after },
	'every event produced is applied exactly once, and nothing else');
is(q1('SELECT string_agg(event_id, \' \' ORDER BY n) FROM shop.effects'),
	join(' ', @batch, @after), 'in offset order');
my $t = consumer_totals($node, $consumer, $topic);
is("$t->{processed} $t->{dead_lettered}", '25 0',
	'consumer_status: 25 processed, none dead-lettered');

done_testing();
