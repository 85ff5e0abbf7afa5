# Reliability: database-level defaults cannot change how the workers run.
# A database owner sets, for every new session of the database,
# default_transaction_read_only = on, serializable isolation, a 300 ms
# statement_timeout and a 50 ms lock_timeout, and the server restarts.
# The application keeps writing (its transactions say READ WRITE).  The
# workers pin the settings they depend on after connecting, so three relay
# workers contending for the claim lock publish every committed event, and
# each exactly once (no claim or record step cancelled after Kafka
# acknowledged its events, which would mean a re-send), in per-key order;
# and the consumer applies each event once.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use ObxConsumer;
use PostgreSQL::Test::Utils;
use Test::More;

my $topic = 'sec.hostile.v1';
my $consumer = 'stock-hostile';
my $clients = 4;
my $per_client = 100;

my $mock = start_mock();
my $node = consumer_node('sec_hostile_defaults', $mock, topics => { $topic => 4 },
	relays => 3, conf => { 'obx.batch_size' => 20 });
subscribe($node, $consumer, [$topic], 'shop.record(obx.inbound_event)');
$node->safe_psql('postgres', q{
	ALTER DATABASE postgres SET default_transaction_read_only = on;
	ALTER DATABASE postgres SET default_transaction_isolation = 'serializable';
	ALTER DATABASE postgres SET statement_timeout = '300ms';
	ALTER DATABASE postgres SET lock_timeout = '50ms';
});
$node->restart;
wait_consumer_pids($node, 1);
is($node->safe_psql('postgres', q{SELECT current_setting('default_transaction_read_only') || ' '
		|| current_setting('transaction_isolation') || ' ' || current_setting('lock_timeout')}),
	'on serializable 50ms', 'new sessions get the hostile defaults');

# Each transaction enqueues two events of one key, in order; transactions
# on one key follow each other (an advisory lock per key stands for the
# row lock of an application), so their commit order is their enqueue
# order.
$node->pgbench(
	"--no-vacuum --client=$clients --jobs=2 --transactions=$per_client",
	0,
	[qr{processed: @{[ $clients * $per_client ]}/@{[ $clients * $per_client ]}}],
	[qr{^$}],
	'pgbench: producers that say READ WRITE',
	{
		'075_enqueue.sql' => qq{
\\set id random(1, 40)
BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE;
SET LOCAL lock_timeout = 0;
SET LOCAL statement_timeout = 0;
SELECT pg_advisory_xact_lock(:id);
SELECT obx.enqueue('$topic', 'k' || :id, jsonb_build_object('id', :id, 'i', 1));
SELECT obx.enqueue('$topic', 'k' || :id, jsonb_build_object('id', :id, 'i', 2));
COMMIT;
}
	});

# The test's own reads are not under test: on a busy machine one can take
# longer than the hostile 300 ms (the workers keep the defaults they
# started with).
$ENV{PGOPTIONS} = '-c statement_timeout=0 -c lock_timeout=0';
ok(all_published($node), 'every committed event was published');
my $ids = [ map { @$_ } values %{ committed_ids($node, "topic = '$topic'") } ];
is(scalar(@$ids), 2 * $clients * $per_client, 'the outbox holds every committed event');
my $msgs = broker_holds_exactly($mock, $node, $topic, $ids, "topic = '$topic'");
my $seen = event_ids_at_broker($msgs);
is(scalar(grep { $seen->{$_} > 1 } keys %$seen), 0, 'no event reached the broker twice');

wait_caught_up($node, $consumer, $topic, partition_ends($mock, $topic), 'every event');
my $effects = effects_per_event($node);
is(scalar(keys %$effects), scalar(@$ids), 'the consumer applied every event');
is(scalar(grep { $effects->{$_} != 1 } keys %$effects), 0, 'each one once');

done_testing();
