# Window: synchronous replication, with the synchronous standby away.
#
# A primary with obx and synchronous_standby_names naming its streaming
# standby.  The application commits with synchronous_commit = local, so its
# events are visible (and on the primary's disk) before the standby has
# them.  The relay must not publish such an event until the standby has
# flushed it: a failover to that standby would otherwise lose an event
# Kafka already has (docs/guarantees.md, guarantee 1, "synchronous
# replication").
#
# With the standby stopped, the relay claims the event and waits for the
# standby, holding no transaction and no lock, and the broker gets
# nothing.  A cancel of the waiting worker (pg_cancel_backend) does not
# make it publish; neither does a fast shutdown, which completes.  Once
# the standby is back, the events are published, each at least once.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $topic = 'orders.syncrep.v1';
my $workers = 2;

my $mock = start_mock();

my $primary = obx_primary('primary', $mock, 'obx.workers' => $workers);
relay_ready($primary, $workers);

$primary->backup('b');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'b', has_streaming => 1);
# Not a relay of its own: the standby only has to confirm WAL.
$standby->append_conf('postgresql.conf', "obx.workers = 0\n");
$standby->start;

# Synchronous from here on: the standby connects as application_name
# "standby" (PostgreSQL::Test::Cluster's primary_conninfo).
$primary->append_conf('postgresql.conf', "synchronous_standby_names = 'standby'\n");
$primary->reload;
ok($primary->poll_query_until('postgres',
	"SELECT sync_state = 'sync' FROM pg_stat_replication WHERE application_name = 'standby'"),
	'the standby is the synchronous standby');

# enqueue($key, $sync): one event in a transaction with that
# synchronous_commit; returns its id.
sub enqueue
{
	my ($key, $sync) = @_;
	return $primary->safe_psql('postgres', qq{
		SET synchronous_commit = $sync;
		SELECT obx.enqueue('$topic', '$key', '{"k": "$key"}');
	});
}

# published($id): whether the outbox says the event is published.
sub published
{
	my ($id) = @_;
	return $primary->safe_psql('postgres',
		"SELECT published_at IS NOT NULL FROM obx.outbox_events WHERE id = '$id'") eq 't';
}

# relay_waiting_for_standby(): the pid of a relay worker waiting for the
# synchronous standby, or an empty string.
sub relay_waiting_for_standby
{
	return $primary->safe_psql('postgres', q{
		SELECT min(pid) FROM pg_stat_activity
		 WHERE backend_type = 'obx relay' AND wait_event = 'SyncRep'});
}

# Standby up: an event committed with synchronous_commit = local is
# published.
my $e1 = enqueue('k1', 'local');
my $msgs = wait_for_broker($mock, $topic, sub { event_ids_at_broker(shift)->{$e1} },
	'the first event at the broker');
ok(published($e1), 'with the standby up, the event is published');

#
# Standby down.
#
$standby->stop('fast');
ok($primary->poll_query_until('postgres',
	"SELECT count(*) = 0 FROM pg_stat_replication WHERE application_name = 'standby'"),
	'the standby is gone');
my $e2 = enqueue('k2', 'local');
ok($primary->safe_psql('postgres',
	"SELECT count(*) FROM obx.outbox_events WHERE id = '$e2'") eq '1',
	'the application committed the second event without waiting for the standby');

# Wait until the relay waits for the standby, or (the failure) publishes.
my $waiter;
wait_until(sub {
	$waiter = relay_waiting_for_standby();
	length($waiter) || published($e2)
		|| event_ids_at_broker(read_topic($mock, $topic))->{$e2} },
	'a relay worker waiting for the standby, or the event published');
ok(length($waiter), "a relay worker (pid $waiter) claimed the event and waits for the standby")
  or BAIL_OUT('no relay worker waits for the standby');
is($primary->safe_psql('postgres', qq{
	SELECT coalesce(backend_xid::text, 'none') || ' ' || coalesce(xact_start::text, 'none')
	       || ' ' || (SELECT count(*) FROM pg_locks WHERE pid = $waiter)
	  FROM pg_stat_activity WHERE pid = $waiter}),
	'none none 0', 'the waiting worker holds no transaction and no lock');
ok(!published($e2), 'the event is not marked published while the standby is away');
ok(!event_ids_at_broker(read_topic($mock, $topic))->{$e2},
	'the broker does not have the event while the standby is away');

# A cancel of the waiting worker.  It must give the claim up, not publish,
# and then claim the event again and wait again.
my $log_offset = -s $primary->logfile;
$primary->safe_psql('postgres', "SELECT pg_cancel_backend($waiter)");
ok($primary->wait_for_log(
	qr/obx relay stopped waiting for the synchronous standby and released 1 claimed event unpublished/,
	$log_offset), 'the cancelled worker released its claim unpublished');
wait_until(sub {
	length(relay_waiting_for_standby()) || published($e2)
		|| event_ids_at_broker(read_topic($mock, $topic))->{$e2} },
	'a relay worker waiting for the standby again, or the event published');
ok(!event_ids_at_broker(read_topic($mock, $topic))->{$e2},
	'after the cancel, the broker still does not have the event');
ok(!published($e2), 'and the event is still unpublished');
ok(length(relay_waiting_for_standby()), 'a relay worker claimed the event again and waits for the standby');

#
# The standby returns: the event is published.
#
$standby->start;
$msgs = wait_for_broker($mock, $topic, sub { event_ids_at_broker(shift)->{$e2} },
	'the second event at the broker');
ok(published($e2), 'with the standby back, the event is published');

#
# A fast shutdown while a worker waits for the away standby completes, and
# the event waits for the standby's return across the restart.
#
$standby->stop('fast');
ok($primary->poll_query_until('postgres',
	"SELECT count(*) = 0 FROM pg_stat_replication WHERE application_name = 'standby'"),
	'the standby is gone again');
my $e3 = enqueue('k3', 'local');
wait_until(sub {
	length(relay_waiting_for_standby()) || published($e3)
		|| event_ids_at_broker(read_topic($mock, $topic))->{$e3} },
	'a relay worker waiting for the standby, or the third event published');
ok(length(relay_waiting_for_standby()), 'a relay worker waits for the standby with the third event');
# pg_ctl waits at most PGCTLTIMEOUT (the harness timeout) for the stop.
my $stopped = $primary->stop('fast', fail_ok => 1);
ok($stopped, 'a fast shutdown completes while the worker waits for the standby');
$primary->stop('immediate') unless $stopped;
ok(!event_ids_at_broker(read_topic($mock, $topic))->{$e3},
	'the broker does not have the third event');

$primary->start;
ok($primary->safe_psql('postgres',
	"SELECT published_at IS NULL FROM obx.outbox_events WHERE id = '$e3'") eq 't',
	'after the restart, the third event is still unpublished');
$standby->start;
$msgs = wait_for_broker($mock, $topic, sub { event_ids_at_broker(shift)->{$e3} },
	'the third event at the broker');
ok(all_published($primary), 'with the standby back, every event is published');
is_deeply([ sort keys %{ event_ids_at_broker($msgs) } ], [ sort ($e1, $e2, $e3) ],
	'the broker holds exactly the three committed events');

$primary->stop('fast');
$standby->stop('fast');
done_testing();
