# Guarantee 7 at the edges of the dedupe history: one effect per event id
# on the consumer side, while the purge of obx.processed_events
# (obx.processed_retention, src/base/housekeeping.c) runs, while marks are
# uncommitted, and for messages landed for a consumer outside the database
# (obx.land, obx.landed).
#
#   - Two transactions mark one id: the second waits for the first (on its
#     transaction id, seen in pg_locks) and gets false when it commits, true
#     when it rolls back; a purge pass that runs while it waits changes
#     nothing.
#   - An uncommitted mark is invisible to the purge, however old its
#     processed_at: a transaction that began before the window keeps its
#     mark until it commits.  Its age counts from processed_at, the marking
#     transaction's start (now()), so once committed it goes at the next
#     pass (docs/consumers.md, "Event ids and the dedupe history").
#   - The purge deletes marks older than obx.processed_retention and keeps
#     the younger ones: a copy of an event marked within the window is a
#     duplicate (mark_processed false; the consumer worker does not call
#     the handler); a copy of one whose mark was purged is a first time
#     again, which is why the dedupe rule (docs/operations.md, Retention)
#     asks for a retention longer than any redelivery or replay.
#   - Landed messages are deduplicated by the mark (consumer, event id),
#     not by where they are in Kafka: copies of an event on its partition
#     and on another land once; once completed (the row deleted) or while
#     it waits however long (nothing purges obx.landed), a copy within the
#     window lands nothing.
#
# Age is made, not waited for: marks and landed rows are moved into the
# past with an UPDATE, obx.processed_retention is one day, and a purge pass
# is known to have run once a sentinel mark two days old is gone; the
# uncommitted "long" transaction sets its own mark's processed_at two days
# back, as a transaction that began then would have it.  No fixed sleep.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use ObxConsumer;
use PostgreSQL::Test::Utils;
use Test::More;

my $mock = start_mock();
my $topic = 'stock.ret.v1';
my $ltopic = 'stock.land.v1';
my $consumer = 'stock-ret';
my $lander = 'stock-land';
my $app = 'app-ret';    # a hand-written consumer calling obx.mark_processed

# One consumer worker, no relay: consumer worker 0 runs the purge.
my $node = consumer_node('consumer_ids_retention', $mock,
	topics => { $topic => 2, $ltopic => 2 },
	conf => { 'obx.processed_retention' => "'1d'" });

sub q1 { $node->safe_psql('postgres', $_[0]) }

subscribe($node, $consumer, [$topic], handler($node, 'shop.reserve', q{
		PERFORM nextval('shop.handler_calls');
		PERFORM shop.record(e);}));
subscribe($node, $lander, [$ltopic], 'obx.land(obx.inbound_event)');

sub mark { return q1("SELECT obx.mark_processed('$app', '$_[0]')") }

sub mark_exists
{
	my ($consumer_name, $id) = @_;
	return q1(qq{SELECT count(*) FROM obx.processed_events
				  WHERE consumer_name = '$consumer_name' AND event_id = '$id'});
}

# age($consumer_name, $id, $interval): the mark made that long ago.
sub age
{
	my ($consumer_name, $id, $ago) = @_;
	q1(qq{UPDATE obx.processed_events SET processed_at = now() - interval '$ago'
		   WHERE consumer_name = '$consumer_name' AND event_id = '$id'});
	return;
}

# purge_pass($what): insert a sentinel mark older than the retention and
# wait until a purge pass has deleted it; that pass began after every
# statement before this call.
my $passes = 0;
sub purge_pass
{
	my ($what) = @_;
	$passes++;
	q1(qq{INSERT INTO obx.processed_events (consumer_name, event_id, processed_at)
		  VALUES ('purge-probe', 'sentinel-$passes', now() - interval '2 days')});
	return ok($node->poll_query_until('postgres', qq{
		SELECT count(*) = 0 FROM obx.processed_events
		 WHERE consumer_name = 'purge-probe' AND event_id = 'sentinel-$passes'}),
		"a purge pass ran: $what");
}

