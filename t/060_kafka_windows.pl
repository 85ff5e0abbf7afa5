# The seed's failure windows against a real Kafka cluster.
#
# One three-node Apache Kafka cluster (tools/kafka-cluster, KRaft,
# replication factor 3, min.insync.replicas 2) and one PostgreSQL node with
# three relay workers serve four windows, each on a topic of its own; after
# each, the broker's set of event ids must equal the committed set, per key
# the broker order (first copies) must be the enqueue order, and any
# duplicate must be a copy of the same event (same event_id, key, payload):
#
# (a) rollback (t/001): events of rolled-back transactions and savepoints
#     never reach Kafka;
# (b) concurrent producers (t/021): eight pgbench clients lock an order
#     row and enqueue for it, a fifth of them roll back, one transaction
#     enqueues first and commits last; three workers claim small batches;
#     no duplicates in this crash-free run;
# (c) restart with events pending (t/012): every broker paused (SIGSTOP),
#     so the relays' batches stay in flight, then an immediate stop and a
#     clean restart of PostgreSQL, the application committing all along
#     without waiting on Kafka; the brokers resume and everything arrives;
# (d) Kafka acknowledged, the worker killed (-9) before published_at
#     (t/010): a session holds a SHARE lock on obx.records, so the relay's
#     record waits on it after the acknowledgement; the relay is killed there, the
#     instance recovers, and the event is sent again with the same id.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use ObxKafkaChecks;
use ObxWindows;
use JSON::PP;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $t0 = time();
my $kafka = start_kafka(nodes => 3);
note sprintf('Kafka cluster up in %.1f s', time() - $t0);

# restart_after_crash: the test harness turns it off; window (d) needs the
# instance to recover from the relay's SIGKILL.
my $node = obx_node('kafka_windows', $kafka,
	'obx.workers' => 3,
	'obx.batch_size' => 50,
	'obx.lease_timeout' => "'9s'",
	'restart_after_crash' => 'on',
	'max_connections' => 40);
relay_ready($node, 3);

# check_window($topic, \@committed): the broker holds exactly the committed
# events of the topic, in enqueue order per key, copies agreeing.  Returns
# the messages and the number of duplicates.
sub check_window
{
	my ($topic, $ids) = @_;
	my $msgs = broker_holds_exactly($kafka, $node, $topic, $ids, "topic = '$topic'");
	my $dups = copies_agree($msgs, $topic);
	note sprintf('%s: %d messages, %d duplicates', $topic, scalar(@$msgs), $dups);
	return ($msgs, $dups);
}

############################################################################
# (a) rollback
############################################################################
{
	my $t = time();
	my $topic = 'orders.rollback.v1';
	my ($committed, $rolled_back) = enqueue_with_rollbacks($node, $topic, 20);
	is(scalar(keys %$rolled_back), 40, 'rollback: 40 rolled-back event ids were handed out');

	my ($msgs) = check_window($topic, [ keys %$committed ]);
	my $seen = event_ids_at_broker($msgs);
	is(scalar(grep { $seen->{$_} } keys %$rolled_back), 0,
		'rollback: no rolled-back event reached the broker');
	is($node->safe_psql('postgres',
		'SELECT count(*) FROM obx.outbox_events WHERE id IN (' . in_list(keys %$rolled_back) . ')'),
		'0', 'rollback: no rolled-back event exists in the outbox');
	note sprintf('window (a) took %.1f s', time() - $t);
}

