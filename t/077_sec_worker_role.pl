# Security: the relay and consumer workers run their statements as
# obx.worker_role, a role that is not a superuser, with only the grants
# CREATE EXTENSION gives obx_worker.
#
# Part 1 (default role obx_worker): a grant taken away stops the worker.
# With INSERT on obx.records revoked the relay cannot record a batch: the
# event stays unpublished however often it reaches the broker; with INSERT
# on obx.processed_events revoked the consumer cannot mark a message, and
# the handler's effect, in the same transaction, is not kept either.  A
# superuser would ignore both revocations.  Granted back, the event is
# published and the message applied once.
#
# Part 2 (obx.worker_role naming a role that does not exist yet): the
# relay waits, says why in obx.workers and the log, and is not restarted
# in a loop: the same process goes through a role that is missing, one
# that is a superuser (refused), one without obx_worker's grants
# (refused), and then, granted obx_worker, publishes.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use ObxConsumer;
use PostgreSQL::Test::Utils;
use Test::More;

my $mock = start_mock();

# --- Part 1 -----------------------------------------------------------
my $topic = 'sec.role.v1';
my $consumer = 'stock-role';
my $node = consumer_node('sec_worker_role', $mock, topics => { $topic => 1 },
	relays => 1);
subscribe($node, $consumer, [$topic], 'shop.record(obx.inbound_event)');

is($node->safe_psql('postgres',
		q{SELECT rolsuper::text || ' ' || rolcanlogin::text FROM pg_roles WHERE rolname = 'obx_worker'}),
	'false false', 'CREATE EXTENSION made obx_worker: not a superuser, cannot log in');

my $log_at = -s $node->logfile;
$node->safe_psql('postgres', 'REVOKE INSERT ON obx.records FROM obx_worker');
my $held = $node->safe_psql('postgres', "SELECT obx.enqueue('$topic', 'k1', '{\"n\": 1}')");
ok($node->wait_for_log(qr/permission denied for table records/, $log_at),
	'without INSERT on obx.records the relay cannot record its batch');
wait_for_broker($mock, $topic, sub { event_ids_at_broker(shift)->{$held} },
	'the event at the broker');
is($node->safe_psql('postgres', "SELECT published_at IS NULL FROM obx.outbox_events WHERE id = '$held'"),
	't', 'it reached the broker, but is not published');

$node->safe_psql('postgres', 'GRANT INSERT ON obx.records TO obx_worker');
ok($node->poll_query_until('postgres',
		"SELECT published_at IS NOT NULL FROM obx.outbox_events WHERE id = '$held'"),
	'granted back, the relay records it');

# The consumer: the message the relay published is not applied while the
# worker cannot mark it.
$log_at = -s $node->logfile;
$node->safe_psql('postgres', 'REVOKE INSERT ON obx.processed_events FROM obx_worker');
my $second = $node->safe_psql('postgres', "SELECT obx.enqueue('$topic', 'k1', '{\"n\": 2}')");
ok($node->wait_for_log(qr/permission denied for table processed_events/, $log_at),
	'without INSERT on obx.processed_events the consumer cannot mark a message');
is($node->safe_psql('postgres', "SELECT count(*) FROM shop.effects WHERE event_id = '$second'"),
	'0', "and the handler's effect is rolled back with the mark");
$node->safe_psql('postgres', 'GRANT INSERT ON obx.processed_events TO obx_worker');
wait_caught_up($node, $consumer, $topic, partition_ends($mock, $topic), 'after the grant');
my $effects = effects_per_event($node);
is_deeply([ map { $effects->{$_} // 0 } $held, $second ], [ 1, 1 ],
	'granted back, each message is applied once');
is($node->safe_psql('postgres', 'SELECT DISTINCT applied_by FROM shop.effects'),
	'postgres', 'the handler ran as its owner, not as the worker');

# --- Part 2 -----------------------------------------------------------
my $other = obx_node('sec_worker_role_missing', $mock,
	'obx.workers' => 1,
	'obx.consumer_workers' => 0,
	'obx.worker_role' => "'relay_app'");
my $waiting = sub {
	my ($why, $what) = @_;
	ok($other->poll_query_until('postgres', qq{
			SELECT state = 'waiting for role' AND last_error LIKE '%$why%'
			  FROM obx.workers WHERE worker = 0}),
		"obx.workers says the relay waits: $what");
};
my $pending = $other->safe_psql('postgres', "SELECT obx.enqueue('$topic', 'k2', '{\"n\": 3}')");
$waiting->('role "relay_app" (obx.worker_role) does not exist', 'no such role');
ok($other->log_contains(qr/WARNING:  obx relay 0 is waiting: role "relay_app" \(obx.worker_role\) does not exist/),
	'and the log says it');
my $pid = $other->safe_psql('postgres', 'SELECT pid FROM obx.workers WHERE worker = 0');

$other->safe_psql('postgres', 'CREATE ROLE relay_app SUPERUSER');
$waiting->('role "relay_app" (obx.worker_role) is a superuser', 'a superuser is refused');
$other->safe_psql('postgres', 'ALTER ROLE relay_app NOSUPERUSER');
$waiting->('does not have the privileges of role "obx_worker"', 'a role without the grants is refused');
is($other->safe_psql('postgres', "SELECT published_at IS NULL FROM obx.outbox_events WHERE id = '$pending'"),
	't', 'nothing was published meanwhile');

$other->safe_psql('postgres', 'GRANT obx_worker TO relay_app');
ok($other->poll_query_until('postgres',
		"SELECT published_at IS NOT NULL FROM obx.outbox_events WHERE id = '$pending'"),
	'granted obx_worker, the relay publishes');
ok($other->log_contains(qr/obx relay 0 runs its statements as role "relay_app"/),
	'as relay_app');
is($other->safe_psql('postgres', 'SELECT pid FROM obx.workers WHERE worker = 0'), $pid,
	'the same process all along: no restart loop');

done_testing();
