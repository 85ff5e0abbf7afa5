# obx-relay's two waits between claims: claim_gap after a claim that took
# events (the in-database relay's obx.claim_gap), poll_interval after one
# that took nothing.
#
# Proves, on the Kafka stand-in, with poll_interval = 20 and claim_gap =
# 1500 (ms):
# - a bad claim_gap is refused by name (obx-relay --check fails on it);
# - after a claim that took an event, the daemon does not claim again
#   before claim_gap has passed since that claim began: an event committed
#   right after it is claimed at least most of a gap later, not at the next
#   poll (a daemon that polled every poll_interval regardless claims it
#   within tens of milliseconds);
# - with a burst committed one event per transaction after a claim,
#   none is lost or sent twice, and per key the broker has them in
#   enqueue order.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxDaemon;
use ObxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $topic = 'orders.daemon_gap.v1';
my $gap_ms = 1500;
my $nburst = 50;

my $mock = start_mock();
my $dir = PostgreSQL::Test::Utils::tempdir('relay');
my $node = sql_only_node('daemon_gap');

my ($status, $out) = relay_check(relay_config($node, $mock, $dir, claim_gap => -1));
isnt($status, 0, 'a negative claim_gap: obx-relay refuses its settings');
like($out, qr/setting claim_gap must be a whole number from 0 to \d+, not "-1"/,
	'the error names claim_gap and its range');

my $relay = start_relay(relay_config($node, $mock, $dir, claim_gap => $gap_ms));

# The lease that holds an event: its claim's start, in seconds since the
# epoch, once it is claimed.
sub claimed_at
{
	my ($id) = @_;
	my $query = "SELECT extract(epoch FROM claimed_at) FROM obx.claims WHERE '$id'::uuid = ANY (ids)";
	$node->poll_query_until('postgres', "SELECT EXISTS ($query)")
	  or die "event $id was not claimed";
	return $node->safe_psql('postgres', "$query ORDER BY lease_id LIMIT 1");
}

sub enqueue
{
	my ($key, $n) = @_;
	return $node->safe_psql('postgres', "SELECT obx.enqueue('$topic', '$key', '{\"n\": $n}')");
}

# The first event: the daemon, idle, claims it at its next poll.  The
# second, committed once the first is claimed, waits for the gap.
my $first = enqueue('ord_0', 0);
my $first_at = claimed_at($first);
my $second = enqueue('ord_1', 1);
my $apart = claimed_at($second) - $first_at;
cmp_ok($apart, '>=', 0.8 * $gap_ms / 1000,
	"after a claim that took an event, the next came ${apart} s later: a claim_gap ($gap_ms ms), not a poll_interval (20 ms)");

# A burst, one commit per event in one session, right after a claim.
my $third = enqueue('ord_2', 2);
claimed_at($third);
my @burst = split /\n/, $node->safe_psql('postgres', join('', map {
	"SELECT obx.enqueue('$topic', 'ord_' || ($_ % 3), '{\"n\": $_}');\n" } 3 .. $nburst + 2));
is(scalar @burst, $nburst, 'every enqueue of the burst committed');
broker_holds_exactly($mock, $node, $topic, [ $first, $second, $third, @burst ]);

is(stop_relay($relay), 0, 'SIGTERM stops the daemon with exit status 0');
done_testing();
