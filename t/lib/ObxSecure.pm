# ObxSecure.pm: obx against the SASL_SSL listener of a real Kafka cluster
# (start_kafka(secure => 1)): the client properties of its SCRAM-SHA-512
# user, one place that hands credentials to a node, and the check that a
# secret appears in no log, view or error text (the secrets go in
# obx.kafka_properties_file).
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
# This is the one place the tests put credentials into a node, the way
# docs/security.md tells operators to: the secrets (sasl.username,
# sasl.password) in obx.kafka_properties_file, a file only the server's OS
# user may read, and the rest in obx.kafka_properties.  PostgreSQL logs a
# changed setting's new value on reload, so a secret in a setting would
# reach the server log; the file's content never does.
my %secrets_file;

sub set_kafka_credentials
{
	my ($node, %props) = @_;
	my %secret = map { $_ => delete $props{$_} } grep { /^sasl\.(username|password)$/ } keys %props;
	my $value = join(';', map { "$_=$props{$_}" } sort keys %props);
	die 'a property value holds a quote or a semicolon' if $value =~ /'/ || grep { /;/ } values %props;
	my $file = $secrets_file{ $node->name } //=
	  File::Spec->rel2abs(PostgreSQL::Test::Utils::tempdir('secrets') . '/obx-kafka.properties');
	open(my $fh, '>', "$file.new") or die "cannot write $file.new: $!";
	chmod(0600, "$file.new") or die "cannot chmod $file.new: $!";
	print $fh "# the test's Kafka credentials\n";
	print $fh "$_ = $secret{$_}\n" for sort keys %secret;
	close($fh) or die "cannot write $file.new: $!";
	rename("$file.new", $file) or die "cannot rename to $file: $!";

	my $relays = $node->safe_psql('postgres', 'SHOW obx.workers');
	my $consumers = $node->safe_psql('postgres', 'SHOW obx.consumer_workers');
	my $offset = -s $node->logfile;
	$node->safe_psql('postgres',
		"ALTER SYSTEM SET obx.kafka_properties = '$value';\n"
		  . "ALTER SYSTEM SET obx.kafka_properties_file = '$file';\nSELECT pg_reload_conf();");
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

# secret_nowhere($node, $secret, $what): check that $secret appears in no
# obx view or table an operator reads (workers, status, quarantine, the
# outbox's errors, consumers and their dead letters) and in no line of the
# server log.
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
	my @leaks = grep { /\Q$secret\E/ } split /\n/, slurp_file($node->logfile);
	is(scalar(@leaks), 0, "$what: in no line of the server log")
	  or diag("leaking lines:\n" . join("\n", map { s/\Q$secret\E/<the secret>/gr } @leaks));
	return;
}

1;
