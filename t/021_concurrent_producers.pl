# Window 3: concurrent producers.  Eight pgbench clients run application
# transactions that lock an order row (SELECT ... FOR UPDATE, as a real
# application does), bump its version and enqueue one to three events for
# it; a fifth of the transactions do the same and roll back.  Meanwhile
# three relay workers claim small batches (obx.batch_size = 50), so claims
# of many workers interleave with commits that land late.
#
# Proves: every committed event reaches Kafka, exactly once in this
# crash-free run (no duplicates); no rolled-back event exists or reaches
# Kafka; per topic and key the broker order equals the enqueue (seq) order,
# which is also the order of the order row's versions (commit order); and
# the partition and offset recorded in the outbox are where the broker put
# the event.  One more transaction enqueues before pgbench starts and
# commits only after every other event is published: its event has the
# lowest seq of all and becomes visible last, the classic trap of a relay
# that reads "ids after the last one seen"; it must still be published.
#
# The workers poll only once an hour (obx.poll_interval), so every claim
# after the first comes from a commit's wake-up or a change the workers
# count (src/relay/turns.c, obx_claim_pointless).  A claim skipped when something
# had changed would leave events unpublished for the hour, and the waits
# below would time out.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use ObxWindows;
use JSON::PP;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $norders = 300;
my $clients = 8;
my $per_client = 440;		# 3520 transactions, about 5600 committed events
my @topics = ('orders.v1', 'orders.audit.v1');

my $mock = start_mock();
my $node = obx_node('concurrent', $mock,
	'obx.workers' => 3,
	'obx.batch_size' => 50,
	'obx.poll_interval' => "'1h'",
	'max_connections' => 40);

# The application: pgbench clients lock an order, bump its version and
# enqueue 1-3 events (the second one on the audit topic), each carrying
# the version; a fifth of them do the same and roll back: none of that may
# ever be seen.  Before it starts, the late committer takes its seq first
# and commits last.
my ($late, $late_id) = late_committer($node, 'orders.v1');
like($late_id, qr/^[0-9a-f-]{36}$/, 'the late transaction enqueued its event');

my $total = $clients * $per_client;
my $start = time();
run_producers($node, norders => $norders, clients => $clients, per_client => $per_client,
	topic => 'orders.v1', second_topic => 'orders.audit.v1',
	what => 'pgbench: concurrent committing and rolling-back producers');
note sprintf('pgbench ran %d transactions in %.1f s', $total, time() - $start);

ok(all_published($node), 'every event committed by pgbench is published');
note sprintf('all published %.1f s after pgbench started', time() - $start);
is($node->safe_psql('postgres',
	qq{SELECT count(*) FROM obx.outbox_events WHERE id = '$late_id'}),
	'0', 'the late event is still invisible, its transaction open');

$late->query_safe('COMMIT');
$late->quit;
ok(all_published($node), 'the late-committing event is published too');
is($node->safe_psql('postgres',
	qq{SELECT seq < (SELECT min(seq) FROM obx.outbox_events WHERE id <> '$late_id')
	     FROM obx.outbox_events WHERE id = '$late_id'}),
	't', 'it holds the lowest seq, although it became visible last');

my $committed_count = 1 + $node->safe_psql('postgres',
	'SELECT sum(events) FROM orders');
note "committed events: $committed_count";
ok($committed_count > 3000, "thousands of committed events ($committed_count)");
is($node->safe_psql('postgres', 'SELECT count(*) FROM obx.outbox_events'),
	$committed_count,
	'the outbox holds exactly the events of committed transactions');
is($node->safe_psql('postgres',
	q{SELECT count(*) FROM obx.outbox_events WHERE (payload->>'rb')::boolean}),
	'0', 'no event of a rolled-back transaction is in the outbox');

my $json = JSON::PP->new;
my (%all_at_broker, $messages, $rolled_back_at_broker, $bad_landing, $bad_key);
my $landing = $node->safe_psql('postgres',
	q{SELECT id, kafka_partition, kafka_offset FROM obx.outbox_events});
my %landed = map { my ($id, $p, $o) = split /\|/; ($id => "$p/$o") } split /\n/, $landing;
$rolled_back_at_broker = $bad_landing = $bad_key = 0;

for my $topic (@topics)
{
	my $msgs = read_topic($mock, $topic);
	my $seen = event_ids_at_broker($msgs);
	my $expected = committed_ids($node, "topic = '$topic'");
	$messages += scalar(@$msgs);
	$all_at_broker{$_} += $seen->{$_} for keys %$seen;

	is_deeply([ sort keys %$seen ], [ sort map { @$_ } values %$expected ],
		"$topic: the set of event ids at the broker is the set of committed ids");
	is(scalar(grep { $seen->{$_} > 1 } keys %$seen), 0,
		"$topic: no event id reached the broker twice");
	is_deeply(first_occurrences($msgs), $expected,
		"$topic: per key, broker order equals enqueue (seq) order");

	# Per key, the versions (and the event number within a transaction)
	# only grow in broker order: the order of the commits on that row.
	my (%last, @regress);
	for my $m (sort { $a->{partition} <=> $b->{partition}
						|| $a->{offset} <=> $b->{offset} } @$msgs)
	{
		my $p = $json->decode($m->{payload});
		$rolled_back_at_broker++ if $p->{rb};
		$bad_key++
		  unless $m->{key} eq ($p->{order} eq 'late' ? 'late' : "ord_$p->{order}");
		$bad_landing++
		  unless ($landed{ $m->{event_id} } // '') eq "$m->{partition}/$m->{offset}";
		my $pos = [ $p->{version}, $p->{i} ];
		if (my $prev = $last{ $m->{key} })
		{
			push @regress, "$m->{key}: v$prev->[0].$prev->[1] then v$pos->[0].$pos->[1]"
			  unless $pos->[0] > $prev->[0]
			  || ($pos->[0] == $prev->[0] && $pos->[1] > $prev->[1]);
		}
		$last{ $m->{key} } = $pos;
	}
	is(join('; ', @regress[0 .. ($#regress < 4 ? $#regress : 4)]), '',
		"$topic: per key, broker order follows the order row's versions");
}

is(scalar(keys %all_at_broker), $committed_count,
	'as many distinct event ids at the broker as committed events');
is($messages, $committed_count, 'no duplicates: one message per committed event');
is($rolled_back_at_broker, 0, 'no rolled-back event reached the broker');
is($bad_key, 0, 'every message carries its order key');
is($bad_landing, 0,
	'the partition and offset recorded in the outbox are where each event landed');

# The claims really were spread over several workers and many batches.
my $workers = $node->safe_psql('postgres',
	q{SELECT string_agg(worker || ':' || published || '/' || batches, ' ') FROM obx.workers});
note "per worker published/batches: $workers";
ok($node->safe_psql('postgres',
	'SELECT count(*) >= 2 AND sum(batches) >= ' . int($committed_count / 50)
	  . ' FROM obx.workers WHERE published > 0') eq 't',
	'several workers published, in many batches');

done_testing();
