# Window 4: a poison event.  An event Kafka will never accept is
# quarantined with its error (class permanent) while every other key keeps
# flowing; the later events of its own key wait behind it
# (obx.quarantine_blocks_key = on, the default); once the cause is removed,
# obx.retry publishes it, and its key's later events follow in order.
#
# The poison is deterministic: the producer's own size limit.
# obx.kafka_properties = 'message.max.bytes=20000' with
# obx.max_payload_size = 1MB lets enqueue accept a ~50 KB payload that
# librdkafka refuses (MSG_SIZE_TOO_LARGE).  Raising the limit with ALTER
# SYSTEM and a reload (the relay rebuilds its producer) removes the cause.
#
# Also: with obx.quarantine_blocks_key = off a quarantined event no longer
# holds back its key; a permanent error returned by the broker itself
# (the stand-in's produce-errors) quarantines through the delivery-report
# path; and the stand-in's topic-error, which librdkafka 2.0.2 only ever
# reports as a delivery timeout, is a transient topic outage: never
# quarantined, other topics flow, and it heals without an operator.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $nworkers = 2;
my $topic = 'accounts.v1';
my $mock = start_mock();
my $node = obx_node('poison', $mock,
	'obx.workers' => $nworkers,
	'obx.kafka_properties' => "'message.max.bytes=20000'",
	'obx.max_payload_size' => "'1MB'",
	'obx.delivery_timeout' => "'2s'",
	'obx.max_attempts' => 1);

my $poison_payload = q{jsonb_build_object('poison', true, 'blob', repeat('x', 50000))};
my %label;		# event id => label, for messages

# events($sql): run statements that return rows "label|event id"; returns
# a hash label => id.
sub events
{
	my ($sql) = @_;
	my %ids;
	for my $line (split /\n/, $node->safe_psql('postgres', $sql))
	{
		my ($l, $id) = split /\|/, $line;
		$ids{$l} = $id;
		$label{$id} = $l;
	}
	return \%ids;
}

sub enqueue_sql
{
	my ($label, $t, $key, $payload) = @_;
	$payload //= "jsonb_build_object('label', '$label')";
	return "SELECT '$label', obx.enqueue('$t', '$key', $payload);\n";
}

# Fillers: $n transactions on keys acct_1..acct_8, one event each.
my $filler_no = 0;
sub fillers
{
	my ($n, $t) = @_;
	$t //= $topic;
	my $sql = '';
	for (1 .. $n)
	{
		$filler_no++;
		$sql .= enqueue_sql("f$filler_no", $t, 'acct_' . (1 + $filler_no % 8));
	}
	return events($sql);
}

sub q1 { $node->safe_psql('postgres', $_[0]) }
sub in_list { join(',', map { "'$_'" } @_) }

# Wait until every event but the given ones is published: a barrier.
# Claims take events in seq order, so once events enqueued after a held
# event are published, the held one would have been published too had it
# been claimable.
sub all_published_except
{
	my ($what, @held) = @_;
	return $node->poll_query_until('postgres', qq{
		SELECT count(*) = 0 FROM obx.outbox_events
		 WHERE published_at IS NULL AND id NOT IN (@{[ in_list(@held) ]})})
	  || diag("barrier failed: $what");
}

sub at_broker
{
	my ($t) = @_;
	return event_ids_at_broker(read_topic($mock, $t));
}

# reload_relays(@statements): ALTER SYSTEM, reload, and wait until every
# relay runs on the new settings.  A relay logs "Kafka settings changed"
# when it processes the reload between database steps, and rebuilds its
# producer before its next claim; so once each relay has logged that and
# then finished two more database steps (a claim at least: the purge runs
# once in 10 s), every later claim uses the new producer.
sub reload_relays
{
	my (@statements) = @_;
	my $offset = -s $node->logfile;
	q1(join('', map { "$_;\n" } @statements) . 'SELECT pg_reload_conf();');
	wait_until(sub {
		my $log = slurp_file($node->logfile, $offset);
		my %w = map { $_ => 1 }
		  ($log =~ /obx relay (\d+): Kafka settings changed, rebuilding the producer/g);
		scalar(keys %w) >= $nworkers;
	}, 'every relay to take the new Kafka settings');
	my $since = q1('SELECT clock_timestamp()');
	my %steps;
	wait_until(sub {
		for my $line (split /\n/, q1(qq{
			SELECT pid, state_change FROM pg_stat_activity
			 WHERE backend_type = 'obx relay' AND state = 'idle'
			   AND state_change > '$since'}))
		{
			my ($pid, $ts) = split /\|/, $line;
			$steps{$pid}{$ts} = 1;
		}
		scalar(grep { keys %{ $steps{$_} } >= 2 } keys %steps) >= $nworkers;
	}, 'every relay to run two steps on the new settings');
}

