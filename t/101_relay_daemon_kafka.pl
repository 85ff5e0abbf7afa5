# obx-relay (src/daemon/) against a real three-node Apache Kafka cluster
# (tools/kafka-cluster, KRaft), reached only through its SASL_SSL listener
# (TLS with the cluster's own CA, SCRAM-SHA-512), on a PostgreSQL that
# never loads obx's library (the SQL-only install), as a role that holds
# only obx_worker's grants.
#
# Proves:
# - --check says what is wrong with the brokers: a wrong SASL password
#   fails it; the right one passes;
# - leader failover under load: the broker that leads most partitions of a
#   topic (6 partitions, replication factor 3, min.insync.replicas 2) is
#   killed (-9) while the application commits one event per transaction;
#   events keep flowing through the two brokers left, and after it is back
#   the broker's set of event ids is the committed set, per key in enqueue
#   order, and every duplicate is a copy of the same event;
# - no password (the database's, the right or the wrong SASL one) shows
#   in what --check prints or in the daemon's log;
# - SIGTERM stops the daemon with exit status 0.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxDaemon;
use ObxKafkaChecks;
use ObxSecure;
use ObxTest;
use IPC::Run;
use PostgreSQL::Test::Utils;
use Test::More;

my $parts = 6;
my $nkeys = 40;
my $topic = 'orders.daemon.failover.v1';

my $kafka = start_kafka(nodes => 3, secure => 1);
my $dir = PostgreSQL::Test::Utils::tempdir('relay');
my $node = sql_only_node('daemon_kafka');

# The daemon's settings: the SASL_SSL listener only, its properties as
# kafka.* lines of the settings file.
sub secure_config
{
	my (%override) = @_;
	my %props = sasl_ssl_properties($kafka, %override);
	return relay_config($node, { bootstrap => $kafka->{secure_bootstrap} }, $dir,
		batch_size => 100, map { ("kafka.$_" => $props{$_}) } keys %props);
}

#
# --check
#
my ($status, $out) = relay_check(secure_config('sasl.password' => 'not-the-password'));
my $printed = $out;
isnt($status, 0, '--check fails with a wrong SASL password');
like($out, qr/FAIL.*broker/i, '--check says the brokers are what fails') or diag($out);
my $config = secure_config();
($status, $out) = relay_check($config);
$printed .= $out;
is($status, 0, '--check passes through SASL_SSL with the right credentials') or diag($out);
like($out, qr/brokers .* answer/, '--check reached the brokers');

#
# Leader failover under load.
#
kafka_cluster($kafka, 'topic', $topic, $parts, 'min.insync.replicas=2');
wait_until(sub { topic_writable($kafka, $topic, $parts, 3) },
	"every partition of $topic led and in sync");
my $relay = start_relay($config);

create_enqueue_load($node);
my $load_err = '';
my $load = IPC::Run::start(
	[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('postgres'),
	  '-c', "CALL enqueue_load('$topic', 100000, $nkeys)" ],
	'<', \undef, '>', \my $load_out, '2>', \$load_err);

# more_published($n, $what): wait until $n more events are published than now.
sub more_published
{
	my ($n, $what) = @_;
	my $now = $node->safe_psql('postgres',
		"SELECT count(*) FROM obx.outbox_events WHERE topic = '$topic' AND published_at IS NOT NULL");
	ok($node->poll_query_until('postgres', qq{
		SELECT count(*) >= $now + $n FROM obx.outbox_events
		 WHERE topic = '$topic' AND published_at IS NOT NULL}),
		"events flow $what");
}

sub leaders
{
	return { map { split / / } split /\n/, kafka_cluster($kafka, 'leaders', $topic) };
}

more_published(200, 'before the kill');
my %led;
my $leaders = leaders();
$led{$_}++ for values %$leaders;
my ($victim) = sort { $led{$b} <=> $led{$a} || $a <=> $b } keys %led;
kafka_cluster($kafka, 'kill', $victim);
my $kill_at = $node->safe_psql('postgres', 'SELECT clock_timestamp()');
note "broker $victim, leader of $led{$victim} of $parts partitions, killed (-9)";
wait_until(sub {
	my $l = leaders();
	scalar(keys %$l) == $parts && !grep { $_ == $victim || $_ < 1 } values %$l },
	"new leaders for the partitions of broker $victim");
more_published(300, 'with the killed broker down');
my $moved = join(',', grep { $leaders->{$_} == $victim } keys %$leaders);
ok($node->poll_query_until('postgres', qq{
	SELECT count(*) > 0 FROM obx.outbox_events
	 WHERE topic = '$topic' AND published_at > '$kill_at' AND kafka_partition IN ($moved)}),
	"the daemon published on the partitions broker $victim led, after the kill");

kafka_cluster($kafka, 'restart', $victim);
kafka_cluster($kafka, 'wait', 3);
wait_until(sub { topic_writable($kafka, $topic, $parts, 3) },
	"broker $victim back in sync on every partition");
more_published(200, 'after the killed broker rejoined');
$node->safe_psql('postgres', 'UPDATE load_ctl SET stop = true');
$load->finish;
is($load->result(0), 0, 'the load ran without error') or diag($load_err);

ok(all_published($node), 'every committed event is recorded as published');
my @ids = split /\n/, $node->safe_psql('postgres',
	"SELECT id FROM obx.outbox_events WHERE topic = '$topic'");
my $msgs = broker_holds_exactly($kafka, $node, $topic, \@ids, "topic = '$topic'");
my $dups = copies_agree($msgs, $topic);
note sprintf('%d events committed, %d messages at the broker, %d duplicates',
	scalar(@ids), scalar(@$msgs), $dups);
is($node->safe_psql('postgres', q{SELECT string_agg(DISTINCT usename, ',') FROM pg_stat_activity
	WHERE application_name = 'obx-relay'}), 'relay', 'the daemon ran as the role relay');

#
# SIGTERM.
#
is(stop_relay($relay), 0, 'SIGTERM stops the daemon with exit status 0');
$printed .= relay_log($relay);
my @leaked = grep { index($printed, $_) >= 0 } ('relay-secret', $kafka->{password}, 'not-the-password');
is(scalar(@leaked), 0, 'no password in what --check printed or in the daemon\'s log')
  or diag('found: ' . join(', ', @leaked));

done_testing();
