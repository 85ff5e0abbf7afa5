# obx without its library: the SQL-only install and obx-relay, the relay
# as a daemon (src/daemon/), on a PostgreSQL that never loads obx's
# library.  The daemon connects over TCP with a SCRAM password, as a role
# that is not superuser and holds only obx_worker's grants, and runs the
# in-database relay's protocol (src/protocol/protocol.h).
#
# Proves, on the Kafka stand-in:
# - --check says what is wrong: a role without the grants fails it, the
#   relay's role passes; a settings file that holds the password and that
#   group or others may read is refused, and so is a relay_id among the
#   in-database workers' numbers (which release their number's leases);
# - rollback: no rolled-back event (a whole transaction, or a savepoint)
#   reaches Kafka, every committed one does;
# - concurrent producers and the late committer: pgbench transactions
#   that lock an order row and enqueue, a fifth rolling back, and one
#   transaction that takes the first seq and commits last: the broker holds
#   exactly the committed events, per key in enqueue order;
# - the daemon killed (SIGKILL) after Kafka acknowledged a batch, before
#   its record committed: the batch's lease runs out, a new daemon sends it
#   again with the same ids, nothing is lost, per-key order holds;
# - every broker down: the events wait (failed attempts are recorded as
#   transient), and go out in order once the brokers are back;
# - a replayed event in flight holds its key and is not claimed again;
# - SIGHUP reloads the settings (a smaller batch_size takes effect);
# - two daemons at once on one database: both claim, no event is sent
#   twice, and the guarantees above hold (the claim lock and the leases are
#   the in-database relay's); while another session holds the claim lock,
#   neither claims;
# - under a steady load (no claim comes back empty), the daemon still runs
#   the outbox's rotation: a generation is truncated, and every event
#   committed across it reaches Kafka exactly once;
# - its sessions run as the role relay, not a superuser, and defaults set
#   for that role (read-only, serializable, 1 ms timeouts, a search_path
#   with a hostile now() first) neither stop it nor run that function;
# - no password shows in what --check prints or in its log;
# - SIGTERM stops it with exit status 0.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxDaemon;
use ObxTest;
use ObxWindows;
use PostgreSQL::Test::Utils;
use Test::More;

my $mock = start_mock();
my $dir = PostgreSQL::Test::Utils::tempdir('relay');
my $node = sql_only_node('daemon');
# Only the relays and the test commit here: an idle daemon that reads the
# snapshot instead of claiming must still claim when a lease runs out
# with no commit at all (below, after the kill).
$node->append_conf('postgresql.conf', "autovacuum = off\n");
$node->reload;

is($node->safe_psql('postgres', q{
	SELECT current_setting('shared_preload_libraries') || '|' ||
		   (SELECT count(*) FROM pg_extension WHERE extname = 'obx') || '|' ||
		   (SELECT count(*) FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
			 WHERE p.pronamespace = 'obx'::regnamespace AND l.lanname = 'c')}),
	'|0|0', 'no library preloaded, no obx extension, no C function in schema obx');

#
# --check
#
$node->safe_psql('postgres', q{CREATE ROLE stranger LOGIN PASSWORD 'stranger-secret'});
my ($status, $out) = relay_check(relay_config($node, $mock, $dir,
	user => 'stranger', password => 'stranger-secret'));
my $printed = $out;
isnt($status, 0, '--check fails for a role without the grants');
like($out, qr/FAIL\s+role "stranger" lacks SELECT, INSERT on obx\.claims/,
	'--check names the grant that is missing');
my $config = relay_config($node, $mock, $dir);
($status, $out) = relay_check($config);
$printed .= $out;
is($status, 0, '--check passes for the relay role') or diag($out);
like($out, qr/role "relay" holds every grant the relay needs/, '--check reports the grants');
like($out, qr/brokers .* answer/, '--check reached the brokers');
unlike($out, qr/superuser/, '--check: the relay role is not a superuser');
chmod(0644, $config) or die "chmod $config: $!";
($status, $out) = relay_check($config);
isnt($status, 0, '--check refuses a settings file that holds a password and others may read');
like($out, qr/settings file ".*" holds a password and has group or world access/,
	'--check says why the settings file is refused');
chmod(0600, $config) or die "chmod $config: $!";
($status, $out) = relay_check(relay_config($node, $mock, $dir, relay_id => 31));
isnt($status, 0, '--check refuses relay_id 31, an in-database worker\'s number');
like($out, qr/setting relay_id must be a whole number from 32 to/, '--check names the range of relay_id');