# Broker order of the given ids among the messages of a topic.
sub broker_order
{
	my ($msgs, @ids) = @_;
	my %want = map { $_ => 1 } @ids;
	my (@order, %seen);
	for my $m (sort { $a->{partition} <=> $b->{partition} || $a->{offset} <=> $b->{offset} } @$msgs)
	{
		next unless $want{ $m->{event_id} } && !$seen{ $m->{event_id} }++;
		push @order, $label{ $m->{event_id} };
	}
	return join(' ', @order);
}

############################################################################
# 1. Poison events quarantined, their keys held, everything else flows.
############################################################################

# Key A: the poison and a later event of its key in one transaction (one
# batch: the later event must be held back inside the batch), with events
# of other keys between them.
my $ka = events(
	"BEGIN;\n"
	  . enqueue_sql('A1', $topic, 'acct_A', $poison_payload)
	  . enqueue_sql('x1', $topic, 'acct_1')
	  . enqueue_sql('x2', $topic, 'acct_2')
	  . enqueue_sql('A2', $topic, 'acct_A')
	  . "COMMIT;\n");
fillers(20);
# Key B: the poison alone; its later event comes once it is quarantined
# (it must be held back by the claim).
my $kb = events(enqueue_sql('B1', $topic, 'acct_B', $poison_payload));
fillers(20);

ok($node->poll_query_until('postgres', qq{
	SELECT count(*) = 2 FROM obx.quarantine WHERE id IN (@{[ in_list($ka->{A1}, $kb->{B1}) ]})}),
	'both poison events are quarantined');
$kb = { %$kb, %{ events(enqueue_sql('B2', $topic, 'acct_B')) } };
fillers(20);
ok(all_published_except('part 1', $ka->{A1}, $ka->{A2}, $kb->{B1}, $kb->{B2}),
	'every event of the other keys, before and after the poison, is published');

is(q1(qq{SELECT string_agg(event_key || ' ' || last_error_class || ' ' || attempts, ', ' ORDER BY event_key)
		   FROM obx.quarantine WHERE topic = '$topic'}),
	'acct_A permanent 1, acct_B permanent 1',
	'obx.quarantine shows exactly the two poison events, class permanent, after one attempt');
like(q1("SELECT last_error FROM obx.quarantine WHERE id = '$ka->{A1}'"),
	qr/^MSG_SIZE_TOO_LARGE: .* \(refused by librdkafka, not sent\)$/,
	'the quarantine shows the error: MSG_SIZE_TOO_LARGE, refused by librdkafka itself');
is(q1(qq{SELECT count(*) FROM obx.outbox_events
		  WHERE id IN (@{[ in_list($ka->{A2}, $kb->{B2}) ]})
			AND published_at IS NULL AND quarantined_at IS NULL AND last_error IS NULL}),
	'2', 'the later events of keys A and B wait, unpublished, never failed');
is(q1("SELECT quarantined FROM obx.status WHERE topic = '$topic'"), '2',
	'obx.status counts two quarantined events');
is(q1(q{SELECT count(*) > 0 FROM obx.workers WHERE last_error LIKE '%MSG_SIZE_TOO_LARGE%'}),
	't', 'obx.workers shows the error');
ok($node->log_contains(qr/obx quarantined event $ka->{A1} of topic \Q$topic\E/),
	'the log names the quarantined event and its topic');
ok(!$node->log_contains(qr/x{200}/), 'the log never shows the payload');
{
	my $msgs = read_topic($mock, $topic);
	my $seen = event_ids_at_broker($msgs);
	is(scalar(grep { $seen->{$_} } $ka->{A1}, $ka->{A2}, $kb->{B1}, $kb->{B2}), 0,
		'neither the poison events nor their keys\' later events reached the broker');
	my $expected = committed_ids($node,
		"id NOT IN (@{[ in_list($ka->{A1}, $ka->{A2}, $kb->{B1}, $kb->{B2}) ]})");
	is_deeply([ sort keys %$seen ], [ sort map { @$_ } values %$expected ],
		'the broker holds every other committed event');
	is_deeply(first_occurrences($msgs), $expected,
		'per key, broker order equals enqueue order for the other keys');
}

