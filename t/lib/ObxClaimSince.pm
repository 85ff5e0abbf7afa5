# ObxClaimSince.pm: the parts of the claim since a complete tick
# (docs/internals.md) that both relays are tried on, the in-database one
# (t/029) and obx-relay (t/105), one relay at a time.  Each part takes the
# node and the topic and returns the ids it enqueued; the caller checks at
# the end what reached the broker (since_final_checks).
package ObxClaimSince;

use strict;
use warnings;

use Exporter 'import';
use PostgreSQL::Test::Utils;
use Test::More;
use ObxTest;
use ObxWindows;

our @EXPORT = qw(since_enqueue since_published since_held_back since_late_committer
  since_burst since_foreign_lease since_final_checks);

# since_enqueue($node, $topic, $key, $n): one event in its own transaction.
sub since_enqueue
{
	my ($node, $topic, $key, $n) = @_;
	return $node->safe_psql('postgres',
		qq{SELECT obx.enqueue('$topic', '$key', '{"n": $n}')});
}

# since_published($node, $id): whether the event is recorded as published.
sub since_published
{
	my ($node, $id) = @_;
	return $node->safe_psql('postgres',
		qq{SELECT published_at IS NOT NULL FROM obx.outbox_events WHERE id = '$id'}) eq 't';
}

# since_held_back($node, $topic): a claim that held an event back is not
# complete.  P fails for good (larger than the producer's
# message.max.bytes, which the caller sets under 50,000; max_attempts 1)
# and is quarantined, which holds its key k1; B (k1) and C (k2) commit
# together, and the claim takes C alone.  Once P is skipped, B must be
# published.  Returns (P, B, C).
sub since_held_back
{
	my ($node, $topic) = @_;
	my $p = $node->safe_psql('postgres', qq{
		SELECT obx.enqueue('$topic', 'k1',
			jsonb_build_object('poison', true, 'blob', repeat('x', 50000)))});
	$node->poll_query_until('postgres',
		qq{SELECT count(*) = 1 FROM obx.quarantine WHERE id = '$p'})
	  or die 'the poison event was not quarantined';
	my ($b, $c) = split /\n/, $node->safe_psql('postgres', qq{
		BEGIN;
		SELECT obx.enqueue('$topic', 'k1', '{"n": 2}');
		SELECT obx.enqueue('$topic', 'k2', '{"n": 3}');
		COMMIT;});
	wait_until(sub { since_published($node, $c) }, 'C, of a free key, is published');
	ok(!since_published($node, $b), 'B waits behind the quarantined P of its key');
	$node->safe_psql('postgres', qq{SELECT obx.skip('$p', 'poison, for the test')});
	wait_until(sub { since_published($node, $b) }, 'B is published once P is skipped');
	return ($p, $b, $c);
}

# since_late_committer($node, $topic): L's transaction stays open while D
# is claimed and published; L commits afterwards, with a lower seq than
# D, and must be published: its transaction was running when the ticks
# since were taken.  Returns (L, D).
sub since_late_committer
{
	my ($node, $topic) = @_;
	my ($late, $l) = late_committer($node, $topic);
	my $d = since_enqueue($node, $topic, 'k4', 4);
	wait_until(sub { since_published($node, $d) },
		'D, committed after L was enqueued, is published');
	ok(!since_published($node, $l), 'L is not published while its transaction is open');
	$late->query_safe('COMMIT');
	$late->quit;
	wait_until(sub { since_published($node, $l) }, 'L is published once it commits');
	is($node->safe_psql('postgres', qq{
		SELECT (SELECT seq FROM obx.events WHERE id = '$l')
			   < (SELECT seq FROM obx.events WHERE id = '$d')}),
		't', 'L took its seq before D');
	return ($l, $d);
}

# since_burst($node, $topic): 12 events of key k8 in one transaction, more
# than a batch (the caller's batch size is 5): the claim since reads a
# batch and one more of them and takes a full batch, which is not
# complete.  Returns their ids in enqueue order.
sub since_burst
{
	my ($node, $topic) = @_;
	my @burst = split /\n/, $node->safe_psql('postgres', qq{
		SELECT obx.enqueue('$topic', 'k8', jsonb_build_object('n', i))
		  FROM generate_series(1, 12) i ORDER BY i});
	is(scalar @burst, 12, 'one transaction enqueued 12 events of key k8');
	return @burst;
}

# since_foreign_lease($node, $topic): a claim that found a lease live is
# not complete, for the claim since reads no lease.  Under the claim lock,
# a lease on E1 is written by hand from the latest tick, as a stalled
# relay would have left it (its floor no higher than E1, as a claim's:
# with the floor past every seq no claim would read it); E2 (the same
# key, k9) and F commit beside it.  F is published, E1 and E2 wait; once
# the lease runs out they must be published (in that order:
# since_final_checks).  Returns (E1, E2, F).
sub since_foreign_lease
{
	my ($node, $topic) = @_;
	my $holder = $node->background_psql('postgres');
	$holder->query_safe('BEGIN; SELECT pg_advisory_xact_lock(7299704, 1)');
	my $e1 = since_enqueue($node, $topic, 'k9', 9);
	my ($e2, $f) = split /\n/, $node->safe_psql('postgres', qq{
		BEGIN;
		SELECT obx.enqueue('$topic', 'k9', '{"n": 10}');
		SELECT obx.enqueue('$topic', 'k10', '{"n": 11}');
		COMMIT;});
	my $lease = $holder->query_safe(qq{
		INSERT INTO obx.claims (lease_id, owner, until, snap, floor, max_seq, ids, topics, keys)
		SELECT nextval('obx.lease_seq'), 99, now() + interval '1 hour', t.snap,
			   least(t.floor, e.seq), e.seq, ARRAY[e.id], ARRAY[e.topic], ARRAY[e.event_key]
		  FROM obx._tick() t, obx.events e WHERE e.id = '$e1'
		RETURNING lease_id});
	$holder->query_safe('COMMIT');
	$holder->quit;
	wait_until(sub { since_published($node, $f) }, 'F, of a free key, is published');
	ok(!since_published($node, $e1) && !since_published($node, $e2),
		'E1 and E2 wait while the lease on E1 is live');
	$node->safe_psql('postgres', qq{
		UPDATE obx.claims SET until = now() - interval '1 second' WHERE lease_id = $lease});
	wait_until(sub { since_published($node, $e1) && since_published($node, $e2) },
		'E1 and E2 are published once the lease runs out');
	return ($e1, $e2, $f);
}

# since_final_checks($node, $broker, $topic, %o): nothing is left
# unpublished; every id of $o{ids} reached the broker; the burst
# ($o{burst}) and E1, E2 ($o{k9}) are there in enqueue order; the skipped
# poison ($o{poison}) is not.
sub since_final_checks
{
	my ($node, $broker, $topic, %o) = @_;
	ok(all_published($node), 'nothing is left unpublished');
	my $msgs = read_topic($broker, $topic);
	my $at_broker = event_ids_at_broker($msgs);
	ok($at_broker->{$_}, "event $_ reached the broker") for @{ $o{ids} };
	my $order = first_occurrences($msgs);
	is_deeply($order->{k8}, $o{burst}, 'the broker holds the 12 events of key k8 in enqueue order');
	is_deeply($order->{k9}, $o{k9}, 'the broker holds E1 before E2');
	ok(!$at_broker->{ $o{poison} }, 'the skipped poison event never reached the broker');
}

1;