# Hostile defaults for the daemon's sessions: read-only transactions,
# serializable, timeouts of a millisecond, and a search_path that puts a
# schema of someone else's first, with a now() of its own.  The daemon
# pins its settings (OBX_PINNED_SETTINGS): none of this may stop it or run
# that function.
$node->safe_psql('postgres', q{
	CREATE ROLE mallory;
	CREATE SCHEMA evil AUTHORIZATION mallory;
	CREATE TABLE evil.calls (who text);
	GRANT INSERT ON evil.calls TO PUBLIC;
	GRANT USAGE ON SCHEMA evil TO PUBLIC;
	CREATE FUNCTION evil.now() RETURNS timestamptz LANGUAGE sql
		AS $$ INSERT INTO evil.calls VALUES (current_user) RETURNING '-infinity'::timestamptz $$;
	ALTER FUNCTION evil.now() OWNER TO mallory;
	GRANT EXECUTE ON FUNCTION evil.now() TO PUBLIC;
	ALTER ROLE relay IN DATABASE postgres SET default_transaction_read_only = on;
	ALTER ROLE relay IN DATABASE postgres SET default_transaction_isolation = 'serializable';
	ALTER ROLE relay IN DATABASE postgres SET statement_timeout = '1ms';
	ALTER ROLE relay IN DATABASE postgres SET lock_timeout = '1ms';
	ALTER ROLE relay IN DATABASE postgres SET search_path = evil, pg_catalog;});

my $relay = start_relay($config);

#
# Rollback.
#
my ($committed, $rolled_back) = enqueue_with_rollbacks($node, 'orders.rollback.v1', 10);
broker_holds_exactly($mock, $node, 'orders.rollback.v1', [ keys %$committed ],
	"topic = 'orders.rollback.v1'");
my $seen = event_ids_at_broker(read_topic($mock, 'orders.rollback.v1'));
is(scalar(grep { $seen->{$_} } keys %$rolled_back), 0, 'no rolled-back event reached Kafka');

is($node->safe_psql('postgres',
	q{SELECT string_agg(DISTINCT usename, ',') FROM pg_stat_activity
	   WHERE application_name = 'obx-relay'}),
	'relay', 'the daemon runs as the role relay');
is($node->safe_psql('postgres', 'SELECT count(*) FROM evil.calls'), 0,
	'with hostile role defaults, the daemon published and never called a function of another schema');

#
# Concurrent producers and the late committer.
#
my ($late, $late_id) = late_committer($node, 'orders.v1');
run_producers($node, norders => 100, clients => 4, per_client => 150,
	topic => 'orders.v1', second_topic => 'orders.audit.v1',
	what => 'pgbench: concurrent committing and rolling-back producers');
$late->query_safe('COMMIT');
$late->quit;
ok(all_published($node), 'every committed event is recorded as published');
for my $topic ('orders.v1', 'orders.audit.v1')
{
	my $ids = committed_ids($node, "topic = '$topic'");
	broker_holds_exactly($mock, $node, $topic, [ map { @$_ } values %$ids ], "topic = '$topic'");
}
is($node->safe_psql('postgres', q{SELECT count(*) FROM obx.outbox_events
	WHERE payload->>'rb' = 'true'}), 0, 'no event of a rolled-back transaction exists');

#
# Killed after the acknowledgement, before the record.
#
my $topic = 'orders.crash.v1';
my $bg = $node->background_psql('postgres', on_error_stop => 0);
my $bg_pid = $bg->query_safe('SELECT pg_backend_pid()');
$bg->query_safe("SET lock_timeout = '10s'; BEGIN; LOCK TABLE obx.records IN SHARE MODE;");
# One transaction, so that one claim takes the whole batch.
my @batch = split /\n/, $node->safe_psql('postgres', qq{
	SELECT obx.enqueue('$topic', 'ord_' || (g % 3), jsonb_build_object('n', g))
	  FROM generate_series(1, 6) g});
is(scalar(@batch), 6, 'six events enqueued in one transaction');
wait_for_broker($mock, $topic, sub {
	my $at = event_ids_at_broker(shift);
	!grep { !$at->{$_} } @batch }, 'the batch at the broker');
ok($node->poll_query_until('postgres', qq{
	SELECT count(*) = 1 FROM pg_stat_activity
	 WHERE application_name = 'obx-relay' AND wait_event_type = 'Lock'
	   AND $bg_pid = ANY (pg_blocking_pids(pid))}),
	'the daemon waits to record the acknowledged batch');
is($node->safe_psql('postgres', 'SELECT count(*) FROM obx.outbox_events WHERE published_at IS NULL'),
	scalar(@batch), 'acknowledged by Kafka, not recorded as published');
