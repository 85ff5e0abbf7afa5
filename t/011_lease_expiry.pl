# Window: a worker stalls past its lease.
#
# A relay worker that claimed a batch is frozen with SIGSTOP (a real stall:
# every thread of the process, librdkafka's included, stops) while its
# events are still in flight.  Its lease expires, the other worker claims
# the events and publishes them, later events of the same keys follow, and
# only then does the stalled worker wake up, still holding its old batch in
# its producer.  Guarantees 2, 4 and 6: nothing is lost, and per key the
# broker's first copies follow enqueue order; what the stale worker may
# still send is a duplicate (same event id), never a reorder, and it must
# not undo the newer worker's records.
#
# obx.delivery_timeout is deliberately longer than the stall: a stale
# producer whose messages librdkafka has already expired has nothing left
# to send, and the test would never see the dangerous case, a worker that
# wakes up with live messages for events another worker has published.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $t0 = time();
my $topic = 'orders.lease_expiry.v1';
my @keys = map { "ord_$_" } 1 .. 3;

my $stopped_pid;
sub resume
{
	kill('CONT', $stopped_pid) if $stopped_pid;
	$stopped_pid = undef;
}
END { resume(); }
$SIG{__DIE__} = sub { resume() unless $^S; };

sub proc_state
{
	my ($pid) = @_;
	open(my $fh, '<', "/proc/$pid/stat") or return '';
	my $stat = <$fh>;
	close $fh;
	return $stat =~ /^\d+ \(.*\) (\S)/ ? $1 : '';
}

my $mock = start_mock();
my $node = obx_node('lease_expiry', $mock,
	'obx.workers' => 2,
	'obx.lease_timeout' => "'2s'",
	'obx.delivery_timeout' => "'30s'",
	'log_min_messages' => 'warning');

relay_ready($node, 2);

mock_cmd($mock, 'down all');

# Wave 1: one transaction, so one claim takes all of it.
my $n1 = 12;
my $sql = "BEGIN;\n";
for my $i (1 .. $n1)
{
	my $key = $keys[ $i % @keys ];
	$sql .= "SELECT obx.enqueue('$topic', '$key', '{\"wave\": 1, \"n\": $i}');\n";
}
$sql .= "COMMIT;\n";
my @wave1 = split /\n/, $node->safe_psql('postgres', $sql);
is(scalar(@wave1), $n1, "wave 1: $n1 events committed");

$node->poll_query_until('postgres', qq{
	SELECT count(*) = $n1 AND count(DISTINCT lease_id) = 1
	  FROM obx.leased_events})
  or die 'wave 1 was never claimed';
my ($owner, $old_lease) = split /\|/, $node->safe_psql('postgres',
	'SELECT DISTINCT lease_owner, lease_id FROM obx.leased_events');
my ($pid, $batches_before) = split /\|/, $node->safe_psql('postgres',
	"SELECT pid, batches FROM obx.workers WHERE worker = $owner");
my $other = 1 - $owner;
note("worker $owner (pid $pid) holds lease $old_lease on all $n1 events");

# Freeze it between transactions: a worker frozen inside one would hold row
# locks, which is another test (no lease can help then).  Outside a
# transaction a backend holds no heavyweight lock at all.
my $frozen = wait_until(sub {
	kill('STOP', $pid) or die "cannot stop $pid: $!";
	$stopped_pid = $pid;
	wait_until(sub { proc_state($pid) eq 'T' }, "worker $pid to stop");
	return 1
	  if $node->safe_psql('postgres', "SELECT count(*) FROM pg_locks WHERE pid = $pid") eq '0';
	resume();
	return 0;
}, "worker $pid to be stopped outside any transaction", quiet => 1);
ok($frozen, "worker $owner (pid $pid) frozen by SIGSTOP outside any transaction");
my $t_stop = time();

# The lease runs out and the other worker takes the events over.
ok($node->poll_query_until('postgres', qq{
	SELECT count(*) = $n1 FROM obx.leased_events
	 WHERE lease_owner = $other AND lease_id <> $old_lease}),
	"worker $other claimed all $n1 events once the lease expired");
note(sprintf('takeover %.1f s after the stall began', time() - $t_stop));

mock_cmd($mock, 'up all');
ok(all_published($node), 'wave 1 published by the other worker');

