# Window: commits that arrive while a worker is quiet after a claim.
#
# With obx.claim_gap set, a worker whose claim took less than a full batch
# does not claim again until the gap has passed, and commits in the
# meantime do not wake it: their events wait and go out together in its
# next claim.  One worker and a 1 s gap: 100 events committed one
# transaction at a time right after a first one are claimed in at most two
# batches (the first claim may already see some of them), where without
# the gap the worker claims again and again while they come in.  None is
# lost or published twice, and per key the broker has them in enqueue
# order (guarantees 2 and 4).  A full batch ends the gap: with obx.batch_size = 10 and 25
# events waiting, the second batch is claimed right after the first, not
# a gap later.  Two workers take turns of half the gap: an event committed
# just after a claim is claimed half a gap later, not a whole gap later,
# also when one of the workers is stopped and the other takes every turn.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $topic = 'orders.claim_gap.v1';
my $nburst = 100;

my $mock = start_mock();
my $node = obx_node('claim_gap', $mock,
	'obx.workers' => 1,
	'obx.claim_gap' => "'1s'");

relay_ready($node, 1);

sub batches
{
	return $node->safe_psql('postgres', 'SELECT batches FROM obx.workers');
}

# One commit per event, all in one session: the first wakes the worker,
# the rest commit within its gap.
my $before = batches();
my $ids = [ split /\n/, $node->safe_psql('postgres', join('', map {
	"SELECT obx.enqueue('$topic', 'ord_' || ($_ % 3), '{\"n\": $_}');\n" } 1 .. $nburst + 1)) ];
is(scalar @$ids, $nburst + 1, 'every enqueue committed');
broker_holds_exactly($mock, $node, $topic, $ids);
all_published($node) or die 'the events were not all marked published';
my $used = batches() - $before;
cmp_ok($used, '<=', 2,
	"the first event and the $nburst committed after it went out in $used batches, not one per commit");

# A backlog: the brokers are down while 25 events are enqueued, each with
# a key of its own (a leased key holds its later events back), so the
# worker holds its two batches of 10, one claimed right after the other,
# and the rest waits.
$node->append_conf('postgresql.conf', "obx.batch_size = 10\n");
$node->restart;
relay_ready($node, 1);
# The new producer learns the topic first: a producer waits up to 0.5 s
# for a topic's metadata the first time, and with the brokers down that
# wait would fall between the two claims.
$node->safe_psql('postgres', "SELECT obx.enqueue('$topic', 'warm', '{}')");
all_published($node) or die 'the first event after the restart was not published';
mock_cmd($mock, 'down all');
$node->safe_psql('postgres', qq{
	SELECT obx.enqueue('$topic', 'ord_' || i, jsonb_build_object('n', i))
	  FROM generate_series(101, 125) i});
$node->poll_query_until('postgres',
	'SELECT count(*) = 2 AND sum(cardinality(ids)) = 20 FROM obx.leases')
  or die 'the worker did not claim two full batches';
my $apart = $node->safe_psql('postgres',
	'SELECT extract(epoch FROM max(claimed_at) - min(claimed_at)) FROM obx.leases');
cmp_ok($apart, '<', 1,
	"the second full batch was claimed ${apart} s after the first, not after the 1 s gap");
mock_cmd($mock, 'up all');
all_published($node) or die 'the backlog was not published';

# Turns: two workers, brokers down so that their leases stay.  Left to
# themselves, two workers fall into step (a claim each at start-up, then
# a gap each) and an event committed after their claims waits a whole
# gap.  In turns, the second event is claimed at the next turn, half of
# the 1 s gap after the first claim.

# Enqueue two events, the second once the first is claimed (the brokers
# are down, so both leases stay); returns the seconds between the two
# claims and the workers that made them.
sub claims_apart
{
	my ($first, $second) = @_;

	$node->safe_psql('postgres', "SELECT obx.enqueue('$topic', '$first', '{}')");
	$node->poll_query_until('postgres', 'SELECT count(*) = 1 FROM obx.leases')
	  or die "event $first was not claimed";
	$node->safe_psql('postgres', "SELECT obx.enqueue('$topic', '$second', '{}')");
	$node->poll_query_until('postgres', 'SELECT count(*) = 2 FROM obx.leases')
	  or die "event $second was not claimed";
	return split /\|/, $node->safe_psql('postgres',
		"SELECT extract(epoch FROM max(claimed_at) - min(claimed_at)), string_agg(DISTINCT owner::text, ',') FROM obx.leases");
}

# turns_apart($label, $pause, $resume): claims_apart with the brokers
# down, up to three times until the second claim comes at the next turn
# (0.45 to 0.9 s after the first); after each try the brokers are up again
# and every event is published.  A worker that missed its turn because the
# busy machine did not run it for half a second leaves a whole gap once;
# workers that kept no turns leave it every time.  $pause (optional) runs
# before each try, $resume after it.  Returns the seconds and the owners
# of the last try.
sub turns_apart
{
	my ($label, $pause, $resume) = @_;
	my ($apart, $owners);
	for my $try (1 .. 3)
	{
		mock_cmd($mock, 'down all');
		$pause->() if $pause;
		($apart, $owners) = claims_apart("${label}_${try}a", "${label}_${try}b");
		$resume->() if $resume;
		mock_cmd($mock, 'up all');
		all_published($node) or die "the events of try $try ($label) were not published";
		last if $apart >= 0.45 && $apart < 0.9;
		note("try $try ($label): the second event was claimed $apart s after the first");
	}
	return ($apart, $owners);
}

$node->append_conf('postgresql.conf', "obx.workers = 2\nobx.batch_size = 2000\n");
$node->restart;
relay_ready($node, 2);
my ($turn) = turns_apart('turn');
ok($turn >= 0.45 && $turn < 0.9,
	"the second event was claimed ${turn} s after the first, at the next turn (0.5 s), not a whole gap later");

# Whichever worker is free takes the turn: with worker 0 stopped
# (SIGSTOP, as if it had no CPU), worker 1 claims at every turn, so again
# the second event is claimed half the gap after the first.  Workers that
# each kept a gap of their own and alternated left it a whole gap.
my $stopped = $node->safe_psql('postgres', 'SELECT pid FROM obx.workers WHERE worker = 0');
END { kill 'CONT', $stopped if $stopped; }
my ($alone, $owner) = turns_apart('alone',
	sub { kill 'STOP', $stopped or die "could not stop relay worker 0 (pid $stopped)" },
	sub { kill 'CONT', $stopped });
is($owner, '1', 'worker 1 claimed both events while worker 0 was stopped');
ok($alone >= 0.45 && $alone < 0.9,
	"with worker 0 stopped, worker 1 claimed the second event ${alone} s after the first, at the next turn (0.5 s), not a whole gap later");
broker_holds_exactly($mock, $node, $topic,
	[ split /\n/, $node->safe_psql('postgres', 'SELECT id FROM obx.outbox_events') ]);

done_testing();
