# Security: a subscriber cannot reach beyond consumer tuning through a
# subscription's Kafka options (issue 17, item 1; docs/security.md).
#
# As a subscriber with the documented grants (USAGE on obx, EXECUTE on
# obx.subscribe): the Kerberos kinit command (a shell command run by
# librdkafka as the server's OS user), plugin.library.paths (code loaded
# into the server) and metadata.broker.list (an alias of
# bootstrap.servers, which would send obx.kafka_properties' credentials to
# the subscriber's host) are refused by obx.subscribe, naming the
# property; so is a queue size over librdkafka's default (every consumer
# worker would pre-fetch 2 GB for the subscription).  Then the same
# options written straight into obx.subscriptions (as only a superuser
# can) are refused again by the consumer worker: it reports each such
# subscription and skips it, while a good subscription created in the
# same transaction is consumed.  No file appears, the
# test's listener receives no connection, and the worker never restarts.
use strict;
use warnings;

use File::Spec;
use FindBin;
use lib "$FindBin::RealBin/lib";
use IO::Select;
use IO::Socket::INET;
use ObxTest;
use ObxConsumer;
use PostgreSQL::Test::Utils;
use Test::More;

my $mock = start_mock();
my $topic = 'sec.options.v1';

# The attacker's "broker": a listener that must never see a connection.
my $listener = IO::Socket::INET->new(Listen => 5, LocalAddr => '127.0.0.1',
	LocalPort => 0, Proto => 'tcp', ReuseAddr => 1)
  or die "cannot listen: $!";
my $port = $listener->sockport;

# Absolute: a kinit command would run in the server's data directory.
my $dir = File::Spec->rel2abs(PostgreSQL::Test::Utils::tempdir('sec_options'));
my $owned = "$dir/owned";

my $node = consumer_node('sec_options', $mock, topics => { $topic => 1 },
	conf => { 'obx.kafka_properties' => "'sasl.username=obx;sasl.password=kafka-secret-80'" });
my ($worker) = @{ consumer_pids($node) };

sub q1 { $node->safe_psql('postgres', $_[0]) }

q1(q{
	CREATE ROLE bob;
	GRANT USAGE ON SCHEMA obx, shop TO bob;
	GRANT INSERT ON shop.effects TO bob;
	GRANT USAGE ON ALL SEQUENCES IN SCHEMA shop TO bob;
	GRANT EXECUTE ON FUNCTION obx.subscribe(text, text[], regprocedure, jsonb) TO bob;
});

# 1. obx.subscribe refuses them, naming the property.
my %attacks = (
	'kinit' => qq{{"security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "GSSAPI",
		"sasl.kerberos.kinit.cmd": "touch $owned"}},
	'plugin' => qq{{"plugin.library.paths": "$dir/evil.so"}},
	'alias' => qq{{"metadata.broker.list": "127.0.0.1:$port"}},
	'memory' => qq{{"queued.max.messages.kbytes": "2097151"}});
my %property = (kinit => 'sasl.kerberos.kinit.cmd', plugin => 'plugin.library.paths',
	alias => 'metadata.broker.list', memory => 'queued.max.messages.kbytes');
my %refusal = map { $_ => qq{Kafka property "$property{$_}" cannot be set by an obx subscription} }
  qw(kinit plugin alias);
$refusal{memory} = qq{Kafka property "queued.max.messages.kbytes" of an obx subscription may be at most 65536, not 2097151};
for my $name (sort keys %attacks)
{
	my ($rc, $out, $err) = $node->psql('postgres', qq{
		SET ROLE bob;
		SELECT obx.subscribe('evil-$name', ARRAY['$topic'],
			'shop.record(obx.inbound_event)', '{"kafka": $attacks{$name}}')});
	isnt($rc, 0, "obx.subscribe refuses the $name option");
	like($err, qr/\Q$refusal{$name}\E/, "the error names $property{$name}");
	like($err, qr/obx\.kafka_properties/, 'and says where such properties belong');
}
is(q1('SELECT count(*) FROM obx.subscriptions'), '0', 'no subscription was made');

# 2. Written directly: the worker skips them and serves the good one.
q1(qq{
	BEGIN;
	INSERT INTO obx.subscriptions (consumer_name, topics, handler, options, owner)
	SELECT 'evil-' || a.name, ARRAY['$topic'], 'shop.record(obx.inbound_event)',
		   jsonb_build_object('kafka', a.kafka::jsonb), 'bob'
	  FROM (VALUES ('kinit', '$attacks{kinit}'), ('plugin', '$attacks{plugin}'),
				   ('alias', '$attacks{alias}'), ('memory', '$attacks{memory}')) AS a(name, kafka);
	SET LOCAL ROLE bob;
	SELECT obx.subscribe('good', ARRAY['$topic'], 'shop.record(obx.inbound_event)',
		'{"kafka": {"session.timeout.ms": "6000", "fetch.wait.max.ms": "100"}}');
	COMMIT;
});
produce($mock, $topic, map { { partition => 0, key => "k$_",
	headers => [ event_id => "evt-$_" ], payload => qq({"n": $_}) } } 1 .. 3);
ok($node->poll_query_until('postgres',
	"SELECT count(DISTINCT event_id) = 3 FROM shop.effects"),
	'the good subscription, made with the bad rows, consumed every message');
is(q1("SELECT count(*) FROM shop.effects WHERE applied_by <> 'bob'"), '0',
	'as its owner');
is(q1(q{SELECT count(*) FROM obx.processed_events WHERE consumer_name LIKE 'evil-%'}), '0',
	'no bad subscription processed anything');

for my $name (sort keys %attacks)
{
	ok($node->wait_for_log(
		qr/obx subscription "evil-$name" is not consumed: \Q$refusal{$name}\E/),
		"the worker reports evil-$name and skips it");
	is(q1("SELECT problem FROM obx.consumers WHERE consumer_name = 'evil-$name'"),
		$refusal{$name},
		"obx.consumers shows why evil-$name is skipped");
}
ok(!-e $owned, 'the kinit command never ran: no file appeared');
ok(!IO::Select->new($listener)->can_read(0),
	'the listener named by metadata.broker.list received no connection');
is_deeply(consumer_pids($node), [$worker], 'the consumer worker never restarted');
unlike(slurp_file($node->logfile), qr/kafka-secret-80/,
	'the credentials of obx.kafka_properties are not in the log');

done_testing();
