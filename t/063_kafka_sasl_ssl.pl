# SASL_SSL against a real Kafka cluster: TLS with the cluster's own CA and
# SCRAM-SHA-512 credentials, given to obx through obx.kafka_properties_file
# (the secrets) and obx.kafka_properties (the rest).
#
# 1. The relay publishes and the in-database consumer consumes through the
#    secured listener exactly as on plaintext: the broker holds exactly the
#    committed events, in enqueue order per key, and the consumer applies
#    each once, in that order.
# 2. A wrong password (a reload): obx.workers shows the authentication
#    failure (state "broker down", last_error naming it) and so does the
#    server log, for the relay and the consumer; events committed meanwhile
#    stay in the outbox (their delivery timeouts are transient: nothing is
#    quarantined) and none reaches the broker.
# 3. The right password again (a reload): publishing resumes, the broker
#    holds exactly the committed set, and the consumer applies the events
#    of the outage once each.
# Before all that, a CA file that cannot be read shows in obx.workers, and
# the relays keep running.
# Throughout, neither password appears in obx's views, its error texts or
# any line of the server log (log_min_messages = debug1, every statement
# logged).
#
# The cluster's PLAINTEXT listener (a super user's) is only the test's way
# to look at what the broker holds (kcat); obx uses the SASL_SSL one alone.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use ObxConsumer;
use ObxSecure;
use PostgreSQL::Test::Utils;
use Test::More;

my $topic = 'payments.secure.v1';
my $consumer = 'payments-secure';
my $nworkers = 2;

my $kafka = start_kafka(secure => 1);
kafka_cluster($kafka, 'topic', $topic, 3);
my $wrong = 'wrong-' . join('', map { sprintf('%02x', int(rand(256))) } 1 .. 12);
isnt($wrong, $kafka->{password}, 'the wrong password differs from the right one');

# The node reaches Kafka only through the SASL_SSL listener.  It starts
# without credentials (its first connections fail their TLS handshake);
# set_kafka_credentials gives them.  log_min_messages = debug1 so that
# librdkafka's informational logs reach the server log too, for the
# password check.
my $node = obx_node('sasl_ssl', { bootstrap => $kafka->{secure_bootstrap} },
	'obx.workers' => $nworkers,
	'obx.consumer_workers' => 1,
	'obx.delivery_timeout' => "'3s'",
	'log_min_messages' => 'debug1');
wait_consumer_pids($node, 1);

sub q1 { $node->safe_psql('postgres', $_[0]) }

create_effects($node);
q1(qq{SELECT obx.subscribe('$consumer', ARRAY['$topic'], 'shop.record(obx.inbound_event)')});

############################################################################
# 0. A CA file librdkafka cannot read: the producer cannot be built.  The
#    relay says why in obx.workers and keeps running (it used to crash in
#    librdkafka when cleaning up after the failed rd_kafka_new()).
############################################################################
my $relays_before = relay_pids($node);
set_kafka_credentials($node,
	sasl_ssl_properties($kafka, 'ssl.ca.location' => '/nonexistent/obx-test-ca.pem'));
ok($node->poll_query_until('postgres', qq{
	SELECT count(*) = $nworkers FROM obx.workers
	 WHERE state = 'broker down' AND last_error LIKE 'ssl.ca.location failed%'}),
	'an unreadable CA file: each relay shows "broker down" and the reason in obx.workers');
is_deeply(relay_pids($node), $relays_before, 'the relays kept running');

set_kafka_credentials($node, sasl_ssl_properties($kafka));

# enqueue_round($tag, $n): $n events on keys pay_1..pay_6 over a few
# transactions, and one rolled-back transaction; returns the committed ids.
sub enqueue_round
{
	my ($tag, $n) = @_;
	my $sql = "BEGIN;\n";
	for my $i (1 .. $n)
	{
		$sql .= sprintf("SELECT obx.enqueue('%s', 'pay_%d', jsonb_build_object('round', '%s', 'i', %d));\n",
			$topic, 1 + $i % 6, $tag, $i);
		$sql .= "COMMIT;\nBEGIN;\n" if $i % 7 == 0;
	}
	$sql .= "COMMIT;\n";
	$sql .= "BEGIN;\nSELECT obx.enqueue('$topic', 'pay_1', '{\"rolled\": \"back\"}');\nROLLBACK;\n";
	q1($sql);
	return [ split /\n/, q1(qq{SELECT id FROM obx.outbox_events
		 WHERE topic = '$topic' AND payload->>'round' = '$tag' ORDER BY seq}) ];
}

