# ObxSecure.pm: obx against the SASL_SSL listener of a real Kafka cluster
# (start_kafka(secure => 1)): the client properties of its SCRAM-SHA-512
# user, one place that hands credentials to a node, and the check that a
# secret appears in no log, view or error text.
package ObxSecure;

use strict;
use warnings;

use Exporter 'import';
use File::Spec;
use PostgreSQL::Test::Utils;
use Test::More;
use ObxTest;

our @EXPORT = qw(sasl_ssl_properties set_kafka_credentials secret_nowhere);

# sasl_ssl_properties($kafka, %override): the librdkafka properties of the
# cluster's "obx" user on its SASL_SSL listener, as a hash; %override
# replaces or adds some (sasl.password => 'wrong').
sub sasl_ssl_properties
{
	my ($kafka, %override) = @_;
	return (
		'security.protocol' => 'SASL_SSL',
		'sasl.mechanisms' => 'SCRAM-SHA-512',
		'sasl.username' => $kafka->{user},
		'sasl.password' => $kafka->{password},
		'ssl.ca.location' => File::Spec->rel2abs($kafka->{ca}),
		%override);
}

# set_kafka_credentials($node, %props): give the node's relay and consumer
# workers these librdkafka properties, then wait until each of them has
# taken them: every relay worker has logged that it rebuilds its producer
# (it claims nothing more with the old one) and every consumer worker that
# it restarts its consumers.
#
# This is the one place the tests put credentials into a node.  Today it
# is obx.kafka_properties through ALTER SYSTEM and a reload; on that
# reload PostgreSQL itself logs 'parameter "obx.kafka_properties" changed
# to "..."', password included (secret_nowhere excludes that one line).
# obx.kafka_properties_file (a server-only file, branch sec-sql) removes
# the leak: this sub will write that file instead.
sub set_kafka_credentials
{
	my ($node, %props) = @_;
	my $value = join(';', map { "$_=$props{$_}" } sort keys %props);
	die 'a property value holds a quote or a semicolon' if $value =~ /'/ || grep { /;/ } values %props;
	my $relays = $node->safe_psql('postgres', 'SHOW obx.workers');
	my $consumers = $node->safe_psql('postgres', 'SHOW obx.consumer_workers');
	my $offset = -s $node->logfile;
	# The test harness logs every statement (log_statement = all); this
	# session does not, as a server holding secrets should not.
	$node->safe_psql('postgres',
		"SET log_statement = 'none';\n"
		  . "ALTER SYSTEM SET obx.kafka_properties = '$value';\nSELECT pg_reload_conf();");
	wait_until(sub {
		my $log = slurp_file($node->logfile, $offset);
		my %r = map { $_ => 1 }
		  ($log =~ /obx relay (\d+): Kafka settings changed, rebuilding the producer/g);
		my %c = map { $_ => 1 }
		  ($log =~ /obx consumer (\d+): Kafka settings changed, restarting its consumers/g);
		keys(%r) >= $relays && keys(%c) >= $consumers;
	}, 'every relay and consumer worker to take the new Kafka properties');
	return;
}

# The one line of the server log allowed to hold a credential: PostgreSQL's
# own report of a changed setting on reload (see set_kafka_credentials).
# The integrator tightens this to no exception once the credentials come
# from obx.kafka_properties_file.
my $known_leak = qr/LOG:  parameter "obx\.kafka_properties" changed to /;

# secret_nowhere($node, $secret, $what): check that $secret appears in no
# obx view or table an operator reads (workers, status, quarantine, the
# outbox's errors, consumers and their dead letters) and in no line of the
# server log but PostgreSQL's known one.
sub secret_nowhere
{
	my ($node, $secret, $what) = @_;
	my $views = $node->safe_psql('postgres', q{
		SELECT string_agg(t, E'\n') FROM (
			SELECT w::text AS t FROM obx.workers w
			UNION ALL SELECT s::text FROM obx.status s
			UNION ALL SELECT q::text FROM obx.quarantine q
			UNION ALL SELECT coalesce(last_error, '') FROM obx.outbox_events
			UNION ALL SELECT c::text FROM obx.consumers c
			UNION ALL SELECT c::text FROM obx.consumer_status c
			UNION ALL SELECT d::text FROM obx.dead_letters d) v});
	unlike($views, qr/\Q$secret\E/,
		"$what: not in obx.workers, obx.status, obx.quarantine, outbox errors, consumer views, dead letters");
	my @lines = grep { /\Q$secret\E/ } split /\n/, slurp_file($node->logfile);
	my @leaks = grep { !/$known_leak/ } @lines;
	is(scalar(@leaks), 0,
		"$what: in no line of the server log (PostgreSQL's own reload line excepted: "
		  . (scalar(@lines) - scalar(@leaks)) . ' such line(s))')
	  or diag("leaking lines:\n" . join("\n", map { s/\Q$secret\E/<the secret>/gr } @leaks));
	return;
}

1;
