# obx-relay's claim since a complete tick (docs/internals.md, "The claim
# since a complete tick"), on the SQL-only install: the daemon's claims
# after a complete one of its own read only the events of the
# transactions that claim's snapshot did not see committed.  The ways
# that could lose an event or break per-key order, with one daemon:
#
# 1. to 4. as t/029's parts 1, 2, 4 and 5 (ObxClaimSince): an event
#    held back by its quarantined key, a late committer, more than a
#    batch (batch_size is 5) in one transaction, another claimant's live
#    lease on an event of a key.
# 5. A stall past the lease, with a second daemon whose claim_gap (10 s)
#    keeps it from claiming while G is out.  H is claimed and published,
#    a complete claim; G is claimed since it, and the daemon is stopped
#    (SIGSTOP) with G in flight, every broker answering later than
#    delivery_timeout, until G's lease has run out.  Resumed, it must not
#    renew that lease (a claim may have taken G over, and a lease a claim
#    saw run out must never be live again).  G then times out, a failure
#    the daemon cannot record under a lease it lost, so its next claim,
#    the first since G's, must read from the floor, and G must be
#    published.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxDaemon;
use ObxTest;
use ObxClaimSince;
use PostgreSQL::Test::Utils;
use Test::More;

my $topic = 'orders.daemon_since.v1';
my $mock = start_mock();
my $dir = PostgreSQL::Test::Utils::tempdir('relay');
my $node = sql_only_node('daemon_since');
my %settings = (
	batch_size => 5,
	max_attempts => 1,
	lease_timeout => 1,
	delivery_timeout => 6000,
	'kafka.message.max.bytes' => 20000);
my $relay = start_relay(relay_config($node, $mock, $dir, %settings));

my $stopped;
sub resume
{
	kill('CONT', $stopped) if $stopped;
	$stopped = undef;
}
END { resume(); }

sub enqueue { return since_enqueue($node, $topic, @_) }
sub published { return since_published($node, @_) }

my $first = enqueue('k0', 0);
ok(all_published($node), 'the first event is published');

my ($p, $b, $c) = since_held_back($node, $topic);
my ($l, $d) = since_late_committer($node, $topic);
my @burst = since_burst($node, $topic);
wait_until(sub { published($burst[-1]) }, 'the last of the 12 events of k8 is published');
my ($e1, $e2, $f) = since_foreign_lease($node, $topic);

# 5. A stall past the lease.
is(stop_relay($relay), 0, 'obx-relay stops cleanly');
$relay = start_relay(relay_config($node, $mock, $dir, %settings, claim_gap => 10000));
my $h = enqueue('k12', 12);
wait_until(sub { published($h) }, 'H is published by the second daemon');
mock_cmd($mock, "rtt $_ 8000") for 1 .. 3;
my $g = enqueue('k11', 13);
$node->poll_query_until('postgres',
	qq{SELECT count(*) = 1 FROM obx.leases WHERE '$g' = ANY (ids)})
  or die 'G was not claimed';
my $g_lease = $node->safe_psql('postgres',
	qq{SELECT max(lease_id) FROM obx.claims WHERE '$g' = ANY (ids)});
kill('STOP', $relay->{pid}) or die "cannot stop obx-relay: $!";
$stopped = $relay->{pid};
$node->poll_query_until('postgres', qq{
	SELECT greatest(c.until, (SELECT max(n.until) FROM obx.renewals n WHERE n.lease_id = c.lease_id))
		   < now() - interval '0.2 seconds'
	  FROM obx.claims c WHERE c.lease_id = $g_lease})
  or die "G's lease did not run out";
my $ran_out = $node->safe_psql('postgres', 'SELECT clock_timestamp()');
resume();
wait_until(sub { relay_log($relay) =~ /lost the lease of 1 failed events/ },
	'G times out under the lost lease');
mock_cmd($mock, "rtt $_ 0") for 1 .. 3;
wait_until(sub { published($g) }, 'G is published after the stall');
is($node->safe_psql('postgres', qq{
	SELECT count(*) FROM obx.renewals WHERE lease_id = $g_lease AND until > '$ran_out'}),
	'0', 'the lease that ran out was not renewed');
like(relay_log($relay), qr/lost the lease on 1 events/, 'the daemon says it lost the lease');

since_final_checks($node, $mock, $topic,
	ids => [ $first, $b, $c, $d, $l, $f, $h, $g ],
	burst => \@burst, k9 => [ $e1, $e2 ], poison => $p);

is(stop_relay($relay), 0, 'the second obx-relay stops cleanly');
$node->stop;
done_testing();
