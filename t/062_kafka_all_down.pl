# Window: every broker of a real Kafka cluster down (kill -9 of all three
# nodes) for longer than obx.delivery_timeout, then back.
#
# Guarantees 2, 4 and 5 against real Apache Kafka (tools/kafka-cluster):
# the application keeps committing while the cluster is gone, and no
# commit waits on it (every application statement runs under
# statement_timeout, so one that blocked would fail the test, and each is
# timed); the failed attempts are transient, so nothing is quarantined
# (obx.max_attempts = 1 would quarantine a misclassified failure at once)
# and nothing is marked published; once the cluster is back, every
# committed event reaches it, the broker's id set equals the committed set,
# and per key the broker order is the enqueue order.
#
# It also measures how long after the cluster is back (every partition of
# the topic has a leader and two replicas in sync, as an independent client
# sees it) the backlog starts moving: the first published_at of an event
# committed during the outage.  That is printed, not asserted.  With
# librdkafka's default reconnect backoff (up to 10 s) or a relay backoff
# after timed-out attempts (up to obx.backoff_max) it would be seconds.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use ObxKafkaChecks;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $t0 = time();
my $topic = 'orders.all_down.v1';
my $nkeys = 12;

# A statement of the application that took this long would have waited on
# something; a wait on Kafka would take a delivery timeout or more.
my $statement_timeout_ms = 2000;

my $kafka = start_kafka(nodes => 3);
kafka_cluster($kafka, 'topic', $topic, 6);
note sprintf('cluster up and topic created after %.1f s', time() - $t0);

# obx.delivery_timeout is librdkafka's message.timeout.ms: an attempt
# fails (transient, _MSG_TIMED_OUT) after 1 s with the brokers gone.  The
# backoff settings are obx's defaults (up to a minute between attempts),
# so the measured delay is what a default installation sees.
my $node = obx_node('kafka_all_down', $kafka,
	'obx.workers' => 2,
	'obx.batch_size' => 500,
	'obx.delivery_timeout' => "'1s'",
	'obx.backoff_min' => "'100ms'",
	'obx.backoff_max' => "'60s'",
	'obx.max_attempts' => 1);
relay_ready($node, 2);

my %committed;
my $n = 0;
my $slowest = 0;

# app_transactions($what, $count): $count application transactions in one
# psql session, each enqueueing two events on two keys, every statement
# under statement_timeout and timed.  Returns the committed ids.
sub app_transactions
{
	my ($what, $count) = @_;
	my $sql = "SET statement_timeout = '${statement_timeout_ms}ms';\n\\timing on\n";
	for (1 .. $count)
	{
		$sql .= "BEGIN;\n";
		for (1 .. 2)
		{
			$n++;
			my $key = 'ord_' . ($n % $nkeys);
			$sql .= "SELECT obx.enqueue('$topic', '$key', '{\"n\": $n}');\n";
		}
		$sql .= "COMMIT;\n";
	}
	my ($ret, $out, $err) = $node->psql('postgres', $sql, on_error_stop => 1);
	is($ret, 0, "$what: $count application transactions committed") or diag($err);
	my @ids;
	my $slow = 0;
	for my $line (split /\n/, $out)
	{
		if ($line =~ /^Time: ([\d.]+) ms/)
		{
			$slow = $1 if $1 > $slow;
		}
		elsif ($line =~ /^[0-9a-f]{8}-[0-9a-f]{4}-/)
		{
			push @ids, $line;
			$committed{$line} = 1;
		}
	}
	is(scalar(@ids), 2 * $count, "$what: every enqueue returned its id");
	note sprintf('%s: slowest statement %.1f ms', $what, $slow);
	$slowest = $slow if $slow > $slowest;
	return @ids;
}

# Warm-up: the producers know the topic and its leaders before the outage.
app_transactions('warm-up', 5);
ok(all_published($node), 'warm-up events published');

for my $id (1 .. 3)
{
	kafka_cluster($kafka, 'kill', $id);
}
my $t_down = time();
note 'all three brokers killed';

my @outage = app_transactions('outage, first wave', 30);

# The outage lasts beyond obx.delivery_timeout: wait until attempts have
# timed out and been retried (an event on its third attempt), or an event
# was quarantined instead (which fails the checks below), and a worker
# reports the brokers down.
my $outage_ids = in_list(@outage);
$node->poll_query_until('postgres', qq{
	SELECT bool_or(attempts >= 2 OR quarantined_at IS NOT NULL)
	  FROM obx.outbox_events WHERE id IN ($outage_ids)})
  or die 'the outage events were never attempted twice';
