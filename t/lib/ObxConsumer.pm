# ObxConsumer.pm: shared pieces of the consumer (inbox) tests: t/04*,
# t/065, the security tests of handlers and subscriptions (t/07*,
# t/08*), and the daemon's subscriptions (t/101, t/102).
#
# Starts a consumer test's node (consumer_node), creates its handler and
# subscription (handler, subscribe), produces crafted messages to the
# Kafka stand-in with kcat (headers, keys, explicit partitions, payloads
# that are not JSON, tombstones), creates the tables a test handler
# records its effects in, and reads the consumer's progress back from
# obx.consumer_status.  Every wait is on a condition, with the harness
# timeout as the limit (ObxTest::wait_until, poll_query_until).
package ObxConsumer;

use strict;
use warnings;

use Exporter 'import';
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Utils;
use Test::More;
use ObxTest;

our @EXPORT = qw(consumer_node handler subscribe produce sku_message partition_ends wait_caught_up consumer_totals
  partition_status create_effects effects_per_event handler_calls
  consumer_pids wait_consumer_pids handler_held find_message group_offsets);

# consumer_node($name, $broker, %opt): the node of a consumer test, at a
# stand-in or a real Kafka cluster; returns it once its consumer workers
# run (and its relay workers, if any, are idle).  Options:
#   topics     { topic => partitions }, created at the broker first
#   relays     obx.workers (default 0: no relay)
#   consumers  obx.consumer_workers (default 1)
#   conf       { setting => value }, more settings (see ObxTest::obx_node)
#   effects    create_effects on it (default 1)
sub consumer_node
{
	my ($name, $broker, %opt) = @_;
	my $topics = $opt{topics} // {};
	create_topic($broker, $_, $topics->{$_}) for sort keys %$topics;
	my $relays = $opt{relays} // 0;
	my $consumers = $opt{consumers} // 1;
	my $node = obx_node($name, $broker,
		'obx.workers' => $relays,
		'obx.consumer_workers' => $consumers,
		%{ $opt{conf} // {} });
	relay_ready($node, $relays) if $relays > 0;
	wait_consumer_pids($node, $consumers);
	create_effects($node) if $opt{effects} // 1;
	return $node;
}

# handler($node, 'shop.reserve', $body, %opt): create the handler function
# shop.reserve(e obx.inbound_event) in PL/pgSQL, $body between its BEGIN
# and END; returns its signature for subscribe.  Options: declare (its
# DECLARE section), set ('statement_timeout = 0': a SET clause), as (the
# role that creates it, by SET ROLE).
sub handler
{
	my ($node, $name, $body, %opt) = @_;
	my $set = $opt{set} ? " SET $opt{set}" : '';
	my $declare = $opt{declare} ? "DECLARE\n$opt{declare}\n\t" : '';
	my $role = $opt{as} ? "SET ROLE $opt{as};\n" : '';
	$node->safe_psql('postgres', qq{$role
	CREATE FUNCTION $name(e obx.inbound_event) RETURNS void
	LANGUAGE plpgsql$set AS \$obx_handler\$
	${declare}BEGIN
$body
	END
	\$obx_handler\$;});
	return "$name(obx.inbound_event)";
}

# subscribe($node, $consumer, \@topics, $handler, %opt): obx.subscribe,
# by the role $opt{as} if given (SET ROLE), else by the superuser.
# $opt{kafka} holds the subscription's Kafka properties; the default,
# session.timeout.ms 6000, lets a rebalance (a member joining, or one that
# died leaving) complete in seconds.  Any other option goes into the
# options as given (handler_timeout_ms => 1000).
sub subscribe
{
	my ($node, $consumer, $topics, $handler, %opt) = @_;
	my $role = delete $opt{as};
	my $kafka = delete $opt{kafka} // { 'session.timeout.ms' => 6000 };
	my %options = (%opt, kafka => { map { $_ => "$kafka->{$_}" } keys %$kafka });
	my $json = JSON::PP->new->canonical->encode(\%options);
	my $list = join(', ', map { "'$_'" } @$topics);
	$node->safe_psql('postgres', ($role ? "SET ROLE $role;\n" : '')
		  . "SELECT obx.subscribe('$consumer', ARRAY[$list], '$handler', '$json')");
	return;
}

# produce($mock, $topic, @messages): produce each message with kcat, in
# the order given, and wait for the broker to acknowledge them.  A message
# is a hash:
#   partition  the partition (required: tests choose where a message lands)
#   key        the Kafka key (undef: no key)
#   headers    [ name => value, ... ] Kafka headers, in that order
#   payload    the value as a string; undef sends a tombstone (NULL value,
#              which needs a key); '' sends an empty value
# Consecutive messages with the same partition and headers go in one kcat
# run, and a run's messages in one produce request (linger.ms 200: kcat
# reads its input in far less), so that one fetch brings them all: the
# stand-in returns one record batch per partition and fetch, and a consumer
# batch gathers only what has been fetched (t/045).  Payloads and keys must
# not contain a newline (kcat splits input lines) and keys no tab (the key
# delimiter).
sub produce
{
	my ($mock, $topic, @messages) = @_;
	my @runs;
	for my $m (@messages)
	{
		die 'produce: partition required' unless defined $m->{partition};
		die 'produce: a tombstone needs a key'
		  if !defined $m->{payload} && !defined $m->{key};
		die 'produce: newline in payload or key'
		  if grep { defined && /\n/ } $m->{payload}, $m->{key};
		die 'produce: tab in key' if defined $m->{key} && $m->{key} =~ /\t/;
		my @h = @{ $m->{headers} // [] };
		my $sig = join("\0", $m->{partition}, defined $m->{key} ? 'k' : 'n',
			defined $m->{payload} ? 'v' : 'z', @h);
		if (!@runs || $runs[-1]{sig} ne $sig)
		{
			push @runs, { sig => $sig, msg => [] };
		}
		push @{ $runs[-1]{msg} }, $m;
	}
	for my $run (@runs)
	{
		my $first = $run->{msg}[0];
		my @cmd = ('kcat', '-P', '-b', $mock->{bootstrap}, '-t', $topic,
			'-p', $first->{partition}, '-X', 'acks=all', '-X', 'linger.ms=200');
		my @h = @{ $first->{headers} // [] };
		while (my ($name, $value) = splice(@h, 0, 2))
		{
			push @cmd, '-H', "$name=$value";
		}
		my $input = '';
		if (defined $first->{key})
		{
			push @cmd, '-K', "\t";
			push @cmd, '-Z' unless defined $first->{payload};
			$input .= "$_->{key}\t" . ($_->{payload} // '') . "\n" for @{ $run->{msg} };
		}
		else
		{
			die 'produce: an empty value needs a key'
			  if grep { $_->{payload} eq '' } @{ $run->{msg} };
			$input .= "$_->{payload}\n" for @{ $run->{msg} };
		}
		my ($out, $err) = ('', '');
		my $ok = IPC::Run::run(\@cmd, '<', \$input, '>', \$out, '2>', \$err,
			IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
		die "kcat -P to $topic failed: $err" if !$ok || $err =~ /error|fail/i;
	}
	return;
}

# sku_message($partition, $id, %extra): a message for produce on that
# partition, keyed sku-$partition, with event id $id in its event_id header
# and a payload {"sku": "sku-$partition", "qty": 1} plus each extra field
# as a string.
sub sku_message
{
	my ($partition, $id, %extra) = @_;
	return { partition => $partition, key => "sku-$partition",
		headers => [ event_id => $id ],
		payload => '{"sku": "sku-' . $partition . '", "qty": 1'
		  . join('', map { qq{, "$_": "$extra{$_}"} } sort keys %extra) . '}' };
}

# partition_ends($mock, $topic): partition => the offset after its last
# message at the broker (its high watermark), from kcat.
sub partition_ends
{
	my ($mock, $topic) = @_;
	my %end;
	for my $m (@{ read_topic($mock, $topic) })
	{
		$end{ $m->{partition} } = $m->{offset} + 1
		  if !defined $end{ $m->{partition} } || $end{ $m->{partition} } <= $m->{offset};
	}
	return \%end;
}

# find_message($mock, $topic, sub { my $m = shift; ... }): the messages
# of the topic for which the condition holds (see ObxTest::read_topic).
sub find_message
{
	my ($mock, $topic, $cond) = @_;
	return [ grep { $cond->($_) } @{ read_topic($mock, $topic) } ];
}

# wait_caught_up($node, $consumer, $topic, \%ends, $what): wait until the
# consumer's next_offset of every partition in %ends (partition => offset,
# e.g. from partition_ends) has reached that offset; that is, every message
# up to there has been handled (processed, a duplicate or dead-lettered).
sub wait_caught_up
{
	my ($node, $consumer, $topic, $ends, $what) = @_;
	my $values = join(', ', map { "($_, $ends->{$_})" } sort keys %$ends);
	return ok($node->poll_query_until('postgres', qq{
		SELECT count(*) = @{[ scalar(keys %$ends) ]}
		  FROM (VALUES $values) AS e(p, o)
		  JOIN obx.consumer_status s ON s.kafka_partition = e.p AND s.next_offset >= e.o
		 WHERE s.consumer_name = '$consumer' AND s.topic = '$topic'}),
		"$consumer has handled every message of $topic: $what");
}

# consumer_totals($node, $consumer, $topic): the consumer_status counters
# summed over the partitions of a topic, as a hash.
sub consumer_totals
{
	my ($node, $consumer, $topic) = @_;
	my ($p, $d, $l, $r, $n) = split /\|/, $node->safe_psql('postgres', qq{
		SELECT coalesce(sum(processed), 0), coalesce(sum(duplicates), 0),
		       coalesce(sum(dead_lettered), 0), coalesce(sum(retries), 0), count(*)
		  FROM obx.consumer_status WHERE consumer_name = '$consumer' AND topic = '$topic'});
	return { processed => $p, duplicates => $d, dead_lettered => $l,
		retries => $r, partitions => $n };
}

# partition_status($node, $consumer, $topic): partition => the row of
# obx.consumer_status as a hash.
sub partition_status
{
	my ($node, $consumer, $topic) = @_;
	my @cols = qw(kafka_partition next_offset processed duplicates dead_lettered
	  retries last_error_class last_error);
	my %rows;
	for my $line (split /\n/, $node->safe_psql('postgres',
		'SELECT ' . join(', ', @cols) . qq{ FROM obx.consumer_status
		  WHERE consumer_name = '$consumer' AND topic = '$topic'}))
	{
		my %r;
		@r{@cols} = split /\|/, $line, scalar(@cols);
		$rows{ $r{kafka_partition} } = \%r;
	}
	return \%rows;
}

# create_effects($node): the schema "shop" a test handler writes to.
#   shop.effects         one row each time an effect is applied, with the
#                        event as the handler saw it; deliberately without
#                        a unique key, so an effect applied twice shows as
#                        two rows instead of failing the second time
#   shop.handler_calls   a sequence the handler advances on every call; a
#                        sequence is not rolled back with its transaction,
#                        so it counts calls whose transaction failed too
#                        (not across a crash: after crash recovery a
#                        sequence may jump ahead)
#   shop.record(e)       applies the effect of e
sub create_effects
{
	my ($node) = @_;
	$node->safe_psql('postgres', q{
		CREATE SCHEMA shop;
		CREATE TABLE shop.effects (
			n bigserial PRIMARY KEY,
			event_id text,
			event_type text,
			topic text,
			kafka_partition integer,
			kafka_offset bigint,
			event_key text,
			headers jsonb,
			payload jsonb,
			kafka_timestamp timestamptz,
			backend_pid integer NOT NULL DEFAULT pg_backend_pid(),
			applied_by name NOT NULL DEFAULT current_user,
			applied_at timestamptz NOT NULL DEFAULT clock_timestamp());
		CREATE SEQUENCE shop.handler_calls;
		CREATE FUNCTION shop.record(e obx.inbound_event) RETURNS void
		LANGUAGE sql AS $$
			INSERT INTO shop.effects (event_id, event_type, topic, kafka_partition,
					kafka_offset, event_key, headers, payload, kafka_timestamp)
			VALUES (e.event_id, e.event_type, e.topic, e.kafka_partition,
					e.kafka_offset, e.event_key, e.headers, e.payload, e.kafka_timestamp)
		$$;
	});
	return;
}

# effects_per_event($node): event id => how many times its effect was applied.
sub effects_per_event
{
	my ($node) = @_;
	my %n;
	for my $line (split /\n/, $node->safe_psql('postgres',
		'SELECT event_id, count(*) FROM shop.effects GROUP BY event_id'))
	{
		my ($id, $c) = split /\|/, $line;
		$n{$id} = $c;
	}
	return \%n;
}

# handler_calls($node): how many times a handler advanced shop.handler_calls.
sub handler_calls
{
	my ($node) = @_;
	return $node->safe_psql('postgres',
		'SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM shop.handler_calls');
}

# consumer_pids($node): pids of the running consumer workers.
sub consumer_pids { return worker_pids($_[0], 'obx consumer') }

# handler_held($node, $what): wait until a consumer worker is inside a
# handler that waits at the test's gate (an advisory lock the test holds),
# checked as $what; returns that worker's pid.
sub handler_held
{
	my ($node, $what) = @_;
	ok($node->poll_query_until('postgres', q{
		SELECT count(*) = 1 FROM pg_stat_activity
		 WHERE backend_type = 'obx consumer' AND wait_event_type = 'Lock' AND wait_event = 'advisory'}),
		$what);
	return $node->safe_psql('postgres', q{SELECT pid FROM pg_stat_activity
		WHERE backend_type = 'obx consumer' AND wait_event = 'advisory'});
}

# wait_consumer_pids($node, $n): wait until exactly $n consumer workers run;
# returns their pids.
sub wait_consumer_pids
{
	my ($node, $n) = @_;
	$node->poll_query_until('postgres',
		"SELECT count(*) = $n FROM pg_stat_activity WHERE backend_type = 'obx consumer'")
	  or die "expected $n consumer workers";
	return consumer_pids($node);
}

# group_offsets($kafka, $group, $topic): partition => [ committed offset,
# log end offset ] of a consumer group on a real Kafka cluster, as the
# broker's group coordinator has them (kafka-consumer-groups --describe, by
# way of tools/kafka-cluster).  A partition the group never committed an
# offset for is absent or has '-' as its committed offset.  Dies if the
# tool fails (say, while the coordinator moves).
sub group_offsets
{
	my ($kafka, $group, $topic) = @_;
	my %o;
	for my $line (split /\n/,
		kafka_cluster($kafka, 'groups', '--describe', '--group', $group))
	{
		my @f = split ' ', $line;
		next unless @f >= 5 && $f[0] eq $group && $f[1] eq $topic && $f[2] =~ /^\d+$/;
		$o{ $f[2] } = [ $f[3], $f[4] ];
	}
	return \%o;
}

1;
