# The application's side through a connection pooler in transaction mode
# (PgBouncer, Debian's, pool_mode = transaction: each transaction may get
# another server session, as RDS Proxy or Supavisor give it):
# - obx.enqueue, with SET LOCAL obx.traceparent, in transactions of 8
#   clients over 4 server sessions, a sixth rolling back: the broker holds
#   exactly the committed events, per key in enqueue order, each with the
#   trace context its own transaction set;
# - obx.mark_processed of the same ids from 8 clients at once: each id is
#   marked once (true once, false for every other call).
# The relay, obx-relay and obx:work need a session of their own
# (docs/operations.md, "Connection poolers"); they do not go through it.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use IPC::Run;
use ObxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $topic = 't.pooled';
my $mock = start_mock();
my $node = obx_node('pooler', $mock, 'obx.workers' => 1);
relay_ready($node, 1);

# PgBouncer in transaction mode in front of the node's socket.
my $dir = PostgreSQL::Test::Utils::tempdir('pgbouncer');
my $port = PostgreSQL::Test::Cluster::get_free_port();
open(my $fh, '>', "$dir/pgbouncer.ini") or die "cannot write pgbouncer.ini: $!";
printf $fh <<'EOF', $node->host, $node->port, scalar(getpwuid($<)), $port, $dir, $dir;
[databases]
postgres = host=%s port=%d dbname=postgres user=%s
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = 4
max_client_conn = 50
logfile = %s/pgbouncer.log
pidfile = %s/pgbouncer.pid
admin_users = postgres
ignore_startup_parameters = extra_float_digits
server_reset_query =
EOF
close $fh;
my $bouncer = IPC::Run::start([ '/usr/sbin/pgbouncer', "$dir/pgbouncer.ini" ],
	'<', \undef, '>', "$dir/stdout", '2>', "$dir/stderr");
my $pooled = "host=127.0.0.1 port=$port dbname=postgres";
wait_until(sub {
	system('psql', '-X', '-q', '-d', $pooled, '-c', 'SELECT 1', '-o', '/dev/null') == 0 },
	'PgBouncer to accept connections');

$node->safe_psql('postgres', q{
	CREATE TABLE app_orders (id bigserial PRIMARY KEY, k int NOT NULL, trace text NOT NULL);
	CREATE TABLE app_marks (n int NOT NULL, first boolean NOT NULL);});

# 1. 8 clients, 1,200 transactions through the pooler; a sixth roll back.
my $script = "$dir/enqueue.sql";
open($fh, '>', $script) or die "cannot write $script: $!";
print $fh <<'EOF';
\set k random(1, 40)
\set t random(1000000000, 9999999999)
\set undo random(1, 6)
BEGIN;
SELECT set_config('obx.traceparent', '00-' || lpad(:t::text, 32, '0') || '-00000000000000aa-01', true);
INSERT INTO app_orders (k, trace) VALUES (:k, lpad(:t::text, 32, '0'));
SELECT obx.enqueue('t.pooled', 'k' || :k, jsonb_build_object('k', :k, 'trace', lpad(:t::text, 32, '0')));
\if :undo = 1
ROLLBACK;
\else
COMMIT;
\endif
EOF
close $fh;
command_ok([ 'pgbench', '-n', '-M', 'simple', '-c', '8', '-j', '2', '-t', '150', '-f', $script, '-d', $pooled ],
	'1,200 transactions through PgBouncer in transaction mode');
my $counts = $node->safe_psql('postgres', q{
	SELECT (SELECT count(*) FROM app_orders) || ',' ||
		   (SELECT count(*) FROM obx.outbox_events WHERE topic = 't.pooled')});
my ($orders, $events) = split /,/, $counts;
is($events, $orders, "one event per committed order ($orders of 1,200 committed)");
cmp_ok($orders, '<', 1200, 'some transactions rolled back');
my @ids = split /\n/, $node->safe_psql('postgres', qq{SELECT id FROM obx.outbox_events WHERE topic = '$topic'});
my $msgs = broker_holds_exactly($mock, $node, $topic, \@ids, "topic = '$topic'");
my $wrong = grep {
	my ($trace) = ($_->{payload} // '') =~ /"trace": "(\d+)"/;
	!defined $trace || ($_->{headers}{traceparent} // '') !~ /^00-$trace-/ } @$msgs;
is($wrong, 0, 'each message carries the trace context its own transaction set with SET LOCAL');

# 2. The same ids marked from 8 clients at once.
$script = "$dir/mark.sql";
open($fh, '>', $script) or die "cannot write $script: $!";
print $fh <<'EOF';
\set n random(1, 150)
BEGIN;
INSERT INTO app_marks SELECT :n, obx.mark_processed('pooled', 'evt-' || :n);
COMMIT;
EOF
close $fh;
command_ok([ 'pgbench', '-n', '-M', 'simple', '-c', '8', '-j', '2', '-t', '100', '-f', $script, '-d', $pooled ],
	'800 marks through PgBouncer in transaction mode');
is($node->safe_psql('postgres', q{
	SELECT count(*) FILTER (WHERE firsts <> 1) FROM (
		SELECT n, count(*) FILTER (WHERE first) AS firsts FROM app_marks GROUP BY n) x}),
	'0', 'each id was marked processed once: true for one call, false for the others');
is($node->safe_psql('postgres', q{
	SELECT (SELECT count(DISTINCT n) FROM app_marks)
		 = (SELECT count(*) FROM obx.processed_events WHERE consumer_name = 'pooled')}),
	't', 'one dedupe row per id');

$bouncer->kill_kill;
done_testing();
