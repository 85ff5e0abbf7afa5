# Security: Kafka secrets live in obx.kafka_properties_file, never in a
# log, a view or an error (issue 17, item 9; docs/security.md).
#
# obx.brokers points at a dead port, and the properties file names the
# real (stand-in) brokers and holds a password: events reach Kafka, and a
# subscription consumes them, only if the relay and the consumer apply the
# file.  The file is refused while group or world can read it, with an
# error that says so; that error is in obx.workers for pg_monitor members
# and superusers, NULL for other readers of the view.  A file with an
# unknown property, then with an invalid value, gives errors naming the
# line and the property, never the value.  None of the values written in
# the file ever appears in the server log or in obx.workers.
use strict;
use warnings;

use File::Spec;
use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use ObxConsumer;
use PostgreSQL::Test::Utils;
use Test::More;

my $mock = start_mock();
my $topic = 'sec.file.v1';
create_topic($mock, $topic, 1);

my $dir = File::Spec->rel2abs(PostgreSQL::Test::Utils::tempdir('sec_file'));
my $file = "$dir/kafka.properties";
my @secrets = map { "obx-file-secret-$_-$$" } 1 .. 3;

sub write_properties
{
	my ($mode, $text) = @_;
	open(my $fh, '>', "$file.tmp") or die "cannot write $file.tmp: $!";
	print $fh $text;
	close $fh;
	chmod($mode, "$file.tmp") or die "chmod: $!";
	rename("$file.tmp", $file) or die "rename: $!";
	return;
}

write_properties(0644, <<"EOF");
# Kafka client secrets of obx
bootstrap.servers = $mock->{bootstrap}
sasl.username=obx
sasl.password=$secrets[0]
EOF

my $node = obx_node('sec_file', $mock,
	'obx.workers' => 1,
	'obx.consumer_workers' => 1,
	'obx.brokers' => "'127.0.0.1:1'",
	'obx.kafka_properties_file' => "'$file'");

sub q1 { $node->safe_psql('postgres', $_[0]) }

create_effects($node);
subscribe($node, 'file-app', [$topic], 'shop.record(obx.inbound_event)');
q1(q{
	CREATE ROLE peek;
	CREATE ROLE watch IN ROLE pg_monitor;
	GRANT USAGE ON SCHEMA obx TO peek, watch;
	GRANT SELECT ON obx.workers TO peek, watch;
});

# 1. Readable by others: refused, and the error says why.
my $offset = $node->wait_for_log(
	qr/obx relay 0 could not create a Kafka producer: obx\.kafka_properties_file "\Q$file\E" has group or world access/);
ok($offset, 'a properties file that group or world can read is refused');
ok($node->poll_query_until('postgres',
	q{SELECT last_error LIKE '%has group or world access%' FROM obx.workers}),
	'obx.workers shows the error to a superuser');
is($node->safe_psql('postgres', 'SET ROLE watch; SELECT last_error LIKE \'%group or world access%\' FROM obx.workers'),
	't', 'and to a pg_monitor member');
is($node->safe_psql('postgres', 'SET ROLE peek; SELECT coalesce(last_error, \'NULL\') FROM obx.workers'),
	'NULL', 'but not to another reader of obx.workers');
my ($rc, $out, $err) = $node->psql('postgres', 'SET ROLE peek; SHOW obx.kafka_properties_file');
# Each major words the refusal its own way; every wording names the role.
like($err, qr/ERROR: .*(?:superuser|permission denied).*pg_read_all_settings/s,
	'the setting itself is hidden from non-superusers');

# 2. Made private: the relay and the consumer reach Kafka through it.
my $id = q1(qq{SELECT obx.enqueue('$topic', 'k1', '{"n": 1}')});
chmod(0600, $file) or die "chmod: $!";
q1('SELECT pg_reload_conf()');
ok(all_published($node), 'with the file private, the relay publishes through the brokers it names');
ok($node->poll_query_until('postgres', "SELECT count(*) = 1 FROM shop.effects WHERE event_id = '$id'"),
	'and the consumer consumes through them');

# 3. An unknown property: its line and name, not its value.
$offset = -s $node->logfile;
write_properties(0600, <<"EOF");
bootstrap.servers=$mock->{bootstrap}
# a typo
no.such.property=$secrets[1]
EOF
q1('SELECT pg_reload_conf()');
ok($node->wait_for_log(
	qr/could not create a Kafka producer: obx\.kafka_properties_file line 3: librdkafka has no property "no\.such\.property"/,
	$offset), 'an unknown property is reported with its line and name');

# 4. An invalid value: its line and name, not the value.
$offset = -s $node->logfile;
write_properties(0600, "bootstrap.servers=$mock->{bootstrap}\nacks=$secrets[2]\n");
q1('SELECT pg_reload_conf()');
ok($node->wait_for_log(
	qr/could not create a Kafka producer: obx\.kafka_properties_file line 2: invalid value for "acks" \(not shown\)/,
	$offset), 'an invalid value is reported with its line and name, not the value');
ok($node->poll_query_until('postgres', q{SELECT last_error LIKE '%line 2%' FROM obx.workers}),
	'obx.workers has that error too');

# No value of the file anywhere.
my $log = slurp_file($node->logfile);
my $views = q1(q{SELECT concat_ws('|', (SELECT string_agg(coalesce(last_error, ''), '|') FROM obx.workers),
	(SELECT string_agg(coalesce(last_error, ''), '|') FROM obx.consumer_status),
	(SELECT string_agg(setting, '|') FROM pg_settings WHERE name LIKE 'obx.%'))});
for my $i (0 .. $#secrets)
{
	unlike($log, qr/\Q$secrets[$i]\E/, "secret " . ($i + 1) . " is not in the server log");
	unlike($views, qr/\Q$secrets[$i]\E/, "secret " . ($i + 1) . " is not in obx.workers, consumer_status or pg_settings");
}

done_testing();
