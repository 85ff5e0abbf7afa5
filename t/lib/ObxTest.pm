# ObxTest.pm: shared pieces of the end-to-end tests.
#
# Starts the project's Kafka stand-in (tools/obx-kafka-mock), starts
# PostgreSQL nodes with obx preloaded and pointed at it, sends fault
# injection commands, and reads back what reached the broker with kcat, an
# independent Kafka client.  Every wait here is on a condition, with the
# harness timeout ($PostgreSQL::Test::Utils::timeout_default) as the limit.
package ObxTest;

use strict;
use warnings;

use Exporter 'import';
use IO::Socket::INET;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);

our @EXPORT = qw(start_mock mock_cmd start_kafka kafka_cluster create_topic obx_node obx_node_at obx_primary relay_ready read_topic wait_for_broker
  wait_until wait_for_crash_restart all_published event_ids_at_broker first_occurrences copies_of_key
  enqueue_with_rollbacks
  committed_ids worker_pids relay_pids broker_holds_exactly);

my @mocks;
my @clusters;    # real Kafka clusters made by start_kafka
my @nodes;    # made by obx_node: stopped before the stand-ins at the end

# start_mock(%opts): start the Kafka stand-in; returns a hash with
# bootstrap, control (host:port) and pid.  Options: brokers, partitions.
sub start_mock
{
	my (%opts) = @_;
	my $bin = $ENV{OBX_MOCK} || 'tools/obx-kafka-mock';
	my $dir = PostgreSQL::Test::Utils::tempdir('mock');
	my $state = "$dir/state";
	my @cmd = ($bin, '--state-file', $state);
	push @cmd, '--brokers', $opts{brokers} if $opts{brokers};
	push @cmd, '--partitions', $opts{partitions} if $opts{partitions};

	my ($in, $out, $err) = ('', '', '');
	my $h = IPC::Run::start(\@cmd, \$in, '>', "$dir/stdout", '2>', "$dir/stderr");
	wait_until(sub { -f $state }, 'Kafka stand-in to start');

	my %mock = (handle => $h, dir => $dir);
	open(my $fh, '<', $state) or die "cannot read $state: $!";
	while (my $line = <$fh>)
	{
		chomp $line;
		my ($k, $v) = split /=/, $line, 2;
		$mock{$k} = $v;
	}
	close $fh;
	die "stand-in gave no bootstrap list" unless $mock{bootstrap};
	push @mocks, \%mock;
	return \%mock;
}