$node->poll_query_until('postgres',
	"SELECT count(*) > 0 FROM obx.workers WHERE state = 'broker down'")
  or die 'no worker reported the brokers down';

push @outage, app_transactions('outage, second wave', 30);
$outage_ids = in_list(@outage);

# Let the second wave meet the dead cluster too (unless something was
# quarantined, which holds its key's later events back).
$node->poll_query_until('postgres', qq{
	SELECT count(*) FILTER (WHERE last_error_class IS NOT NULL) >= $nkeys
	    OR (SELECT count(*) > 0 FROM obx.outbox_events WHERE quarantined_at IS NOT NULL)
	  FROM obx.outbox_events WHERE id IN (@{[ in_list(@outage[60 .. $#outage]) ]})})
  or die 'the second wave was never attempted';

is($node->safe_psql('postgres',
	"SELECT count(*) FROM obx.outbox_events WHERE id IN ($outage_ids) AND published_at IS NOT NULL"),
	'0', 'nothing enqueued during the outage is marked published');
is($node->safe_psql('postgres',
	'SELECT count(*) FROM obx.outbox_events WHERE quarantined_at IS NOT NULL'),
	'0', 'nothing is quarantined: every failure was transient (obx.max_attempts = 1)');
is($node->safe_psql('postgres', q{
	SELECT string_agg(DISTINCT last_error_class, ',') FROM obx.outbox_events
	 WHERE last_error_class IS NOT NULL}),
	'transient', 'every recorded failure is classified transient');
note 'errors seen: ' . $node->safe_psql('postgres', q{
	SELECT string_agg(DISTINCT last_error, '; ') FROM obx.outbox_events
	 WHERE last_error IS NOT NULL});
note 'attempts of the outage events: ' . $node->safe_psql('postgres', qq{
	SELECT min(attempts) || ' to ' || max(attempts)
	  FROM obx.outbox_events WHERE id IN ($outage_ids)});
cmp_ok($slowest, '<', $statement_timeout_ms,
	sprintf('no application statement waited on Kafka (slowest %.1f ms)', $slowest));

# The cluster comes back.  It can take the backlog (acks=all) once every
# partition of the topic has a leader and min.insync.replicas (2) replicas
# in sync: that moment is found by asking for the topic's metadata with
# kcat, an independent client, as often as it answers.
my $t_restart = time();
note sprintf('outage lasted %.1f s', $t_restart - $t_down);
for my $id (1 .. 3)
{
	kafka_cluster($kafka, 'restart', $id);
}
my $t_writable;
wait_until(sub { topic_writable($kafka, $topic, 6) and $t_writable = time() },
	'every partition of the topic to have a leader and two replicas in sync');
kafka_cluster($kafka, 'wait', 3);
my $t_all = time();
note sprintf('the topic writable %.1f s after the restart began, all three brokers serving metadata %.1f s after that',
	$t_writable - $t_restart, $t_all - $t_writable);
$node->poll_query_until('postgres', qq{
	SELECT count(*) > 0 FROM obx.outbox_events
	 WHERE id IN ($outage_ids) AND published_at IS NOT NULL})
  or die 'nothing of the backlog was published after the cluster came back';
my $first = $node->safe_psql('postgres', qq{
	SELECT extract(epoch FROM min(published_at)) FROM obx.outbox_events
	 WHERE id IN ($outage_ids)});
ok(all_published($node), 'every event is published once the cluster is back');
my $last = $node->safe_psql('postgres', qq{
	SELECT extract(epoch FROM max(published_at)) FROM obx.outbox_events
	 WHERE id IN ($outage_ids)});
diag sprintf('backlog of %d events: first acknowledged %.3f s, last %.3f s after the cluster could take it',
	scalar(@outage), $first - $t_writable, $last - $t_writable);

is($node->safe_psql('postgres',
	'SELECT count(*) FROM obx.outbox_events WHERE quarantined_at IS NOT NULL'),
	'0', 'still nothing quarantined');
my $msgs = broker_holds_exactly($kafka, $node, $topic, [ keys %committed ]);
my $seen = event_ids_at_broker($msgs);
my $dups = copies_agree($msgs, $topic);

note sprintf('%d messages, %d distinct events, %d duplicates; wall time %.1f s',
	scalar(@$msgs), scalar(keys %$seen), $dups, time() - $t0);

done_testing();