############################################################################
# (b) concurrent producers
############################################################################
{
	my $t = time();
	my $norders = 200;
	my $clients = 8;
	my $per_client = 150;
	my $topic = 'orders.concurrent.v1';

	# The late committer: takes its seq first, commits last.
	my ($late) = late_committer($node, $topic);
	run_producers($node, norders => $norders, clients => $clients, per_client => $per_client,
		topic => $topic, what => 'concurrent: pgbench committing and rolling-back producers');
	ok(all_published($node), 'concurrent: every event committed by pgbench is published');
	$late->query_safe('COMMIT');
	$late->quit;
	ok(all_published($node), 'concurrent: the late-committing event is published too');

	my $committed = 1 + $node->safe_psql('postgres', 'SELECT sum(events) FROM orders');
	my @ids = split /\n/, $node->safe_psql('postgres',
		"SELECT id FROM obx.outbox_events WHERE topic = '$topic'");
	is(scalar(@ids), $committed, "concurrent: the outbox holds exactly the $committed committed events");
	is($node->safe_psql('postgres', qq{
		SELECT count(*) FROM obx.outbox_events
		 WHERE topic = '$topic' AND (payload->>'rb')::boolean}),
		'0', 'concurrent: no event of a rolled-back transaction is in the outbox');
	my ($msgs, $dups) = check_window($topic, \@ids);
	is($dups, 0, 'concurrent: no duplicates in a crash-free run');
	is(scalar(grep { JSON::PP->new->decode($_->{payload})->{rb} } @$msgs), 0,
		'concurrent: no rolled-back event reached the broker');
	my $landing = $node->safe_psql('postgres',
		"SELECT id, kafka_partition, kafka_offset FROM obx.outbox_events WHERE topic = '$topic'");
	my %landed = map { my ($id, $p, $o) = split /\|/; ($id => "$p/$o") } split /\n/, $landing;
	is(scalar(grep { ($landed{ $_->{event_id} } // '') ne "$_->{partition}/$_->{offset}" } @$msgs),
		0, 'concurrent: the partition and offset recorded in the outbox are where each event landed');
	ok($node->safe_psql('postgres',
		'SELECT count(*) >= 2 FROM obx.workers WHERE published > 0') eq 't',
		'concurrent: several workers published');
	note sprintf('window (b): %d events; took %.1f s', $committed, time() - $t);
}

############################################################################
# (c) PostgreSQL restarts with events pending, every broker paused
############################################################################
{
	my $t = time();
	my $topic = 'orders.restart_pending.v1';
	my $nkeys = 20;
	my $slowest = 0;

	# Known to the producers before the pause.
	my @committed = ($node->safe_psql('postgres',
		"SELECT obx.enqueue('$topic', 'warmup', '{}')"));
	ok(all_published($node), 'restart: warm-up event published');

	my $enqueue_wave = wave_producer($node, $topic, nkeys => $nkeys,
		slowest => \$slowest, brokers => 'paused', label => 'restart: ');

	kafka_cluster($kafka, 'pause', $_) for 1 .. 3;

	push @committed, $enqueue_wave->(1, 10);
	$node->poll_query_until('postgres', 'SELECT count(*) > 0 FROM obx.leased_events')
	  or die 'no event was ever claimed';
	note 'leased before the immediate stop: '
	  . $node->safe_psql('postgres', 'SELECT count(*) FROM obx.leased_events');
	$node->stop('immediate');
	$node->start;
	is($node->safe_psql('postgres', qq{
		SELECT count(*) FROM obx.outbox_events
		 WHERE topic = '$topic' AND published_at IS NULL}),
		scalar(@committed) - 1, 'restart: after the immediate stop every event of wave 1 is pending');

	my $started_at = $node->safe_psql('postgres', 'SELECT now()');
	push @committed, $enqueue_wave->(2, 5);
	$node->poll_query_until('postgres', qq{
		SELECT count(*) > 0 FROM obx.leased_events
		 WHERE lease_until >= '$started_at'::timestamptz + interval '9 s'})
	  or die 'nothing was claimed after the restart';

	my $log_offset = -s $node->logfile;
	$node->restart;
	like(slurp_file($node->logfile, $log_offset), qr/obx relay \d stopped/,
		'restart: the workers stopped cleanly with batches in flight');

	push @committed, $enqueue_wave->(3, 5);
	is($node->safe_psql('postgres', qq{
		SELECT count(*) FROM obx.outbox_events
		 WHERE topic = '$topic' AND published_at IS NULL AND quarantined_at IS NULL}),
		scalar(@committed) - 1, 'restart: all 200 events pending, none published or quarantined');
	cmp_ok($slowest, '<', 5,
		sprintf('restart: no enqueue transaction waited on the broker (slowest %.2f s)', $slowest));

	kafka_cluster($kafka, 'resume', $_) for 1 .. 3;
	my $t_up = time();
	ok(all_published($node), 'restart: every event published once the brokers resume');
	note sprintf('all published %.1f s after the brokers resumed', time() - $t_up);
	check_window($topic, \@committed);
	is($node->safe_psql('postgres', qq{
		SELECT count(*) FROM obx.outbox_events WHERE quarantined_at IS NOT NULL}),
		'0', 'restart: nothing quarantined');
	note sprintf('window (c) took %.1f s', time() - $t);
}

############################################################################
# (d) acknowledged by Kafka, the worker killed before published_at
############################################################################
{
	my $t = time();
	my $topic = 'orders.crash_after_ack.v1';
	relay_ready($node, 3);

	# Known to the producers before the window.
	my @warm = ($node->safe_psql('postgres', "SELECT obx.enqueue('$topic', 'warmup', '{}')"));
	ok(all_published($node), 'crash: warm-up event published');

	# The relays are stopped (SIGSTOP) while the batch commits and its
	# victim's row is locked, so that the claim, which never touches an
	# event's row, comes after the lock; the record of the acknowledged
	# batch then waits on it.
	my @relays = @{ relay_pids($node) };
	is(scalar(@relays), 3, 'crash: three relays run');
	kill 'STOP', @relays;
	my @batch = one_batch($node, $topic, 'crash: ');
	my $victim = $batch[0];

	my ($relay_pid, $bg) = relay_waits_on_record($node, $kafka, $topic, \@batch,
		sub { kill 'CONT', @relays }, 'crash: ');
	crash_relay_at_record($node, $relay_pid, $bg, $victim, 'crash: ');

	# One more event after the recovery, on the victim's key.
	my @after = ($node->safe_psql('postgres', "SELECT obx.enqueue('$topic', 'ord_1', '{\"n\": 2}')"));
	ok(all_published($node), 'crash: an event enqueued after the recovery is published');

	my $msgs = resent_batch($kafka, $topic, \@batch, [ @warm, @batch, @after ], 'crash: ');
	check_window($topic, [ @warm, @batch, @after ]);
	my ($p, $o) = split /\|/, $node->safe_psql('postgres',
		"SELECT kafka_partition, kafka_offset FROM obx.outbox_events WHERE id = '$victim'");
	ok((grep { $_->{partition} == $p && $_->{offset} == $o && $_->{event_id} eq $victim } @$msgs),
		"crash: the recorded partition $p offset $o holds the victim");
	note sprintf('window (d) took %.1f s', time() - $t);
}

note sprintf('wall time %.1f s', time() - $t0);

done_testing();
