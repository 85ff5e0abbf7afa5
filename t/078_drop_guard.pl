# Nothing lost by mistake: DROP EXTENSION obx deletes the outbox, the
# dedupe history and the dead letters, so it is refused while events wait
# for Kafka or dead letters wait for a replay, and the events are still
# there afterwards.  obx.drop_unpublished (superusers only) lets it through;
# with nothing waiting it needs no override.  Then the roles go as
# docs/operations.md ("Removing obx") says, also after a subscriber granted
# obx_handler_caller what docs/consumers.md tells them to.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $topic = 'orders.drop.v1';
my $mock = start_mock();

# No relay: the events stay unpublished.
my $idle = obx_node('drop_pending', $mock, 'obx.workers' => 0, 'obx.consumer_workers' => 0);
my $ids = $idle->safe_psql('postgres',
	"SELECT obx.enqueue('$topic', 'k' || i, jsonb_build_object('n', i)) FROM generate_series(1, 3) i");
for my $drop ('DROP EXTENSION obx', 'DROP EXTENSION obx CASCADE', 'DROP EXTENSION IF EXISTS pg_trgm, obx')
{
	my ($ret, $out, $err) = $idle->psql('postgres', $drop);
	like($err, qr/ERROR:  cannot drop extension obx: 3 events are not published and 0 dead letters are not replayed/,
		"$drop is refused while 3 events wait");
}
is($idle->safe_psql('postgres', 'SELECT count(*) FROM obx.outbox_events WHERE published_at IS NULL'),
	'3', 'and the events are still in the outbox');

$idle->safe_psql('postgres', 'CREATE ROLE shop_owner LOGIN');
my ($ret, $out, $err) = $idle->psql('postgres', 'SET ROLE shop_owner; SET obx.drop_unpublished = on');
like($err, qr/permission denied to set parameter "obx.drop_unpublished"/,
	'only a superuser may set the override');
($ret, $out, $err) = $idle->psql('postgres', 'SET obx.drop_unpublished = on; DROP EXTENSION obx');
is($ret, 0, 'with obx.drop_unpublished on, the drop goes through');
is($idle->safe_psql('postgres', "SELECT count(*) FROM pg_extension WHERE extname = 'obx'"), '0',
	'obx is gone');

# A relay publishes everything; a dead letter not replayed still holds the
# drop back, and once replayed nothing does.
my $node = obx_node('drop_published', $mock, 'obx.workers' => 1, 'obx.consumer_workers' => 0);
$node->safe_psql('postgres',
	"SELECT obx.enqueue('$topic', 'k' || i, jsonb_build_object('n', i)) FROM generate_series(1, 3) i");
ok(all_published($node), 'the relay published every event');
$node->safe_psql('postgres', q{
	INSERT INTO obx.dead_letters (consumer_name, topic, kafka_partition, kafka_offset,
								  error_class, error_message)
	VALUES ('stock', 'orders.drop.v1', 0, 7, 'handler', 'out of stock')});
($ret, $out, $err) = $node->psql('postgres', 'DROP EXTENSION obx');
like($err, qr/ERROR:  cannot drop extension obx: 0 events are not published and 1 dead letters are not replayed/,
	'a dead letter not replayed holds the drop back');
$node->safe_psql('postgres', 'UPDATE obx.dead_letters SET replayed_at = now()');
$node->safe_psql('postgres', q{
	CREATE SCHEMA inventory;
	CREATE FUNCTION inventory.reserve() RETURNS void LANGUAGE sql AS 'SELECT';
	GRANT USAGE ON SCHEMA inventory TO obx_handler_caller;
	GRANT EXECUTE ON FUNCTION inventory.reserve() TO obx_handler_caller;});
($ret, $out, $err) = $node->psql('postgres', 'DROP EXTENSION obx');
is($ret, 0, 'with nothing waiting, DROP EXTENSION obx needs no override');
($ret, $out, $err) = $node->psql('postgres', 'DROP SCHEMA obx');
is($ret, 0, 'the schema obx is left empty, and goes') or diag($err);
($ret, $out, $err) = $node->psql('postgres', 'DROP ROLE obx_worker, obx_handler_caller');
like($err, qr/role "obx_handler_caller" cannot be dropped because some objects depend on it/,
	'DROP ROLE alone is refused while a subscriber\'s grant names obx_handler_caller');
($ret, $out, $err) = $node->psql('postgres',
	'DROP OWNED BY obx_worker, obx_handler_caller; DROP ROLE obx_worker, obx_handler_caller');
is($ret, 0, 'DROP OWNED BY, then DROP ROLE, removes the roles') or diag($err);
is($node->safe_psql('postgres', q{SELECT count(*) FROM pg_roles
	WHERE rolname IN ('obx_worker', 'obx_handler_caller')}), '0', 'no obx role is left');
is($node->safe_psql('postgres', 'SELECT count(*) FROM pg_proc WHERE proname = \'reserve\''), '1',
	"the subscriber's function stays");

done_testing();