# The consumer's effects: every committed event of the topic applied
# exactly once, and per key in enqueue order.
sub consumer_applied_each_once
{
	my ($what) = @_;
	my @ids = split /\n/, q1("SELECT id FROM obx.outbox_events WHERE topic = '$topic'");
	ok($node->poll_query_until('postgres', qq{
		SELECT count(DISTINCT event_id) = @{[ scalar(@ids) ]} FROM shop.effects WHERE topic = '$topic'}),
		"$what: the consumer applied every committed event");
	wait_caught_up($node, $consumer, $topic, partition_ends($kafka, $topic), $what);
	is_deeply(effects_per_event($node), { map { $_ => 1 } @ids },
		"$what: each committed event applied exactly once, nothing else");
	my %order;
	for my $line (split /\n/, q1('SELECT event_key, event_id FROM shop.effects ORDER BY n'))
	{
		my ($k, $id) = split /\|/, $line;
		push @{ $order{$k} }, $id;
	}
	is_deeply(\%order, committed_ids($node, "topic = '$topic'"),
		"$what: per key, the consumer applied the events in enqueue order");
}

############################################################################
# 1. Publish and consume through SASL_SSL.
############################################################################
my $round1 = enqueue_round('r1', 40);
broker_holds_exactly($kafka, $node, $topic, [ q1_ids() ], "topic = '$topic'");
ok(all_published($node), 'every event is marked published');
consumer_applied_each_once('through SASL_SSL');

sub q1_ids { split /\n/, q1("SELECT id FROM obx.outbox_events WHERE topic = '$topic'") }

############################################################################
# 2. A wrong password.
############################################################################
my $offset = -s $node->logfile;
set_kafka_credentials($node, sasl_ssl_properties($kafka, 'sasl.password' => $wrong));
my $round2 = enqueue_round('r2', 30);

ok($node->poll_query_until('postgres', q{
	SELECT count(*) > 0 FROM obx.workers
	 WHERE state = 'broker down' AND last_error LIKE '_AUTHENTICATION: %Authentication failed%'}),
	'obx.workers shows a relay in state "broker down" with the authentication failure');
note('obx.workers: ' . q1(q{SELECT string_agg(worker || ' ' || state || ': ' || coalesce(last_error, ''), '; ') FROM obx.workers}));
ok(wait_until(sub {
	my $log = slurp_file($node->logfile, $offset);
	$log =~ /WARNING:  obx Kafka error _AUTHENTICATION: .*Authentication failed/
	  && $log =~ /WARNING:  obx consumer \d+, consumer group "\Q$consumer\E": Kafka error: _AUTHENTICATION: .*Authentication failed/;
}, 'the authentication failure in the log'),
	'the server log shows the authentication failure, for the relay and for the consumer');

# Events committed meanwhile time out (obx.delivery_timeout = 3s) and are
# retried, never quarantined.
my $ids2 = join(',', map { "'$_'" } @$round2);
ok($node->poll_query_until('postgres', qq{
	SELECT count(*) > 0 FROM obx.outbox_events
	 WHERE id IN ($ids2) AND last_error_class = 'transient' AND attempts >= 1}),
	'events of the outage fail their delivery, as transient');
is(q1(qq{SELECT count(*) FROM obx.outbox_events WHERE id IN ($ids2)
		  AND (published_at IS NOT NULL OR quarantined_at IS NOT NULL)}),
	'0', 'none of them is published or quarantined');
{
	my $seen = event_ids_at_broker(read_topic($kafka, $topic));
	is(scalar(grep { $seen->{$_} } @$round2), 0, 'none of them reached the broker');
}
secret_nowhere($node, $wrong, 'the wrong password');
secret_nowhere($node, $kafka->{password}, 'the right password');

############################################################################
# 3. The right password again.
############################################################################
set_kafka_credentials($node, sasl_ssl_properties($kafka));
my $round3 = enqueue_round('r3', 10);
broker_holds_exactly($kafka, $node, $topic, [ q1_ids() ], "topic = '$topic'");
ok(all_published($node), 'every event is marked published');
is(q1('SELECT count(*) FROM obx.quarantine'), '0', 'nothing was quarantined');
consumer_applied_each_once('after the outage');
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 0 FROM obx.workers WHERE state = 'broker down'}),
	'no relay shows "broker down" any more');

secret_nowhere($node, $wrong, 'the wrong password, at the end');
secret_nowhere($node, $kafka->{password}, 'the right password, at the end');

done_testing();
