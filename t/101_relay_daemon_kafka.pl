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
# - the daemon's consumer, through the same SASL_SSL listener: a
#   subscription to that topic (a SECURITY DEFINER handler of the
#   subscriber's, called by the same daemon) is served through the
#   failover: events of the partitions the killed broker led are applied
#   while it is down, and in the end every committed event is applied
#   exactly once (the broker's duplicates recognized as such), per key in
#   enqueue order;
# - SIGTERM stops the daemon with exit status 0, its consumer leaving the
#   group with the offsets of every handled message committed at the
#   broker;
# - the crash window on the real cluster: the daemon killed (-9) after its
#   handlers' transactions committed and before their offsets were
#   (auto.commit.interval.ms of an hour holds the window open; the group's
#   committed offsets at the broker show it open): the new daemon re-reads
#   those messages, each a duplicate (the handler is not called again,
#   obx.consumer_status counts it), and every effect stays applied exactly
#   once, events sent after the restart too;
# - the daemon killed (-9) inside a handler (its transaction rolled
#   back): the offset of that message was not committed, the next daemon
#   applies it and then the one behind it on its key;
# - no password (the database's, the right or the wrong SASL one) shows
#   in what --check prints or in the daemon's log.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxConsumer;
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
my $consumer = 'audit';

my $kafka = start_kafka(nodes => 3, secure => 1);
my $dir = PostgreSQL::Test::Utils::tempdir('relay');
my $node = sql_only_node('daemon_kafka');

sub q1 { $node->safe_psql('postgres', $_[0]) }

# The subscriber, audit, with its handler: SECURITY DEFINER, its own,
# with its own search_path (what the daemon requires).  shop.effects has
# no unique key: an effect applied twice shows as two rows.
# shop.handler_calls counts the calls (PostgreSQL does not crash here).
q1(q{
	CREATE ROLE audit LOGIN;
	GRANT USAGE ON SCHEMA obx TO audit;
	GRANT EXECUTE ON FUNCTION obx.subscribe(text, text[], regprocedure, jsonb) TO audit;
	CREATE SCHEMA shop AUTHORIZATION audit;
	GRANT USAGE ON SCHEMA shop TO shop_owner, obx_handler_caller;
	SET ROLE audit;
	CREATE TABLE shop.effects (
		n bigserial PRIMARY KEY,
		event_id text NOT NULL,
		event_key text,
		kafka_partition integer,
		applied_at timestamptz NOT NULL DEFAULT clock_timestamp());
	CREATE SEQUENCE shop.handler_calls;
	CREATE FUNCTION shop.record(e obx.inbound_event) RETURNS void
	LANGUAGE plpgsql SECURITY DEFINER SET search_path = shop, pg_catalog AS $$
	BEGIN
		IF e.payload->>'gate' = 'hold' THEN
			PERFORM pg_advisory_xact_lock_shared(4242);
		END IF;
		PERFORM nextval('handler_calls');
		INSERT INTO effects (event_id, event_key, kafka_partition)
		VALUES (e.event_id, e.event_key, e.kafka_partition);
	END $$;
});
# An hour between offset commits: only a close of the consumer (or a
# rebalance) commits.
subscribe($node, $consumer, [$topic], 'shop.record(obx.inbound_event)', as => 'audit',
	kafka => { 'auto.commit.interval.ms' => 3600000, 'session.timeout.ms' => 6000 });

# The daemon's settings: the SASL_SSL listener only, its properties as
# kafka.* lines of the settings file.
sub secure_config
{
	my (%override) = @_;
	my %props = sasl_ssl_properties($kafka, %override);
	return relay_config($node, { bootstrap => $kafka->{secure_bootstrap} }, $dir,
		batch_size => 100, subscriptions => '*', map { ("kafka.$_" => $props{$_}) } keys %props);
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
ok($node->poll_query_until('postgres', qq{
	SELECT count(*) > 0 FROM shop.effects
	 WHERE applied_at > '$kill_at' AND kafka_partition IN ($moved)}),
	"the daemon's consumer applied events of the partitions broker $victim led, after the kill");

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
	WHERE application_name LIKE 'obx-relay%'}), 'relay', 'the daemon ran as the role relay');

#
# The daemon's consumer: exactly once, per key in enqueue order.
#

# applied_in_order($what, \@ids): wait until the consumer has handled every
# message of the topic, then check that the effects are the event ids,
# each applied once, per key in enqueue order, and that the handler was
# called once per event (never for a duplicate).
sub applied_in_order
{
	my ($what, $ids) = @_;
	wait_caught_up($node, $consumer, $topic, partition_ends($kafka, $topic), $what);
	my %n;
	my %order;
	for my $line (split /\n/, q1('SELECT event_key, event_id FROM shop.effects ORDER BY n'))
	{
		my ($k, $id) = split /\|/, $line;
		$n{$id}++;
		push @{ $order{$k} }, $id;
	}
	is_deeply(\%n, { map { $_ => 1 } @$ids }, "$what: every committed event applied exactly once");
	is_deeply(\%order, committed_ids($node, "topic = '$topic'"),
		"$what: per key, the effects in enqueue order");
	is(handler_calls($node), scalar(@$ids), "$what: the handler was called once per event");
}