# Wave 2: later events on the same keys, one transaction each, while the
# stale worker still holds its wave-1 messages.
my @wave2;
for my $i (1 .. 9)
{
	my $key = $keys[ $i % @keys ];
	push @wave2, $node->safe_psql('postgres',
		"SELECT obx.enqueue('$topic', '$key', '{\"wave\": 2, \"n\": $i}')");
}
ok(all_published($node), 'wave 2 published');
is(proc_state($pid), 'T', "worker $owner was stopped all along");
my $stall = time() - $t_stop;
cmp_ok($stall, '<', 30, sprintf('the stall (%.1f s) is shorter than obx.delivery_timeout', $stall));

# Wake the stale worker, with its first database step made slow: a
# session holds the claim lock (src/relay/outbox.h), so the worker's lease
# renewal (the step that would find the lease lost and purge its
# producer's queue), which checks the lease under that lock, waits, while its producer, whose threads woke up too, reconnects to the
# brokers and sends the old batch.  The stale worker's late copies then
# land after the newer events of the same keys: the case that must come
# out as duplicates, never as a reorder or a lost record.
my $log_offset = -s $node->logfile;
my $blocker = $node->background_psql('postgres');
$blocker->query_safe('BEGIN; SELECT pg_advisory_xact_lock(7299704, 1);');
resume();
ok($node->poll_query_until('postgres',
	"SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $pid"),
	'the stale worker woke up and waits for its first database step');
wait_for_broker($mock, $topic, sub {
	my $seen = event_ids_at_broker(shift);
	!grep { ($seen->{$_} // 0) < 2 } @wave1 },
	'the stale worker\'s late copies of wave 1 at the broker');
$blocker->query_safe('COMMIT;');
$blocker->quit;

ok($node->poll_query_until('postgres',
	"SELECT batches > $batches_before FROM obx.workers WHERE worker = $owner AND pid = $pid"),
	"the stale worker $owner recorded its old batch");
my $log = slurp_file($node->logfile, $log_offset);
my $noticed = $log =~ /obx relay $owner lost the lease on (\d+) of $n1 events/ ? $1 : 0;
note("the stale worker reported the loss of $noticed of $n1 leased events");

is($node->safe_psql('postgres', q{
	SELECT (SELECT count(*) FROM obx.outbox_events
			 WHERE published_at IS NULL OR quarantined_at IS NOT NULL)
		   + (SELECT count(*) FROM obx.leases)}),
	'0', 'the stale worker undid nothing: every event is still published, none leased');

my %committed = map { $_ => 1 } (@wave1, @wave2);
my $msgs = broker_holds_exactly($mock, $node, $topic, [ keys %committed ]);
my $seen = event_ids_at_broker($msgs);

# Where the outbox says each event landed, the broker has that event.
my %at = map { ("$_->{partition}/$_->{offset}" => $_->{event_id}) } @$msgs;
my $rows = $node->safe_psql('postgres',
	"SELECT id, kafka_partition || '/' || kafka_offset FROM obx.outbox_events");
my @misplaced = grep { my ($id, $where) = split /\|/; ($at{$where} // '') ne $id } split /\n/, $rows;
is(scalar(@misplaced), 0, 'every recorded partition/offset holds its event');
my %first_at;
for my $m (sort { $a->{offset} <=> $b->{offset} } @$msgs)
{
	$first_at{ $m->{event_id} } //= "$m->{partition}/$m->{offset}";
}
my @rewritten = grep { my ($id, $where) = split /\|/; $first_at{$id} ne $where } split /\n/, $rows;
is(scalar(@rewritten), 0,
	'the stale worker\'s late delivery reports did not rewrite where an event was recorded');

note('workers at the end: ' . $node->safe_psql('postgres',
	"SELECT string_agg(worker || ':' || state || ' batches ' || batches || ' published ' || published, ', ' ORDER BY worker) FROM obx.workers"));

my $dups = scalar(@$msgs) - scalar(keys %$seen);
my $late = 0;
{
	# Copies of wave-1 events stored after the first wave-2 event of their key.
	my %first_w2;
	my %is_w2 = map { $_ => 1 } @wave2;
	for my $m (sort { $a->{partition} <=> $b->{partition} || $a->{offset} <=> $b->{offset} } @$msgs)
	{
		$first_w2{ $m->{key} } //= $m->{offset} if $is_w2{ $m->{event_id} };
		$late++ if !$is_w2{ $m->{event_id} } && defined $first_w2{ $m->{key} };
	}
}
note(sprintf('%d messages, %d distinct events, %d duplicates (%d sent late by the stale worker); wall time %.1f s',
	scalar(@$msgs), scalar(keys %$seen), $dups, $late, time() - $t0));

done_testing();
