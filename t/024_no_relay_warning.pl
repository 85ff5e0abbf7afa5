# No silent dead end, and nothing lost: obx loaded by CREATE EXTENSION
# alone (not in shared_preload_libraries) runs no relay.  CREATE EXTENSION
# and the first obx.enqueue of each session warn, naming the setting;
# obx.status says why the events wait.  The enqueues still succeed, and
# after a restart with obx preloaded the relay publishes every one of them
# (the broker holds exactly the committed ids) and nothing warns any more.
# A database only the consumer serves is warned at its first enqueue, not
# at CREATE EXTENSION.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $topic = 'orders.unserved.v1';
my $mock = start_mock();
my $node = obx_node('no_preload', $mock, 'shared_preload_libraries' => "''");

# obx_node created the extension; again, to read what CREATE EXTENSION says.
$node->safe_psql('postgres', 'DROP EXTENSION obx');
my ($ret, $out, $err) = $node->psql('postgres', 'CREATE EXTENSION obx');
is($ret, 0, 'CREATE EXTENSION succeeds without the preload');
like($err, qr/WARNING:  no obx relay publishes the outbox of database "postgres".*DETAIL:  obx is not in shared_preload_libraries.*HINT:  Add obx to shared_preload_libraries/s,
	'CREATE EXTENSION warns that no relay runs, naming shared_preload_libraries');

my %committed;
($ret, $out, $err) = $node->psql('postgres', qq{
	SELECT obx.enqueue('$topic', 'k1', '{"n": 1}');
	SELECT obx.enqueue('$topic', 'k2', '{"n": 2}');});
is($ret, 0, 'obx.enqueue succeeds without a relay');
$committed{$_} = 1 for grep { length } split /\n/, $out;
is(scalar(() = $err =~ /WARNING:  no obx relay publishes/g), 1,
	'the first enqueue of the session warns, the second does not');
($ret, $out, $err) = $node->psql('postgres', "SELECT obx.enqueue('$topic', 'k1', '{\"n\": 3}')");
$committed{$out} = 1;
like($err, qr/WARNING:  no obx relay publishes/, 'a new session warns again at its first enqueue');
is(scalar(keys %committed), 3, 'three events committed');
is($node->safe_psql('postgres', 'SELECT pending, problem FROM obx.status'),
	'3|no relay serves this database: obx not in shared_preload_libraries',
	'obx.status: three events pending, and why');
is($node->safe_psql('postgres', 'SELECT count(*) FROM obx.workers'), '0', 'no relay worker');

# The fix the hint names: preload obx and restart.
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'obx'\nobx.workers = 1\n");
$node->restart;
ok(all_published($node), 'after the restart with obx preloaded every event is published');
broker_holds_exactly($mock, $node, $topic, [ keys %committed ], "topic = '$topic'");
is($node->safe_psql('postgres', 'SELECT count(*) FROM obx.status WHERE problem IS NOT NULL'), '0',
	'obx.status shows no problem any more');
($ret, $out, $err) = $node->psql('postgres', "SELECT obx.enqueue('$topic', 'k3', '{\"n\": 4}')");
unlike($err, qr/WARNING/, 'an enqueue in the served database does not warn');
is($node->safe_psql('postgres', 'SELECT database FROM obx.workers'), 'postgres',
	'obx.workers names the database its worker serves');

# A database that only consumes (the consumer workers serve it, no relay
# does) is not warned at CREATE EXTENSION, only once it enqueues; one that
# nothing serves is.
$node->safe_psql('postgres', q{
	CREATE DATABASE inventory;
	CREATE DATABASE lonely;
	ALTER SYSTEM SET obx.consumer_databases = 'postgres, inventory';
	SELECT pg_reload_conf();});
ok($node->poll_query_until('inventory', q{SELECT current_setting('obx.consumer_databases') = 'postgres, inventory'}),
	'the consumer serves database inventory');
($ret, $out, $err) = $node->psql('inventory', 'CREATE EXTENSION obx');
is($err, '', 'CREATE EXTENSION in a consumer-only database does not warn');
($ret, $out, $err) = $node->psql('inventory', "SELECT obx.enqueue('$topic', 'k1', '{\"n\": 5}')");
like($err, qr/WARNING:  no obx relay publishes the outbox of database "inventory"/,
	'its first enqueue does');
($ret, $out, $err) = $node->psql('lonely', 'CREATE EXTENSION obx');
like($err, qr/WARNING:  no obx relay publishes the outbox of database "lonely"/,
	'CREATE EXTENSION in a database nothing serves warns');

done_testing();
