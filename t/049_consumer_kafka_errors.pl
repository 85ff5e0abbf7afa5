# Consumer: Kafka trouble shows in obx.consumers, not only in the log.
#
# 1. Brokers out of reach (obx.brokers set to a closed port): the workers'
#    Kafka error appears in obx.consumers.kafka_error (and kafka_error_at)
#    of both subscriptions, one of them owned by a plain role.  With the
#    brokers back, the next message is applied and the error is gone.
# 2. Kafka settings librdkafka cannot start a consumer with (TLS with a CA
#    file that does not exist): the failure to start is shown the same
#    way; with the settings fixed, the consumer starts, applies the next
#    message and the error is gone.
# 3. obx.unsubscribe removes the group's error row.
#
# The text of a Kafka error can name brokers and hidden Kafka settings: it
# is shown to pg_monitor members only, not to a reader of the view nor to
# a consumer's owner, who see when it happened.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use ObxConsumer;
use PostgreSQL::Test::Utils;
use Test::More;

my $mock = start_mock();
my $topic = 'stock.kafka.v1';
my $consumer = 'stock-kafka';
my $owned_topic = 'stock.owned.v1';
my $owned = 'stock-owned';

my $node = consumer_node('consumer_kafka_errors', $mock,
	topics => { $topic => 2, $owned_topic => 1 });

sub q1 { $node->safe_psql('postgres', $_[0]) }

sub kafka_error
{
	return q1(qq{SELECT kafka_error FROM obx.consumers WHERE consumer_name = '$consumer'});
}

# dashboard reads the view; watcher too, as a pg_monitor member; subscriber
# owns a consumer of its own.
q1(q{
	CREATE ROLE dashboard;
	CREATE ROLE watcher;
	GRANT pg_monitor TO watcher;
	CREATE ROLE subscriber;
	GRANT USAGE ON SCHEMA obx TO dashboard, watcher, subscriber;
	GRANT SELECT ON obx.consumers TO dashboard, watcher, subscriber;
	GRANT USAGE ON SCHEMA shop TO subscriber;
	GRANT INSERT ON shop.effects TO subscriber;
	GRANT USAGE ON ALL SEQUENCES IN SCHEMA shop TO subscriber;
	GRANT EXECUTE ON FUNCTION obx.subscribe(text, text[], regprocedure, jsonb) TO subscriber;
});
subscribe($node, $consumer, [$topic],
	handler($node, 'shop.reserve', q{PERFORM shop.record(e);}));
subscribe($node, $owned, [$owned_topic], 'shop.record(obx.inbound_event)', as => 'subscriber');

############################################################################
# 1. Brokers out of reach.
############################################################################
produce($mock, $topic, sku_message(1, 'evt-1'));
ok($node->poll_query_until('postgres',
	q{SELECT count(*) = 1 FROM shop.effects WHERE event_id = 'evt-1'}),
	'the consumer applies a first message');
is(q1(qq{SELECT kafka_error IS NULL AND kafka_error_at IS NULL
	FROM obx.consumers WHERE consumer_name = '$consumer'}), 't',
	'no Kafka error while all is well');

my $brokers = q1('SHOW obx.brokers');
q1(q{ALTER SYSTEM SET obx.brokers = '127.0.0.1:1'});
$node->reload;
ok($node->poll_query_until('postgres', qq{
	SELECT count(*) = 2 FROM obx.consumers
	 WHERE consumer_name IN ('$consumer', '$owned')
	   AND kafka_error IS NOT NULL AND kafka_error_at IS NOT NULL}),
	'obx.consumers shows a Kafka error for both groups while the brokers are out of reach');
my $down = kafka_error();
like($down, qr/127\.0\.0\.1:1|ALL_BROKERS_DOWN|Connection refused/, "it says why: $down");
is($node->safe_psql('postgres', qq{
	SET ROLE dashboard;
	SELECT kafka_error IS NULL, kafka_error_at IS NOT NULL
	  FROM obx.consumers WHERE consumer_name = '$consumer'}),
	't|t', 'a reader without pg_monitor sees when, not the text');
is($node->safe_psql('postgres', qq{
	SET ROLE subscriber;
	SELECT kafka_error IS NULL, kafka_error_at IS NOT NULL
	  FROM obx.consumers WHERE consumer_name = '$owned'}),
	't|t', 'the owner of a consumer sees when, not the text either');
is($node->safe_psql('postgres', qq{
	SET ROLE watcher;
	SELECT kafka_error = '$down' FROM obx.consumers WHERE consumer_name = '$consumer'}),
	't', 'a pg_monitor member sees the text');

q1('ALTER SYSTEM RESET obx.brokers');
$node->reload;
is(q1('SHOW obx.brokers'), $brokers, 'obx.brokers is back');
produce($mock, $topic, sku_message(0, 'evt-2'));
ok($node->poll_query_until('postgres', qq{
	SELECT kafka_error IS NULL AND kafka_error_at IS NULL
	   AND (SELECT count(*) = 1 FROM shop.effects WHERE event_id = 'evt-2')
	  FROM obx.consumers WHERE consumer_name = '$consumer'}),
	'with the brokers back, the next message is applied and the error is gone');

############################################################################
# 2. Settings librdkafka cannot start a consumer with.
############################################################################
q1(q{ALTER SYSTEM SET obx.kafka_properties =
	'security.protocol=ssl;ssl.ca.location=/nonexistent/obx-test-ca.pem'});
$node->reload;
ok($node->poll_query_until('postgres', qq{
	SELECT kafka_error LIKE 'could not start the Kafka consumer: %'
	  FROM obx.consumers WHERE consumer_name = '$consumer'}),
	'a consumer that cannot start shows why in obx.consumers');
like(kafka_error(), qr/ssl\.ca\.location|obx-test-ca\.pem/,
	'the error names the setting librdkafka refused');

q1('ALTER SYSTEM RESET obx.kafka_properties');
$node->reload;
produce($mock, $topic, sku_message(1, 'evt-3'));
ok($node->poll_query_until('postgres', qq{
	SELECT kafka_error IS NULL
	   AND (SELECT count(*) = 1 FROM shop.effects WHERE event_id = 'evt-3')
	  FROM obx.consumers WHERE consumer_name = '$consumer'}),
	'with the settings fixed, the next message is applied and the error is gone');
is_deeply(effects_per_event($node), { 'evt-1' => 1, 'evt-2' => 1, 'evt-3' => 1 },
	'each event applied once');

############################################################################
# 3. unsubscribe takes the group's error row with it.
############################################################################
q1(qq{INSERT INTO obx.consumer_kafka_errors VALUES ('$consumer', 'left over', now())});
q1(qq{SELECT obx.unsubscribe('$consumer')});
is(q1(qq{SELECT count(*) FROM obx.consumer_kafka_errors WHERE consumer_name = '$consumer'}), '0',
	'obx.unsubscribe removes the consumer group\'s Kafka error');

$node->stop;
done_testing();
