# ObxDaemon: obx without its library in the database: a node with the
# SQL-only install (obx-sql-only.sql) and obx-relay, the relay as a daemon
# (src/daemon/), for the daemon-mode tests (t/10x).
package ObxDaemon;

use strict;
use warnings;

use Exporter 'import';
use IPC::Run;
use ObxTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

our @EXPORT = qw(sql_only_node relay_config start_relay stop_relay relay_log relay_check);

my @relays;

# sql_only_node($name): a node that has never loaded obx's library, with
# obx installed into its database "postgres" by psql -f obx-sql-only.sql,
# run by that database's owner, shop_owner, who is not a superuser.  It
# listens on 127.0.0.1 and asks every TCP connection for a SCRAM password.
# The relay's role "relay" (password "relay-secret") is a member of
# obx_worker and holds nothing else.
sub sql_only_node
{
	my ($name, %conf) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init;
	my %settings = (
		listen_addresses => "'127.0.0.1'",
		password_encryption => "'scram-sha-256'",
		log_min_messages => 'warning',
		%conf);
	$node->append_conf('postgresql.conf',
		join('', map { "$_ = $settings{$_}\n" } sort keys %settings));
	# The first line that matches wins: TCP needs a SCRAM password.
	my $hba = $node->data_dir . '/pg_hba.conf';
	my $rules = slurp_file($hba);
	open(my $fh, '>', $hba) or die "cannot write $hba: $!";
	print $fh "host all all 127.0.0.1/32 scram-sha-256\n", $rules;
	close $fh;
	$node->start;

	$node->safe_psql('postgres', q{
		CREATE ROLE shop_owner LOGIN CREATEROLE;
		ALTER DATABASE postgres OWNER TO shop_owner;});
	my $file = $ENV{OBX_SQL_ONLY} || 'obx-sql-only.sql';
	$node->command_ok(
		[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-f', $file,
		  '-d', $node->connstr('postgres') . ' user=shop_owner' ],
		"$name: obx-sql-only.sql installs as the database owner, not a superuser");
	$node->safe_psql('postgres', q{
		CREATE ROLE relay LOGIN PASSWORD 'relay-secret' IN ROLE obx_worker;});
	return $node;
}

# relay_config($node, $broker, $dir, %settings): write an obx-relay settings
# file in $dir for $node's database "postgres" (as role relay, over TCP
# with its SCRAM password) and the broker, readable by its owner only;
# returns its path.  Settings
# user and password name another role; path, the file to write.
sub relay_config
{
	my ($node, $broker, $dir, %settings) = @_;
	my $path = delete $settings{path};
	my $user = delete $settings{user} // 'relay';
	my $password = delete $settings{password} // 'relay-secret';
	my %all = (
		brokers => $broker->{bootstrap},
		poll_interval => 20,
		lease_timeout => 5,
		delivery_timeout => 3000,
		backoff_min => 50,
		backoff_max => 1000,
		%settings);
	$path //= "$dir/relay-" . scalar(@relays) . '-' . int(rand(1e6)) . '.conf';
	open(my $fh, '>', $path) or die "cannot write $path: $!";
	print $fh "# obx-relay settings of a test\n";
	printf $fh "database = host=127.0.0.1 port=%d dbname=postgres user=%s password=%s sslmode=disable\n",
	  $node->port, $user, $password;
	print $fh "$_ = $all{$_}\n" for sort keys %all;
	close $fh;
	# It holds the role's password: obx-relay refuses it open to others.
	chmod(0600, $path) or die "cannot chmod $path: $!";
	return $path;
}

# start_relay($config): start obx-relay with the settings file; returns a
# hash with its handle, pid and log file.
sub start_relay
{
	my ($config) = @_;
	my $bin = $ENV{OBX_RELAY} || 'obx-relay';
	my $log = "$config.log";
	my $h = IPC::Run::start([ $bin, '--config', $config ], '<', \undef, '>>', $log, '2>>', $log);
	my $relay = { handle => $h, pid => $h->{KIDS}[0]{PID}, log => $log, config => $config };
	push @relays, $relay;
	return $relay;
}

# stop_relay($relay, $signal): send the signal (default TERM) and wait for
# the daemon to exit; returns its exit status (undef after a KILL).
sub stop_relay
{
	my ($relay, $signal) = @_;
	$signal //= 'TERM';
	kill($signal, $relay->{pid});
	eval { $relay->{handle}->finish; };
	my $status = $relay->{handle}->result(0);
	$relay->{stopped} = 1;
	return $status;
}

# relay_log($relay): what the daemon wrote so far.
sub relay_log
{
	my ($relay) = @_;
	return -f $relay->{log} ? slurp_file($relay->{log}) : '';
}

# relay_check($config): run obx-relay --check; returns (exit status, output).
sub relay_check
{
	my ($config) = @_;
	my $bin = $ENV{OBX_RELAY} || 'obx-relay';
	my ($out, $err) = ('', '');
	IPC::Run::run([ $bin, '--config', $config, '--check' ], '<', \undef, '>', \$out, '2>', \$err,
		IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
	return ($? >> 8, $out . $err);
}

END
{
	for my $relay (@relays)
	{
		next if $relay->{stopped};
		kill('KILL', $relay->{pid});
		eval { $relay->{handle}->finish; };
	}
}

1;
