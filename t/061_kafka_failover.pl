# Broker failover and a rolling restart of a real Kafka cluster, under load.
#
# A three-node Apache Kafka cluster (tools/kafka-cluster, KRaft) and topics
# of 6 partitions, replication factor 3, min.insync.replicas 2.  The
# application enqueues all along, one event per transaction, from a
# procedure that commits after each (bounded in count, stopped on a flag).
#
# (a) Leader failover: the broker that leads most of the topic's
#     partitions is killed (-9) while events flow; its partitions get new
#     leaders, and it is started again.
# (b) Rolling restart: every broker in turn is stopped cleanly, started
#     again, and the next one waits until it has rejoined and every
#     partition is fully in sync again.
#
# Guarantees 2, 3 and 4 after each: the broker's set of event ids is the
# committed set (nothing lost, nothing foreign), per key the broker order
# (first copies) is the enqueue order, and any duplicate is a copy of the
# same event (same event_id, key and payload).
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use ObxKafkaChecks;
use IPC::Run;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $t0 = time();
my $parts = 6;
my $nkeys = 40;

my $kafka = start_kafka(nodes => 3);
note sprintf('Kafka cluster up in %.1f s', time() - $t0);

my $node = obx_node('kafka_failover', $kafka,
	'obx.workers' => 2,
	'obx.batch_size' => 100);
relay_ready($node, 2);

create_enqueue_load($node);

# start_load($topic): the load in a psql of its own; returns its handle.
sub start_load
{
	my ($topic) = @_;
	$node->safe_psql('postgres', 'UPDATE load_ctl SET stop = false');
	my ($out, $err) = ('', '');
	my $h = IPC::Run::start(
		[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('postgres'),
		  '-c', "CALL enqueue_load('$topic', 100000, $nkeys)" ],
		'<', \undef, '>', \$out, '2>', \$err);
	return { handle => $h, err => \$err };
}

# stop_load($load): stop it and wait for the psql to end.
sub stop_load
{
	my ($load, $what) = @_;
	$node->safe_psql('postgres', 'UPDATE load_ctl SET stop = true');
	$load->{handle}->finish;
	is($load->{handle}->result(0), 0, "$what: the load ran without error")
	  or diag(${ $load->{err} });
}

sub committed_count
{
	my ($topic) = @_;
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM obx.outbox_events WHERE topic = '$topic'");
}

# more_published($topic, $n): wait until $n more events of the topic are
# published than now: events flow.
sub more_published
{
	my ($topic, $n, $what) = @_;
	my $now = $node->safe_psql('postgres',
		"SELECT count(*) FROM obx.outbox_events WHERE topic = '$topic' AND published_at IS NOT NULL");
	$node->poll_query_until('postgres', qq{
		SELECT count(*) >= $now + $n FROM obx.outbox_events
		 WHERE topic = '$topic' AND published_at IS NOT NULL})
	  or die "events stopped flowing: $what";
}

# check_topic($topic, $what): after the load, everything published and the
# broker holding exactly the committed events, in order per key.
sub check_topic
{
	my ($topic, $what) = @_;
	ok(all_published($node), "$what: every committed event is published");
	is($node->safe_psql('postgres',
		"SELECT count(*) FROM obx.outbox_events WHERE topic = '$topic' AND quarantined_at IS NOT NULL"),
		'0', "$what: nothing quarantined");
	my @ids = split /\n/, $node->safe_psql('postgres',
		"SELECT id FROM obx.outbox_events WHERE topic = '$topic'");
	my $msgs = broker_holds_exactly($kafka, $node, $topic, \@ids, "topic = '$topic'");
	my $dups = copies_agree($msgs, $topic);
	note sprintf('%s: %d events committed, %d messages at the broker, %d duplicates',
		$what, scalar(@ids), scalar(@$msgs), $dups);
}

# leaders($topic): partition => leader.
sub leaders
{
	my ($topic) = @_;
	return { map { split / / } split /\n/, kafka_cluster($kafka, 'leaders', $topic) };
}