############################################################################
# 2. Remove the cause, retry: the poison is published, then its key.
############################################################################
reload_relays(q{ALTER SYSTEM SET obx.kafka_properties = 'message.max.bytes=1000000'});
is(q1("SELECT obx.retry('$ka->{A2}')"), 'f',
	'retry of an event that is merely waiting does nothing');
is(q1("SELECT obx.retry('$ka->{A1}')"), 't', 'obx.retry accepts poison A');
is(q1("SELECT obx.retry('$kb->{B1}')"), 't', 'obx.retry accepts poison B');
ok(all_published($node), 'after the retry every event is published');
is(q1('SELECT count(*) FROM obx.quarantine'), '0', 'the quarantine is empty');
{
	my $msgs = read_topic($mock, $topic);
	is(broker_order($msgs, $ka->{A1}, $ka->{A2}), 'A1 A2',
		'key A: the retried poison reached the broker, then the later event');
	is(broker_order($msgs, $kb->{B1}, $kb->{B2}), 'B1 B2',
		'key B: the retried poison reached the broker, then the later event');
	my $expected = committed_ids($node, "topic = '$topic'");
	is_deeply([ sort keys %{ event_ids_at_broker($msgs) } ],
		[ sort map { @$_ } values %$expected ],
		'the broker holds exactly the committed events');
	is_deeply(first_occurrences($msgs), $expected,
		'per key, broker order equals enqueue order, poison keys included');
}

############################################################################
# 3. obx.quarantine_blocks_key = off: a quarantined event holds nothing.
############################################################################
reload_relays(q{ALTER SYSTEM SET obx.kafka_properties = 'message.max.bytes=20000'},
	q{ALTER SYSTEM SET obx.quarantine_blocks_key = off});
my $kc = events(
	"BEGIN;\n"
	  . enqueue_sql('C1', $topic, 'acct_C', $poison_payload)
	  . enqueue_sql('C2', $topic, 'acct_C')
	  . "COMMIT;\n");
my $kd = events(enqueue_sql('D1', $topic, 'acct_D', $poison_payload));
ok($node->poll_query_until('postgres', qq{
	SELECT count(*) = 2 FROM obx.quarantine WHERE id IN (@{[ in_list($kc->{C1}, $kd->{D1}) ]})}),
	'poison events C1 and D1 are quarantined');
$kd = { %$kd, %{ events(enqueue_sql('D2', $topic, 'acct_D')) } };
fillers(10);
ok(all_published_except('part 3', $kc->{C1}, $kd->{D1}),
	'with quarantine_blocks_key off, the later events of the poison keys are published');
is(q1(qq{SELECT count(*) FROM obx.quarantine WHERE id IN (@{[ in_list($kc->{C1}, $kd->{D1}) ]})}),
	'2', 'while the poison events stay quarantined');

reload_relays(q{ALTER SYSTEM SET obx.kafka_properties = 'message.max.bytes=1000000'},
	q{ALTER SYSTEM RESET obx.quarantine_blocks_key});
is(q1("SELECT obx.retry_quarantined('$topic')"), '2',
	'obx.retry_quarantined retries both');
ok(all_published($node), 'every event is published');
{
	my $msgs = read_topic($mock, $topic);
	is(broker_order($msgs, $kc->{C1}, $kc->{C2}), 'C2 C1',
		'key C: the later event went first, as blocks_key = off allows');
	is(broker_order($msgs, $kd->{D1}, $kd->{D2}), 'D2 D1',
		'key D: the later event went first, as blocks_key = off allows');
	my $expected = committed_ids($node, "topic = '$topic'");
	is_deeply([ sort keys %{ event_ids_at_broker($msgs) } ],
		[ sort map { @$_ } values %$expected ],
		'the broker holds exactly the committed events');
	delete $expected->{$_} for qw(acct_C acct_D);
	my $got = first_occurrences($msgs);
	delete $got->{$_} for qw(acct_C acct_D);
	is_deeply($got, $expected, 'per key, broker order equals enqueue order for every other key');
}