stop_relay($relay, 'KILL');
$bg->query_safe('ROLLBACK');
$bg->quit;
$relay = start_relay($config);
my $msgs = wait_for_broker($mock, $topic, sub {
	my $at = event_ids_at_broker(shift);
	!grep { ($at->{$_} // 0) < 2 } @batch }, 'the batch sent again after its lease ran out');
ok(all_published($node), 'after the crash, every event is recorded as published');
is_deeply(first_occurrences($msgs), committed_ids($node, "topic = '$topic'"),
	'after the crash, per key, broker order equals enqueue order');
like(relay_log($relay), qr/connected to database "postgres" as role "relay"/,
	'the new daemon connected');

#
# Every broker down, then back.
#
$topic = 'orders.down.v1';
mock_cmd($mock, 'down all');
my @down = map {
	$node->safe_psql('postgres', "SELECT obx.enqueue('$topic', 'ord_' || ($_ % 2), '{\"n\": $_}')")
} 1 .. 4;
ok($node->poll_query_until('postgres', q{
	SELECT count(*) > 0 FROM obx.event_states WHERE last_error_class = 'transient'}),
	'with the brokers down, failed attempts are recorded as transient');
mock_cmd($mock, 'up all');
broker_holds_exactly($mock, $node, $topic, \@down, "topic = '$topic'");
ok(all_published($node), 'once the brokers are back, everything is published');

#
# A replayed event in flight holds its key, though the claims' floor has
# passed it (t/028_retry_in_flight.pl for the extension's relay): every
# broker answers 1.5 s late; while the replay of A is out, B of its key
# and C of another key commit.  C goes out beside the replay, B after it,
# and A is not claimed a third time.
#
$topic = 'orders.replay.v1';
my $ra = $node->safe_psql('postgres', "SELECT obx.enqueue('$topic', 'ord_1', '{}')");
wait_for_broker($mock, $topic, sub { event_ids_at_broker(shift)->{$ra} }, 'A at the broker');
mock_cmd($mock, 'rtt all 1500');
$node->safe_psql('postgres', "SELECT obx.replay(ARRAY['$ra']::uuid[])");
$node->poll_query_until('postgres', "SELECT count(*) = 2 FROM obx.claims WHERE '$ra' = ANY (ids)")
  or die 'the replay of A was not claimed';
my $rb = $node->safe_psql('postgres', "SELECT obx.enqueue('$topic', 'ord_1', '{}')");
my $rc = $node->safe_psql('postgres', "SELECT obx.enqueue('$topic', 'ord_2', '{}')");
$node->poll_query_until('postgres', "SELECT count(*) = 1 FROM obx.claims WHERE '$rc' = ANY (ids)")
  or die 'C was not claimed';
is($node->safe_psql('postgres', "SELECT count(*) FROM obx.records WHERE '$ra' = ANY (ids)"), '1',
	'replay: C was claimed while the replay of A was in flight');
ok(all_published($node), 'replay: everything is published');
mock_cmd($mock, 'rtt all 0');
$msgs = wait_for_broker($mock, $topic, sub { event_ids_at_broker(shift)->{$rb} }, 'B at the broker');
is_deeply(copies_of_key($msgs, 'ord_1'), [ $ra, $ra, $rb ],
	'replay: A, its replay, then B at the broker; no third copy of A');
is($node->safe_psql('postgres', "SELECT count(*) FROM obx.claims WHERE '$ra' = ANY (ids)"), '2',
	'replay: no claim took A a third time');

#
# Two daemons at once, in small batches: SIGHUP gives the first one its
# new batch_size; each batch waits 200 ms for its acknowledgement, and
# meanwhile the other daemon claims what the first one's leases leave free.
#
relay_config($node, $mock, $dir, path => $config, batch_size => 20);
kill('HUP', $relay->{pid});
ok(wait_until(sub { relay_log($relay) =~ /settings reloaded/ }, 'the reload'),
	'SIGHUP: the daemon reloads its settings');
my $second = start_relay(relay_config($node, $mock, $dir, relay_id => 1001, batch_size => 20));
my $first_lease = $node->safe_psql('postgres', 'SELECT coalesce(max(lease_id), 0) FROM obx.claims');
$node->safe_psql('postgres', 'DROP TABLE orders');
unlink glob($node->basedir . '/producers_*.sql');
mock_cmd($mock, 'rtt all 200');
run_producers($node, norders => 50, clients => 4, per_client => 150,
	topic => 'orders.two.v1', what => 'pgbench: producers with two daemons');
ok(all_published($node), 'two daemons: every committed event is recorded as published');
mock_cmd($mock, 'rtt all 0');
my $ids = committed_ids($node, q{topic = 'orders.two.v1'});
broker_holds_exactly($mock, $node, 'orders.two.v1', [ map { @$_ } values %$ids ],
	q{topic = 'orders.two.v1'});
$seen = event_ids_at_broker(read_topic($mock, 'orders.two.v1'));
is(scalar(grep { $seen->{$_} != 1 } keys %$seen), 0,
	'two daemons: no event reached Kafka twice (no crash, so no re-send)');
my $claims = $node->safe_psql('postgres', qq{
	SELECT owner || ': ' || count(*) || ' claims of at most ' || max(cardinality(ids)) || ' events'
	  FROM obx.claims WHERE lease_id > $first_lease AND ids IS NOT NULL
	 GROUP BY owner ORDER BY owner});
note("claims per daemon: $claims");
like($claims, qr/^1000: \d+ claims of at most (\d|1\d|20) events\n1001: \d+ claims of at most (\d|1\d|20) events$/,
	'both daemons claimed batches, of at most the reloaded batch_size');

#
# The claim lock: while another session holds it, neither daemon claims
# (both wait for it, so nothing is published); once it is free, they do.
#
$topic = 'orders.lock.v1';
my $holder = $node->background_psql('postgres');
$holder->query_safe('SELECT pg_advisory_lock(7299704, 1)');
my @locked = split /\n/, $node->safe_psql('postgres', qq{
	SELECT obx.enqueue('$topic', 'ord_' || g, '{}') FROM generate_series(1, 5) g});
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 2 FROM pg_stat_activity
	 WHERE application_name = 'obx-relay' AND wait_event = 'advisory'}),
	'both daemons wait for the claim lock');
is($node->safe_psql('postgres', qq{SELECT count(*) FROM obx.outbox_events
	WHERE topic = '$topic' AND published_at IS NULL}), 5,
	'nothing is claimed while the claim lock is held');
$holder->query_safe('SELECT pg_advisory_unlock(7299704, 1)');
$holder->quit;
broker_holds_exactly($mock, $node, $topic, \@locked, "topic = '$topic'");

#
# SIGTERM.
#
is(stop_relay($second), 0, 'SIGTERM stops the daemon with exit status 0');
like(relay_log($second), qr/stopped/, 'the daemon says it stopped');

#
# The outbox's rotation under a steady load: with retention = 2 s, the
# first daemon, alone again and claiming every 100 ms, closes the current
# generation, marks it published and truncates it while pgbench enqueues
# 500 events/s, so that no claim comes back empty; every committed event
# reaches Kafka once, across the truncation.  The ids are kept in a table of the test's own, since the
# truncation removes them from the outbox.
#
$topic = 'orders.rotation.v1';
relay_config($node, $mock, $dir, path => $config, poll_interval => 100, retention => 2);
my $reloads = () = relay_log($relay) =~ /settings reloaded/g;
kill('HUP', $relay->{pid});
ok(wait_until(sub { (() = relay_log($relay) =~ /settings reloaded/g) > $reloads }, 'the reload'),
	'SIGHUP: retention = 2 s');
my $oldest = $node->safe_psql('postgres', 'SELECT min(generation) FROM obx.generations');
$node->safe_psql('postgres', 'CREATE TABLE rotation_sent (id uuid PRIMARY KEY)');
my $script = $node->basedir . '/rotation.sql';
append_to_file($script, qq{\\set k random(1, 20)
INSERT INTO rotation_sent VALUES (obx.enqueue('$topic', 'ord_' || :k, '{}'));
});
my $load = IPC::Run::start([ 'pgbench', '--no-vacuum', '--client=2', '--jobs=2', '--rate=500',
	'--time=120', '--file', $script, $node->connstr('postgres') ],
	'<', \undef, '>', \my $load_out, '2>', \my $load_err);
ok(wait_until(sub { $node->safe_psql('postgres',
	"SELECT min(generation) > $oldest FROM obx.generations") eq 't' },
	'a generation truncated under load', timeout => 100),
	'under a steady load, the daemon truncated a published generation');
ok($load->pumpable, 'the load was still running when the generation was truncated')
  or diag($load_err);
$load->kill_kill;
my @sent = split /\n/, $node->safe_psql('postgres', 'SELECT id FROM rotation_sent');
note(scalar(@sent) . ' events enqueued during the rotation');
$msgs = wait_for_broker($mock, $topic, sub {
	my $seen = event_ids_at_broker(shift);
	!grep { !$seen->{$_} } @sent }, "every event of $topic at the broker");
$seen = event_ids_at_broker($msgs);
is_deeply([ sort keys %$seen ], [ sort @sent ],
	'across the truncation, the broker holds exactly the committed events');
is(scalar(grep { $seen->{$_} != 1 } keys %$seen), 0, 'and each of them once');

is(stop_relay($relay), 0, 'the first daemon stops too');
$printed .= relay_log($relay) . relay_log($second);
is(scalar(grep { index($printed, $_) >= 0 } ('relay-secret', 'stranger-secret')), 0,
	'no password in what --check printed or in the daemons\' logs');

done_testing();
