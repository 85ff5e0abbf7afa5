# A database restored with pg_dump/pg_restore into another cluster whose
# transaction ids are behind the old one's (docs/operations.md, "Backups").
# The events and records are dumped, the claims are not; each restored
# event keeps the old cluster's transaction id in obx.events.xid, which
# means nothing to the new cluster's snapshots.  The old cluster burns 3,000
# transaction ids first, publishes some events, then runs without a relay
# while more are enqueued, and is dumped.  The dump is restored as the
# docs say: into a server whose relay does not serve the database, which
# then gets its workers back.  On the new cluster, after its relay has made
# many claims (one per batch enqueued there), half of them after its own
# transaction ids have passed the old ones (its claims then look for late
# committers among ids that restored events carry too):
#   - no event published on the old cluster is sent again;
#   - every event pending in the dump is published exactly once;
#   - every event enqueued after the restore is published exactly once;
#   - per key, the broker's order is the enqueue order, across all three;
#   - obx.status and obx.outbox_events agree: nothing pending at the end.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $topic = 'orders.dump_restore.v1';
my $mock = start_mock();
create_topic($mock, $topic, 2);

# enqueue($node, $tag, $n): $n events over four keys in one statement (one
# transaction); returns their ids in enqueue order.
sub enqueue
{
	my ($node, $tag, $n) = @_;
	return split /\n/, $node->safe_psql('postgres', qq{
		SELECT obx.enqueue('$topic', 'key_' || (i % 4), jsonb_build_object('batch', '$tag', 'n', i))
		  FROM generate_series(1, $n) i});
}

# The old cluster, its transaction ids moved 3,000 ahead before any event.
my $old = obx_node('dump_old', $mock, 'obx.workers' => 1, 'obx.consumer_workers' => 0);
$old->safe_psql('postgres', q{
	CREATE PROCEDURE burn() LANGUAGE plpgsql AS $$
	BEGIN
		FOR i IN 1..3000 LOOP PERFORM txid_current(); COMMIT; END LOOP;
	END $$;
	CALL burn();
	DROP PROCEDURE burn();});
relay_ready($old, 1);

my @published = map { enqueue($old, "old_$_", 10) } 1 .. 4;
ok(all_published($old), 'the old cluster published its first 40 events');

# No relay any more on the old cluster: the next events stay pending.
$old->append_conf('postgresql.conf', "obx.workers = 0\n");
$old->restart;
my @pending = map { enqueue($old, "pending_$_", 10) } 1 .. 3;
is($old->safe_psql('postgres',
	'SELECT count(*) FROM obx.outbox_events WHERE published_at IS NULL'),
	scalar(@pending), 'the old cluster holds 30 pending events');

my $bindir = $old->config_data('--bindir');
my $dump = PostgreSQL::Test::Utils::tempdir('dump') . '/obx.dump';
$old->command_ok([ "$bindir/pg_dump", '-Fc', '-f', $dump, '-d', $old->connstr('postgres') ],
	'pg_dump of the old cluster\'s database');

# The new cluster: no worker while the dump is restored (obx_node made the
# extension and its schema in postgres; they go, and come back with the dump).
my $new = obx_node('dump_new', $mock, 'obx.workers' => 0, 'obx.consumer_workers' => 0);
$new->safe_psql('postgres', 'DROP EXTENSION obx; DROP SCHEMA obx');
# Without --exit-on-error: pg_restore goes on past a failed item and exits
# non-zero, so a table that does not restore fails this test while the rest
# is still restored for the checks below.
$new->command_ok([ "$bindir/pg_restore", '-d', $new->connstr('postgres'), $dump ],
	'pg_restore into the new cluster, without error');
is($new->safe_psql('postgres', q{
	SELECT (SELECT count(*) FROM obx.events) || ' events, '
		   || (SELECT count(*) FROM obx.claims) || ' claims, '
		   || (SELECT count(*) FROM obx.outbox_events WHERE published_at IS NULL) || ' pending'}),
	'70 events, 0 claims, 30 pending',
	'the events and records were restored, the claims were not');
is($new->safe_psql('postgres',
	'SELECT min(xid) > pg_current_xact_id()::text::bigint FROM obx.events'),
	't', 'every restored event\'s old xid is ahead of the new cluster\'s transaction ids');

# The relay back on the restored database; it publishes the pending events,
# then each new batch in its own claims.
$new->append_conf('postgresql.conf', "obx.workers = 1\n");
$new->restart;
relay_ready($new, 1);
ok(all_published($new), 'the new cluster published the events pending in the dump');

my @fresh;
for my $b (1 .. 6)
{
	push @fresh, enqueue($new, "new_$b", 5);
	ok(all_published($new), "the new cluster published its batch $b");
	next unless $b == 3;
	# The new cluster's transaction ids then pass every restored one, so
	# that its claims' ranges of late committers sweep over the old ids.
	my $n = $new->safe_psql('postgres',
		'SELECT max(xid) + 100 - pg_current_xact_id()::text::bigint FROM obx.events');
	$new->safe_psql('postgres', qq{
		CREATE PROCEDURE burn(n bigint) LANGUAGE plpgsql AS \$\$
		BEGIN
			FOR i IN 1..n LOOP PERFORM txid_current(); COMMIT; END LOOP;
		END \$\$;
		CALL burn($n);
		DROP PROCEDURE burn(bigint);});
	is($new->safe_psql('postgres',
		'SELECT max(xid) < pg_current_xact_id()::text::bigint FROM obx.events WHERE era <> obx._era()'),
		't', 'the new cluster\'s transaction ids have passed every restored event\'s');
}
my $claims = $new->safe_psql('postgres', 'SELECT count(*) FROM obx.claims WHERE ids IS NOT NULL');
cmp_ok($claims, '>=', 7, "the new cluster's relay made at least one claim per batch ($claims)");

# What reached the broker: every event exactly once.
my @all = (@published, @pending, @fresh);
my $msgs = wait_for_broker($mock, $topic, sub {
	my $seen = event_ids_at_broker(shift);
	!grep { !$seen->{$_} } @all }, 'every event at the broker');
my $copies = event_ids_at_broker($msgs);
for my $part ([ 'published on the old cluster', \@published ],
	[ 'pending in the dump', \@pending ], [ 'enqueued after the restore', \@fresh ])
{
	my ($what, $ids) = @$part;
	my @wrong = grep { ($copies->{$_} // 0) != 1 } @$ids;
	my $n = 0;
	$n += $copies->{$_} // 0 for @$ids;
	is(scalar(@wrong), 0, "each event $what is at the broker exactly once")
	  or diag(sprintf('%d of %d events %s are not there exactly once: %d messages for them',
		scalar(@wrong), scalar(@$ids), $what, $n));
}
is_deeply([ sort keys %$copies ], [ sort @all ], 'the broker holds exactly the 100 events');
is_deeply(first_occurrences($msgs), committed_ids($new),
	'per key, broker order equals enqueue order, across the restore');

# obx.status agrees with obx.outbox_events: everything published.
is($new->safe_psql('postgres', q{
	SELECT sum(pending) || ' pending, ' || sum(leased) || ' leased, '
		   || sum(published) || ' published' FROM obx.status}),
	'0 pending, 0 leased, 100 published', 'obx.status: all 100 published, nothing pending');
is($new->safe_psql('postgres', q{
	SELECT count(*) FILTER (WHERE published_at IS NULL) || ' pending, '
		   || count(*) || ' in all' FROM obx.outbox_events}),
	'0 pending, 100 in all', 'obx.outbox_events: all 100 published, nothing pending');

done_testing();