# mock_cmd($mock, "down all"): one fault-injection command; dies unless the
# stand-in answers ok.  Returns the reply line.
sub mock_cmd
{
	my ($mock, $cmd) = @_;
	my $sock = IO::Socket::INET->new(PeerAddr => $mock->{control}, Timeout => 10)
	  or die "cannot reach the stand-in at $mock->{control}: $!";
	print $sock "$cmd\n";
	my $reply = <$sock>;
	close $sock;
	die "stand-in refused '$cmd': " . ($reply // 'no reply')
	  unless defined $reply && $reply =~ /^ok/;
	chomp $reply;
	return $reply;
}

# start_kafka(%opts): start a real Apache Kafka cluster on loopback
# (tools/kafka-cluster, KRaft); returns a hash with dir, bootstrap and the
# other values of its cluster.env (nodes, node<ID>; with secure => 1 also
# secure_bootstrap, ca, user, password, admin_password).  It serves
# read_topic, obx_node and the other helpers as a stand-in does.  Options:
# nodes (default 3), secure.  Stopped at the end of the test, even when the
# test fails.
sub start_kafka
{
	my (%opts) = @_;
	my $dir = PostgreSQL::Test::Utils::tempdir('kafka') . '/cluster';
	my %k = (dir => $dir);
	push @clusters, \%k;
	my @args = ('start', '--nodes', $opts{nodes} // 3);
	push @args, '--secure' if $opts{secure};
	kafka_cluster(\%k, @args);
	open(my $fh, '<', "$dir/cluster.env") or die "cannot read $dir/cluster.env: $!";
	while (my $line = <$fh>)
	{
		chomp $line;
		my ($key, $v) = split /=/, $line, 2;
		$k{$key} = $v;
	}
	close $fh;
	return \%k;
}

# kafka_cluster($kafka, 'kill', 2): one tools/kafka-cluster command on the
# cluster; dies if it fails.  Returns its standard output.
sub kafka_cluster
{
	my ($kafka, $cmd, @args) = @_;
	my $bin = $ENV{OBX_KAFKA_CLUSTER} || 'tools/kafka-cluster';
	my ($out, $err) = ('', '');
	IPC::Run::run([ $bin, $cmd, $kafka->{dir}, @args ], '<', \undef, '>', \$out, '2>', \$err,
		IPC::Run::timeout(2 * $PostgreSQL::Test::Utils::timeout_default))
	  or die "kafka-cluster $cmd @args failed: $err";
	return $out;
}

# create_topic($broker, $topic, $partitions): make the topic at a
# stand-in (start_mock) or a real Kafka cluster (start_kafka).
sub create_topic
{
	my ($broker, $topic, $partitions) = @_;
	if (defined $broker->{control})
	{
		mock_cmd($broker, "topic-create $topic $partitions");
	}
	else
	{
		kafka_cluster($broker, 'topic', $topic, $partitions);
	}
	return;
}

# obx_node($name, $mock, %conf): a started PostgreSQL node with obx
# preloaded, pointed at the stand-in, with the extension created.  Extra
# settings come as obx_setting => value pairs ('obx.workers' => 3).
sub obx_node
{
	my ($name, $mock, %conf) = @_;
	return new_obx_node($name, $mock, {}, %conf);
}

# obx_primary($name, $mock, %conf): the same, set up for streaming
# replication (a standby can be made from its backup).
sub obx_primary
{
	my ($name, $mock, %conf) = @_;
	return new_obx_node($name, $mock, { allows_streaming => 1 }, %conf);
}

# obx_node_at($name, $mock, $install, %conf): the same, on the PostgreSQL
# installed in $install (another major) instead of the one on PATH.
sub obx_node_at
{
	my ($name, $mock, $install, %conf) = @_;
	return new_obx_node($name, $mock, { install_path => $install }, %conf);
}

sub new_obx_node
{
	my ($name, $mock, $init, %conf) = @_;
	my %init = %$init;
	my $install = delete $init{install_path};
	my $node = PostgreSQL::Test::Cluster->new($name, $install ? (install_path => $install) : ());
	$node->init(%init);
	my %settings = (
		'shared_preload_libraries' => "'obx'",
		'obx.brokers' => "'$mock->{bootstrap}'",
		'obx.database' => "'postgres'",
		'obx.poll_interval' => "'200ms'",
		'obx.backoff_min' => "'50ms'",
		'obx.backoff_max' => "'1s'",
		'log_min_messages' => 'warning',
		%conf);
	$node->append_conf('postgresql.conf',
		join('', map { "$_ = $settings{$_}\n" } sort keys %settings));
	$node->start;
	push @nodes, $node;
	$node->safe_psql('postgres', 'CREATE EXTENSION obx');
	return $node;
}

# relay_ready($node, $n): wait until $n relay workers run and are idle;
# dies if they do not get there, saying where each worker was.
sub relay_ready
{
	my ($node, $n) = @_;
	return if $node->poll_query_until('postgres',
		"SELECT count(*) = $n FROM obx.workers WHERE pid IS NOT NULL AND state = 'idle'");
	my ($ret, $where) = $node->psql('postgres', q{
		SELECT w.worker, w.pid, w.state, w.last_error, a.wait_event_type, a.wait_event,
			   a.query, a.backend_xmin
		  FROM obx.workers w LEFT JOIN pg_stat_activity a ON a.pid = w.pid});
	die "$n relay workers did not start on node " . $node->name . ":\n$where";
}

# enqueue_with_rollbacks($node, $topic, $n): for each of $n keys, one
# committed event, one event of a transaction that rolls back, and, in a
# transaction that commits, one kept event and one undone by ROLLBACK TO
# SAVEPOINT.  Returns (\%committed, \%rolled_back), event ids as keys: the
# ids of the rolled-back events are read inside their transactions.
sub enqueue_with_rollbacks
{
	my ($node, $topic, $n) = @_;
	my (%committed, %rolled_back);
	for my $i (1 .. $n)
	{
		my $key = "ord_$i";
		my $id = $node->safe_psql('postgres',
			"SELECT obx.enqueue('$topic', '$key', '{\"n\": $i}')");
		$committed{$id} = 1;

		my $gone = $node->safe_psql('postgres', qq{
			BEGIN;
			CREATE TEMP TABLE ids ON COMMIT DROP AS
				SELECT obx.enqueue('$topic', '$key', '{"n": -$i}') AS id;
			SELECT id FROM ids;
			ROLLBACK;});
		$rolled_back{$gone} = 1;

		my $out = $node->safe_psql('postgres', qq{
			BEGIN;
			SELECT 'kept', obx.enqueue('$topic', '$key', '{"n": $i, "kept": true}');
			SAVEPOINT s;
			SELECT 'undone', obx.enqueue('$topic', '$key', '{"n": -$i, "undone": true}');
			ROLLBACK TO SAVEPOINT s;
			COMMIT;});
		for my $line (split /\n/, $out)
		{
			my ($what, $eid) = split /\|/, $line;
			$what eq 'kept' ? ($committed{$eid} = 1) : ($rolled_back{$eid} = 1);
		}
	}
	return (\%committed, \%rolled_back);
}

# wait_until(sub { ... }, 'what', %opt): the one polling helper of the
# obx tests.  Calls the condition every 50 ms (every => seconds: another
# interval) until it returns true, and returns true.  When it has not held
# after the harness timeout ($PostgreSQL::Test::Utils::timeout_default;
# timeout => seconds: another limit), it fails the test with "timed out
# after N s waiting for what" and returns false; with quiet => 1 it only
# notes that, for a caller that decides itself (a TODO block, a die with
# more detail).  A condition that is one SQL query is
# $node->poll_query_until, which shows the query and its last result when
# it gives up.
sub wait_until
{
	my ($cond, $what, %opt) = @_;
	my $limit = $opt{timeout} // $PostgreSQL::Test::Utils::timeout_default;
	my $start = time();
	while (time() - $start < $limit)
	{
		return 1 if $cond->();
		usleep(1_000_000 * ($opt{every} // 0.05));    # poll interval of this condition wait
	}
	my $msg = sprintf('timed out after %.0f s waiting for %s', time() - $start, $what);
	$opt{quiet} ? note($msg) : fail($msg);
	return 0;
}

# wait_for_crash_restart($node, $log_offset, $what): after a process of
# $node was killed, wait until the postmaster has logged (past $log_offset)
# that it reinitializes, then until a connection succeeds.  Query only after
# it returns: during crash recovery psql exits at once, and PostgreSQL 14's
# poll_query_until dies writing its query to it (a broken pipe).  Returns
# 1, or 0 after failing a check that names $what.
sub wait_for_crash_restart
{
	my ($node, $log_offset, $what) = @_;
	return 0
	  unless wait_until(
		sub {
			slurp_file($node->logfile, $log_offset)
			  =~ /all server processes terminated; reinitializing/;
		},
		"the postmaster to reinitialize ($what)");
	return wait_until(sub { eval { $node->safe_psql('postgres', 'SELECT 1'); 1 } },
		"connections after crash recovery ($what)");
}

# read_topic($mock, $topic): every message in the topic, read from the
# beginning by kcat.  Each is a hash: partition, offset, key, payload,
# headers (a hash), event_id, timestamp (the Kafka timestamp, in ms).
# Per partition they are in offset order.
sub read_topic
{
	my ($mock, $topic) = @_;
	my ($out, $err) = ('', '');
	my @cmd = ('kcat', '-C', '-b', $mock->{bootstrap}, '-t', $topic,
		'-o', 'beginning', '-e', '-q', '-f', "%p\t%o\t%T\t%k\t%h\t%s\n");
	IPC::Run::run(\@cmd, '<', \undef, '>', \$out, '2>', \$err,
		IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
	my @msgs;
	for my $line (split /\n/, $out)
	{
		my ($p, $o, $t, $k, $h, $s) = split /\t/, $line, 6;
		next unless defined $o && $o =~ /^\d+$/;
		my %headers = map { split /=/, $_, 2 } grep { length } split /,/, ($h // '');
		push @msgs, {
			partition => $p, offset => $o, timestamp => $t, key => $k, payload => $s,
			headers => \%headers, event_id => $headers{event_id} };
	}
	return \@msgs;
}

# wait_for_broker($mock, $topic, sub { my $msgs = shift; ... }, 'what'):
# re-read the topic until the condition holds on its messages; returns them.
sub wait_for_broker
{
	my ($mock, $topic, $cond, $what) = @_;
	my $msgs;
	wait_until(sub { $msgs = read_topic($mock, $topic); $cond->($msgs) }, $what);
	return $msgs;
}

# broker_holds_exactly($mock, $node, $topic, \@ids, $where): wait until
# every id is at the broker, then check that the broker's set of event ids
# is exactly @ids and that, per key, the broker order (first copies) is the
# enqueue order of committed_ids($node, $where).  Returns the messages.
sub broker_holds_exactly
{
	my ($mock, $node, $topic, $ids, $where) = @_;
	my $msgs = wait_for_broker($mock, $topic, sub {
		my $seen = event_ids_at_broker(shift);
		!grep { !$seen->{$_} } @$ids }, "every committed event of $topic at the broker");
	is_deeply([ sort keys %{ event_ids_at_broker($msgs) } ], [ sort @$ids ],
		"the broker holds exactly the committed events of $topic");
	is_deeply(first_occurrences($msgs), committed_ids($node, $where),
		"$topic: per key, broker order equals enqueue order");
	return $msgs;
}

# all_published($node): wait until the outbox has no unpublished event.
sub all_published
{
	my ($node) = @_;
	return $node->poll_query_until('postgres',
		'SELECT count(*) = 0 FROM obx.outbox_events WHERE published_at IS NULL');
}

# event_ids_at_broker($msgs): the set of event ids seen, as a hash id => count.
sub event_ids_at_broker
{
	my ($msgs) = @_;
	my %seen;
	$seen{ $_->{event_id} // '' }++ for @$msgs;
	return \%seen;
}

# first_occurrences($msgs): per key, the list of event ids in the order the
# broker stored them (by partition offset), keeping only the first copy of
# each id (re-sends after a crash are duplicates, not reorders).
sub first_occurrences
{
	my ($msgs) = @_;
	my (%order, %seen);
	for my $m (in_broker_order($msgs))
	{
		next if $seen{ $m->{event_id} }++;
		push @{ $order{ $m->{key} } }, $m->{event_id};
	}
	return \%order;
}

# copies_of_key($msgs, $key): the event ids of one key at the broker, every
# copy, in the order the broker stored them (by partition offset).
sub copies_of_key
{
	my ($msgs, $key) = @_;
	return [ map { $_->{event_id} } grep { $_->{key} eq $key } in_broker_order($msgs) ];
}

# in_broker_order($msgs): the messages in the order the broker stored them,
# by partition and offset.
sub in_broker_order
{
	my ($msgs) = @_;
	return sort { $a->{partition} <=> $b->{partition} || $a->{offset} <=> $b->{offset} } @$msgs;
}

# committed_ids($node, $where): per key, the committed event ids in enqueue
# (seq) order, from the outbox itself.
sub committed_ids
{
	my ($node, $where) = @_;
	$where //= 'true';
	my $rows = $node->safe_psql('postgres',
		"SELECT event_key, id FROM obx.outbox_events WHERE $where ORDER BY seq");
	my %order;
	for my $line (split /\n/, $rows)
	{
		my ($k, $id) = split /\|/, $line;
		push @{ $order{$k} }, $id;
	}
	return \%order;
}

# worker_pids($node, 'obx relay'): pids of the running workers of that
# backend type ('obx relay', 'obx consumer'), in order.
sub worker_pids
{
	my ($node, $type) = @_;
	my $out = $node->safe_psql('postgres',
		"SELECT pid FROM pg_stat_activity WHERE backend_type = '$type' ORDER BY pid");
	return [ grep { length } split /\n/, $out ];
}

# relay_pids($node): pids of the running relay workers.
sub relay_pids { return worker_pids($_[0], 'obx relay') }

# Nodes first (immediate stop, as PostgreSQL::Test::Cluster's own END
# block would), then the stand-ins and the Kafka clusters: a relay that outlives its brokers
# fills the server log with broker-down warnings.
END
{
	my $exit_code = $?;

	for my $node (@nodes)
	{
		eval { $node->teardown_node; };
	}
	for my $m (@mocks)
	{
		eval { $m->{handle}->kill_kill(grace => 5); };
	}
	for my $k (@clusters)
	{
		eval { kafka_cluster($k, 'stop'); };
	}
	$? = $exit_code;
}

1;