############################################################################
# (a) the leader of most partitions killed while events flow
############################################################################
{
	my $t = time();
	my $topic = 'orders.failover.v1';
	kafka_cluster($kafka, 'topic', $topic, $parts, 'min.insync.replicas=2');
	wait_until(sub { topic_writable($kafka, $topic, $parts, 3) },
		"every partition of $topic led and in sync");

	my $load = start_load($topic);
	more_published($topic, 200, 'before the kill');

	my %led;
	my $leaders = leaders($topic);
	$led{$_}++ for values %$leaders;
	my ($victim) = sort { $led{$b} <=> $led{$a} || $a <=> $b } keys %led;
	note "leaders before the kill: "
	  . join(', ', map { "$_:$leaders->{$_}" } sort keys %$leaders);

	my $before = committed_count($topic);
	kafka_cluster($kafka, 'kill', $victim);
	# The kill command returns once the process is gone.
	my $kill_at = $node->safe_psql('postgres', 'SELECT clock_timestamp()');
	note "broker $victim, leader of $led{$victim} of $parts partitions, killed (-9)";

	# Its partitions move to the two brokers left, and events keep flowing
	# through them while it is down.
	wait_until(sub {
		my $l = leaders($topic);
		scalar(keys %$l) == $parts && !grep { $_ == $victim || $_ < 1 } values %$l },
		"new leaders for the partitions of broker $victim");
	more_published($topic, 300, 'with the killed broker down');
	my $moved = join(',', grep { $leaders->{$_} == $victim } keys %$leaders);
	$node->poll_query_until('postgres', qq{
		SELECT count(*) > 0 FROM obx.outbox_events
		 WHERE topic = '$topic' AND published_at > '$kill_at' AND kafka_partition IN ($moved)})
	  or die "nothing acknowledged on partitions $moved after the kill";
	my $first_ack = $node->safe_psql('postgres', qq{
		SELECT extract(epoch FROM min(published_at) - '$kill_at'::timestamptz)
		  FROM obx.outbox_events
		 WHERE topic = '$topic' AND published_at > '$kill_at' AND kafka_partition IN ($moved)});
	note sprintf('first acknowledgement on the partitions broker %d led (%s): %.3f s after the kill',
		$victim, $moved, $first_ack);
	ok(committed_count($topic) > $before, 'failover: the application committed events after the kill');

	kafka_cluster($kafka, 'restart', $victim);
	kafka_cluster($kafka, 'wait', 3);
	wait_until(sub { topic_writable($kafka, $topic, $parts, 3) },
		"broker $victim back in sync on every partition");
	more_published($topic, 200, 'after the killed broker rejoined');
	stop_load($load, 'failover');
	check_topic($topic, 'failover');
	note sprintf('window (a) took %.1f s', time() - $t);
}

############################################################################
# (b) rolling restart under load
############################################################################
{
	my $t = time();
	my $topic = 'orders.rolling.v1';
	kafka_cluster($kafka, 'topic', $topic, $parts, 'min.insync.replicas=2');
	wait_until(sub { topic_writable($kafka, $topic, $parts, 3) },
		"every partition of $topic led and in sync");

	my $load = start_load($topic);
	more_published($topic, 200, 'before the rolling restart');
	for my $id (1 .. 3)
	{
		my $ts = time();
		kafka_cluster($kafka, 'stop', $id);
		more_published($topic, 100, "with broker $id stopped");
		kafka_cluster($kafka, 'restart', $id);
		kafka_cluster($kafka, 'wait', 3);
		wait_until(sub { topic_writable($kafka, $topic, $parts, 3) },
			"broker $id back in sync on every partition");
		note sprintf('broker %d stopped, restarted and in sync again in %.1f s', $id, time() - $ts);
		more_published($topic, 100, "after broker $id rejoined");
	}
	stop_load($load, 'rolling restart');
	check_topic($topic, 'rolling restart');
	note sprintf('window (b) took %.1f s', time() - $t);
}

note sprintf('wall time %.1f s', time() - $t0);

done_testing();