applied_in_order('after the failover', \@ids);
my $t = consumer_totals($node, $consumer, $topic);
is($t->{processed}, scalar(@ids), 'obx.consumer_status: each event processed once');
cmp_ok($t->{duplicates}, '>=', $dups, 'every copy at the broker was recognized as a duplicate');
note sprintf('consumer: %d processed, %d duplicates (%d copies at the broker)',
	$t->{processed}, $t->{duplicates}, $dups);
is(q1('SELECT count(*) FROM obx.dead_letters'), '0', 'no dead letter');

#
# SIGTERM: the consumer leaves its group, committing its offsets.
#
is(stop_relay($relay), 0, 'SIGTERM stops the daemon with exit status 0');

# committed_offsets(): partition => the group's committed offset at the
# broker ('-' for none).  The tool fails while the coordinator moves.
sub committed_offsets
{
	my $o;
	wait_until(sub { $o = eval { group_offsets($kafka, $consumer, $topic) }; defined $o },
		"the group coordinator of $consumer to answer");
	return { map { $_ => $o->{$_}[0] } keys %$o };
}

my $ends = partition_ends($kafka, $topic);
is_deeply(committed_offsets(), $ends,
	'after SIGTERM the group has committed, per partition, the offset past its last message');

#
# Killed after the handlers' commits, before the offsets' commit.
#
$relay = start_relay($config);
# enqueue_many($n, $what): $n events on the load's keys, in one
# transaction; returns their ids.
sub enqueue_many
{
	my ($n, $what) = @_;
	return split /\n/, q1(qq{
		SELECT obx.enqueue('$topic', 'ord_' || (g % $nkeys), jsonb_build_object('$what', g))
		  FROM generate_series(1, $n) g});
}
my @window = enqueue_many(200, 'window');
push @ids, @window;
ok(all_published($node), 'the events of the window are published');
applied_in_order('the events of the window', \@ids);
is_deeply(committed_offsets(), $ends,
	'the window is open: the broker has no offset of the messages handled since the restart');
my $before = consumer_totals($node, $consumer, $topic);
my $calls = handler_calls($node);
stop_relay($relay, 'KILL');
$relay = start_relay($config);
my $reread = scalar(@window);
ok($node->poll_query_until('postgres', qq{
	SELECT sum(duplicates) >= $before->{duplicates} + $reread FROM obx.consumer_status
	 WHERE consumer_name = '$consumer' AND topic = '$topic'}),
	'the new daemon re-reads the messages whose offsets were not committed, each a duplicate');
is(handler_calls($node), $calls, 'the handler was not called for a re-read message');
my @later = enqueue_many(20, 'later');
push @ids, @later;
ok(all_published($node), 'the events after the restart are published');
applied_in_order('after the kill and restart', \@ids);
$t = consumer_totals($node, $consumer, $topic);
is($t->{processed}, scalar(@ids), 'obx.consumer_status: processed counts each event once');
is(q1(qq{SELECT count(*) FROM obx.processed_events WHERE consumer_name = '$consumer'}),
	scalar(@ids), 'obx.processed_events holds each event once');

#
# Killed inside a handler: its transaction is rolled back and the offset
# of its message was not committed, so the next daemon applies it.
#
my $gate = $node->background_psql('postgres');
$gate->query_safe('SELECT pg_advisory_lock(4242)');
my $gated = q1(qq{SELECT obx.enqueue('$topic', 'ord_gate', '{"gate": "hold"}')});
my $behind = q1(qq{SELECT obx.enqueue('$topic', 'ord_gate', '{"after": "gate"}')});
push @ids, $gated, $behind;
my $in_handler = q{FROM pg_stat_activity
	WHERE application_name = 'obx-relay consumer' AND wait_event = 'advisory'};
ok($node->poll_query_until('postgres', "SELECT count(*) = 1 $in_handler"),
	'the daemon is inside the handler of the gated event');
stop_relay($relay, 'KILL');
# What a crash of the daemon's host does to its session: rolled back.
q1("SELECT pg_terminate_backend(pid) $in_handler");
ok($node->poll_query_until('postgres', "SELECT count(*) = 0 $in_handler"),
	'the killed daemon\'s session is gone');
$gate->quit;
is(q1(qq{SELECT count(*) FROM shop.effects WHERE event_id IN ('$gated', '$behind')}), '0',
	'neither the gated event nor the one behind it has an effect');
$relay = start_relay($config);
# The event behind the gate may not have been published before the kill
# (its lease then runs out first): the broker's ends must include it.
ok(all_published($node), 'the events of the gated key are published');
applied_in_order('after a kill inside a handler', \@ids);
is(stop_relay($relay), 0, 'SIGTERM stops the restarted daemon with exit status 0');
$printed .= relay_log($relay);    # the log of every daemon run with $config

my @leaked = grep { index($printed, $_) >= 0 } ('relay-secret', $kafka->{password}, 'not-the-password');
is(scalar(@leaked), 0, 'no password in what --check printed or in the daemon\'s logs')
  or diag('found: ' . join(', ', @leaked));

done_testing();
