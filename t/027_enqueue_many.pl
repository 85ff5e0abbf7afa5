# obx.enqueue_many end to end: the broker holds exactly the events of the
# committed calls (the ids each call returned), per key in array order
# (and in call order across calls and with obx.enqueue in one
# transaction); a rolled-back call, or one undone by ROLLBACK TO SAVEPOINT,
# publishes nothing; re-enqueueing the same ids with the same content sends
# nothing again.  The poll is hourly, so every event goes out through the
# commit wake-up that obx.enqueue_many arranges, as obx.enqueue does.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $mock = start_mock();
my $node = obx_node('enqueue_many', $mock,
	'obx.workers' => 2,
	'obx.poll_interval' => "'1h'");
my $topic = 'orders.many.v1';

my (%expected, %committed, %rolled_back);

# The SQL of one enqueue_many of $n events: key ord_(i % 7), payload
# {"call": $call, "i": i}, in the order of i.
sub many_sql
{
	my ($call, $n) = @_;
	return qq{SELECT 'many', array_to_string(obx.enqueue_many('$topic',
		array_agg('ord_' || (i % 7) ORDER BY i),
		array_agg(jsonb_build_object('call', $call, 'i', i) ORDER BY i)), ',')
	  FROM generate_series(1, $n) i};
}

# Record a committed call's ids in array order: per key, that is the order
# the broker must keep.
sub expect_many
{
	my ($ids, $n) = @_;
	my @ids = split /,/, $ids;
	is(scalar(@ids), $n, "enqueue_many returned $n ids");
	for my $i (1 .. $n)
	{
		push @{ $expected{ 'ord_' . ($i % 7) } }, $ids[ $i - 1 ];
		$committed{ $ids[ $i - 1 ] } = 1;
	}
	return;
}

# 1. One call of 300 events, committed.
my (undef, $first) = split /\|/, $node->safe_psql('postgres', many_sql(1, 300));
expect_many($first, 300);
# With an hourly poll, only the commit wake-up of enqueue_many sends them.
wait_for_broker($mock, $topic, sub {
	my $seen = event_ids_at_broker(shift);
	!grep { !$seen->{$_} } split /,/, $first }, "the first call's events at the broker");

# 2. A call in a transaction that rolls back, and one undone by a
# savepoint in a transaction that commits an obx.enqueue before it and an
# enqueue_many after it (per key: the enqueue, then the kept call).
my (undef, $gone) = split /\|/, $node->safe_psql('postgres', qq{
	BEGIN;
	CREATE TEMP TABLE ids ON COMMIT DROP AS } . many_sql(2, 50) . qq{;
	SELECT * FROM ids;
	ROLLBACK;});
$rolled_back{$_} = 1 for split /,/, $gone;
my $out = $node->safe_psql('postgres', qq{
	BEGIN;
	SELECT 'one', obx.enqueue('$topic', 'ord_0', '{"call": 3}');
	SAVEPOINT s;
	} . many_sql(4, 50) . qq{;
	ROLLBACK TO SAVEPOINT s;
	} . many_sql(5, 70) . qq{;
	COMMIT;});
my @lines = split /\n/, $out;
my (undef, $one) = split /\|/, $lines[0];
push @{ $expected{ord_0} }, $one;
$committed{$one} = 1;
$rolled_back{$_} = 1 for split /,/, (split /\|/, $lines[1])[1];
expect_many((split /\|/, $lines[2])[1], 70);
is(scalar(keys %rolled_back), 100, '100 rolled-back event ids were handed out');

# 3. The first call again with its own ids: a no-op that returns them.
my $again = $node->safe_psql('postgres', qq{
	SELECT array_to_string(obx.enqueue_many('$topic',
		array_agg('ord_' || (i % 7) ORDER BY i),
		array_agg(jsonb_build_object('call', 1, 'i', i) ORDER BY i),
		event_ids => string_to_array('$first', ',')::uuid[]), ',')
	  FROM generate_series(1, 300) i});
is($again, $first, 'enqueue_many with the same ids and content returns the same ids');
is($node->safe_psql('postgres', "SELECT count(*) FROM obx.outbox_events WHERE topic = '$topic'"),
	scalar(keys %committed), 'the outbox holds each committed event once');

# The broker: exactly the committed ids, once each, per key in array order.
my $msgs = wait_for_broker($mock, $topic, sub {
	my $seen = event_ids_at_broker(shift);
	!grep { !$seen->{$_} } keys %committed }, 'every committed event at the broker');
ok(all_published($node), 'the outbox has nothing left to publish');
$msgs = read_topic($mock, $topic);
my $seen = event_ids_at_broker($msgs);
is_deeply([ sort keys %$seen ], [ sort keys %committed ],
	'the broker holds exactly the ids the committed calls returned');
is(scalar(grep { $seen->{$_} != 1 } keys %$seen), 0, 'each of them once');
is(scalar(grep { $seen->{$_} } keys %rolled_back), 0, 'no rolled-back event reached the broker');
is_deeply(first_occurrences($msgs), \%expected,
	'per key, broker order is array order, and call order across calls');

done_testing();