# start_mark($name, $id): obx.mark_processed in a session of its own
# (application_name $name), not waited for; finish_mark returns its result.
sub start_mark
{
	my ($name, $id) = @_;
	my %s = (out => '', err => '', name => $name);
	$s{h} = IPC::Run::start(
		[ 'psql', '-XAtq', '-d', $node->connstr('postgres') . " application_name=$name",
		  '-c', "SELECT obx.mark_processed('$app', '$id')" ],
		'<', \undef, '>', \$s{out}, '2>', \$s{err},
		IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
	return \%s;
}

sub finish_mark
{
	my ($s) = @_;
	$s->{h}->finish;
	chomp $s->{out};
	is($s->{err}, '', "$s->{name} had no error");
	return $s->{out};
}

# waits_on($name, $xid): the session named $name waits for transaction $xid.
sub waits_on
{
	my ($name, $xid) = @_;
	return $node->poll_query_until('postgres', qq{
		SELECT count(*) = 1 FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		 WHERE a.application_name = '$name' AND a.wait_event_type = 'Lock'
		   AND l.locktype = 'transactionid' AND NOT l.granted
		   AND l.transactionid::text = '$xid'});
}

# A message with its id in the event_id header.
sub msg
{
	my ($partition, $id) = @_;
	return { partition => $partition, key => "sku-$id",
		headers => [ event_id => $id ],
		payload => '{"sku": "sku-' . $id . '", "qty": 1}' };
}

sub landed_rows
{
	return q1(qq{SELECT count(*) FROM obx.landed
				  WHERE consumer_name = '$lander' AND event_id = '$_[0]'});
}

############################################################################
# 1. First deliveries: one of each event, and copies of one landed event.
############################################################################
produce($mock, $topic, msg(0, 'evt-in'), msg(0, 'evt-past'));
produce($mock, $ltopic, msg(0, 'evt-l1'), msg(0, 'evt-l1'), msg(1, 'evt-l1'),
	msg(0, 'evt-l2'));
wait_caught_up($node, $consumer, $topic, partition_ends($mock, $topic), 'first deliveries');
wait_caught_up($node, $lander, $ltopic, partition_ends($mock, $ltopic), 'first landings');
is_deeply(effects_per_event($node), { 'evt-in' => 1, 'evt-past' => 1 },
	'each event is applied once');
is(landed_rows('evt-l1') . ' ' . landed_rows('evt-l2'), '1 1',
	'an event delivered three times (twice on its partition, once on another) lands once');
is(consumer_totals($node, $lander, $ltopic)->{duplicates}, '2',
	'its two copies count as duplicates: the mark (consumer, event id) dedupes landing, not the offset');

############################################################################
# 2. Marks in flight, and ages on both sides of the window; one purge pass.
############################################################################

# T1: a long transaction holding two uncommitted marks: "evt-long" as if
# T1 began two days ago (past the window), "evt-race-commit" as made now.
my $t1 = $node->background_psql('postgres');
$t1->query_safe('BEGIN');
is($t1->query_safe(qq{SELECT obx.mark_processed('$app', 'evt-long')}), 't',
	'T1 marks evt-long: true');
$t1->query_safe(qq{UPDATE obx.processed_events SET processed_at = now() - interval '2 days'
					WHERE consumer_name = '$app' AND event_id = 'evt-long'});
is($t1->query_safe(qq{SELECT obx.mark_processed('$app', 'evt-race-commit')}), 't',
	'T1 marks evt-race-commit: true');
my $xid1 = $t1->query_safe('SELECT pg_current_xact_id()');

# T3: marks "evt-race-rollback", and will roll back.
my $t3 = $node->background_psql('postgres');
$t3->query_safe('BEGIN');
is($t3->query_safe(qq{SELECT obx.mark_processed('$app', 'evt-race-rollback')}), 't',
	'T3 marks evt-race-rollback: true');
my $xid3 = $t3->query_safe('SELECT pg_current_xact_id()');

# T2 and T4 mark the same ids and wait.
my $t2 = start_mark('mark_t2', 'evt-race-commit');
my $t4 = start_mark('mark_t4', 'evt-race-rollback');
ok(waits_on('mark_t2', $xid1), 'T2, marking evt-race-commit too, waits for T1\'s transaction');
ok(waits_on('mark_t4', $xid3), 'T4, marking evt-race-rollback too, waits for T3\'s transaction');

# Committed marks on both sides of the one-day window.
mark($_) for qw(in-window past-window);
age($app, 'in-window', '23 hours');
age($app, 'past-window', '25 hours');
age($consumer, 'evt-in', '23 hours');
age($consumer, 'evt-past', '25 hours');
age($lander, 'evt-l1', '23 hours');

# obx:work completes evt-l1 (its row deleted); evt-l2 waits, landed a month ago.
is(q1(qq{SELECT obx.complete_landed('$lander', id) FROM obx.landed
		  WHERE consumer_name = '$lander' AND event_id = 'evt-l1'}), 't',
	'evt-l1 is completed: its landed row is deleted');
q1(qq{UPDATE obx.landed SET landed_at = now() - interval '30 days'
	   WHERE consumer_name = '$lander' AND event_id = 'evt-l2'});

purge_pass('with T1 and T3 open, T2 and T4 waiting');

is(mark_exists($app, 'past-window') . ' ' . mark_exists($consumer, 'evt-past'), '0 0',
	'marks older than obx.processed_retention are purged');
is(mark_exists($app, 'in-window') . ' ' . mark_exists($consumer, 'evt-in') . ' '
	  . mark_exists($lander, 'evt-l1'), '1 1 1',
	'marks younger than obx.processed_retention stay');
is($t1->query_safe(qq{SELECT string_agg(event_id || ' ' || (processed_at < now() - interval '1 day'), ', '
						ORDER BY event_id COLLATE "C") FROM obx.processed_events
						WHERE consumer_name = '$app' AND event_id IN ('evt-long', 'evt-race-commit')}),
	'evt-long true, evt-race-commit false',
	'T1\'s uncommitted marks survived the pass, evt-long although older than the window');
ok(waits_on('mark_t2', $xid1) && waits_on('mark_t4', $xid3),
	'T2 and T4 still wait, across the purge pass');
is(landed_rows('evt-l2'), '1', 'a landed row waiting a month is not purged');

############################################################################
# 3. The outcomes, and copies delivered after the pass.
############################################################################
$t1->query_safe('COMMIT');
is(finish_mark($t2), 'f', 'T1 committed: T2 gets false for evt-race-commit (exactly one true)');
$t3->query_safe('ROLLBACK');
is(finish_mark($t4), 't', 'T3 rolled back: T4 gets true for evt-race-rollback (exactly one true)');
$t1->quit;
$t3->quit;
is(mark('evt-race-commit') . mark('evt-race-rollback'), 'ff',
	'both are duplicates now');

is(mark('in-window'), 'f', 'a duplicate marked within the window: mark_processed returns false');
is(mark('past-window'), 't',
	'a duplicate whose mark was purged: mark_processed returns true again (the dedupe rule)');

produce($mock, $topic, msg(1, 'evt-in'), msg(1, 'evt-past'));
produce($mock, $ltopic, msg(1, 'evt-l1'), msg(0, 'evt-l2'));
wait_caught_up($node, $consumer, $topic, partition_ends($mock, $topic), 'copies');
wait_caught_up($node, $lander, $ltopic, partition_ends($mock, $ltopic), 'landed copies');
is_deeply(effects_per_event($node), { 'evt-in' => 1, 'evt-past' => 2 },
	'the consumer worker: a copy within the window is a duplicate, a copy after the purge is applied again');
is(handler_calls($node), '3', 'the handler was not called for the duplicate');
is(landed_rows('evt-l1'), '0', 'a copy of a completed landed event lands nothing');
is(landed_rows('evt-l2'), '1', 'a copy of a landed event still waiting lands nothing');
is(consumer_totals($node, $lander, $ltopic)->{duplicates}, '4',
	'both landed copies count as duplicates');

############################################################################
# 4. A mark's age counts from its transaction's start.
############################################################################
ok($node->poll_query_until('postgres', qq{
	SELECT count(*) = 0 FROM obx.processed_events
	 WHERE consumer_name = '$app' AND event_id = 'evt-long'}),
	'committed, the mark of a transaction that began past the window goes at the next pass');
is(mark('evt-long'), 't', '... and its id is a first time again');
purge_pass('after the copies');
is(mark_exists($app, 'in-window') . ' ' . mark_exists($app, 'evt-race-commit') . ' '
	  . mark_exists($consumer, 'evt-in') . ' ' . mark_exists($lander, 'evt-l1'), '1 1 1 1',
	'marks younger than the window are still there');

done_testing();