############################################################################
# 4. A permanent error from the broker (delivery-report path).
#
# The stand-in fails the next Produce request with
# TOPIC_AUTHORIZATION_FAILED.  That error is topic-wide: the producer that
# received it also refuses its next messages to the topic at once, for
# about a second (until its metadata refresh), so other keys of the same
# topic may be quarantined too and an immediate retry may be refused
# again.  Deterministic: the event is quarantined as permanent, the later
# event of its key waits, other topics flow, and retrying the topic's
# quarantine publishes everything, in key order.
############################################################################
ok(all_published($node), 'nothing in flight');
mock_cmd($mock, 'produce-errors 1 TOPIC_AUTHORIZATION_FAILED');
my $s = events(enqueue_sql('S1', 'secret.v1', 'sec_1'));
ok($node->poll_query_until('postgres',
	"SELECT count(*) = 1 FROM obx.quarantine WHERE id = '$s->{S1}'"),
	'an event the broker refuses with TOPIC_AUTHORIZATION_FAILED is quarantined');
is(q1("SELECT last_error_class || ' ' || split_part(last_error, ':', 1) FROM obx.quarantine WHERE id = '$s->{S1}'"),
	'permanent TOPIC_AUTHORIZATION_FAILED', 'class permanent, with the broker\'s error');
$s = { %$s, %{ events(enqueue_sql('S2', 'secret.v1', 'sec_1')) } };
fillers(5);
ok(all_published_except('part 4', $s->{S1}, $s->{S2}), 'other topics flow');
is(q1("SELECT published_at IS NULL AND quarantined_at IS NULL FROM obx.outbox_events WHERE id = '$s->{S2}'"),
	't', 'the later event of the refused key waits');
my $retries = 0;
wait_until(sub {
	if (q1(q{SELECT count(*) FROM obx.quarantine WHERE topic = 'secret.v1'}) > 0)
	{
		$retries++ if q1(q{SELECT obx.retry_quarantined('secret.v1')}) > 0;
	}
	q1(q{SELECT count(*) = 0 FROM obx.outbox_events
		  WHERE topic = 'secret.v1' AND published_at IS NULL}) eq 't';
}, 'the retried events of secret.v1 to be published');
ok($retries >= 1, "obx.retry_quarantined('secret.v1') made them publishable ($retries call(s))");
ok(all_published($node), 'every event is published');
{
	my $msgs = read_topic($mock, 'secret.v1');
	is(broker_order($msgs, $s->{S1}, $s->{S2}), 'S1 S2',
		'key sec_1: the retried event reached the broker, then the later one');
	my $expected = committed_ids($node, "topic = 'secret.v1'");
	is_deeply([ sort keys %{ event_ids_at_broker($msgs) } ],
		[ sort map { @$_ } values %$expected ],
		'secret.v1 at the broker holds exactly the committed events');
	is_deeply(first_occurrences($msgs), $expected,
		'secret.v1 per key, broker order equals enqueue order');
}

############################################################################
# 5. The stand-in's topic-error: a transient topic outage, not a poison.
#
# The mock answers metadata for a topic in error with the error and its
# partitions; librdkafka 2.0.2 then keeps the topic's messages unassigned
# until message.timeout.ms and reports _MSG_TIMED_OUT, so no permanent
# error is ever seen (a real broker sends no partitions with
# TOPIC_AUTHORIZATION_FAILED and librdkafka fails the messages with it).
# What holds: a failing topic is retried without limit and without
# quarantine (obx.max_attempts = 1), the other topics keep flowing, and
# the events go out by themselves once the topic is healthy again.
############################################################################
mock_cmd($mock, 'topic-error vault.v1 TOPIC_AUTHORIZATION_FAILED');
my $v = events(enqueue_sql('V1', 'vault.v1', 'v_1'));
fillers(10);
ok($node->poll_query_until('postgres', qq{
	SELECT (SELECT attempts >= 2 AND last_error_class IS NOT NULL
			  FROM obx.outbox_events WHERE id = '$v->{V1}')
	   AND (SELECT count(*) = 0 FROM obx.outbox_events
			 WHERE topic <> 'vault.v1' AND published_at IS NULL)}),
	'the event of the failing topic failed twice while every other topic flowed');
is(q1("SELECT last_error_class || ' ' || (quarantined_at IS NULL) FROM obx.outbox_events WHERE id = '$v->{V1}'"),
	'transient true', 'it is classified transient and not quarantined (obx.max_attempts = 1)');
note 'topic outage error: ' . q1("SELECT last_error FROM obx.outbox_events WHERE id = '$v->{V1}'");
mock_cmd($mock, 'topic-error vault.v1 NO_ERROR');
ok(all_published($node), 'once the topic is healthy the event is published, no retry needed');
is_deeply([ keys %{ at_broker('vault.v1') } ], [ $v->{V1} ],
	'vault.v1 at the broker holds its event');
is(q1('SELECT count(*) FROM obx.quarantine'), '0', 'nothing is left in quarantine');

done_testing();
