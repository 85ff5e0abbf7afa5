# One event per given id, under concurrency, at no cost to rotation
# (docs/sql.md, "Repeated event id"; docs/internals.md, "One event per id"):
#
# 1. Many sessions enqueue the same fresh ids at the same moment, each id
#    with one content: every call returns its id, none fails (two calls
#    that both found an id free would both insert it, and the second would
#    fail on the partition's unique index), and each id is one event.
# 2. A transaction that enqueued an event with a given id, still open,
#    holds no lock on the partitions of the other generations nor on
#    obx.event_states: a truncation of an old generation (ACCESS EXCLUSIVE,
#    taken without waiting by obx._rotate) is not held back by it.
# 3. A quarantined event outlives its generation in obx.event_states: once
#    the generation is truncated its id still names it, on the extension
#    and on the SQL-only install (with obx-relay): other content fails with
#    23505, the same content is a no-op, and obx.events gets no second
#    event with that id.
# 4. On the SQL-only install, which holds its lock on a given id to the end
#    of the transaction, an obx.enqueue_many of more given ids than the lock
#    table holds goes in (and again is a no-op).
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxDaemon;
use ObxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $mock = start_mock();
my $node = obx_node('event_id_locks', $mock, 'obx.workers' => 1);

# 1. Each call gives the id of the current 2 ms, so that the sessions race
# for every fresh id; the payload is a function of the id.
$node->pgbench(
	'--no-vacuum --client=4 --jobs=2 --transactions=600',
	0,
	[qr{processed: 2400/2400}],
	[qr{^$}],
	'concurrent enqueues of the same fresh ids all succeed',
	{
		'036_same_ids' => q{
SELECT obx.enqueue('t.locks', 'k' || (m % 7), jsonb_build_object('m', m),
				   event_id => md5(m::text)::uuid)
  FROM (SELECT floor(extract(epoch FROM clock_timestamp()) * 500)::bigint AS m) s;
}
	});
my ($rows, $ids, $shared) = split /\|/, $node->safe_psql('postgres', q{
	SELECT count(*), count(DISTINCT id),
		   (SELECT count(*) FROM obx.events WHERE payload->>'m' IS NOT NULL
			  AND id <> md5((payload->>'m'))::uuid)
	  FROM obx.events WHERE topic = 't.locks'});
is($rows, $ids, "each of the $ids ids enqueued is one event");
is($shared, 0, 'each event holds the content of its id');
cmp_ok($ids, '<', 2400, 'the sessions did race for the same ids (fewer ids than calls)');

# 2. An open transaction that gave an id: the other generations' partitions
# and the states can be locked ACCESS EXCLUSIVE without waiting.
my $current = $node->safe_psql('postgres',
	q{SELECT (last_value >> 40) % 3 FROM obx.event_seq});
my @others = map { "obx.events_$_" } grep { $_ != $current } 0 .. 2;
my $open = $node->background_psql('postgres');
$open->query_safe(q{BEGIN});
$open->query_safe(q{SELECT obx.enqueue('t.locks', 'open', '{"open": true}',
	event_id => '0b0e0000-0000-4000-8000-000000000036')});
my ($ret, $out, $err) = $node->psql('postgres',
	'BEGIN; LOCK TABLE ' . join(', ', @others, 'obx.event_states')
	  . ' IN ACCESS EXCLUSIVE MODE NOWAIT; COMMIT;', on_error_stop => 1);
is($ret, 0, 'an open transaction that gave an event id holds back no truncation of another generation')
  or diag($err);
$open->query_safe(q{COMMIT});
$open->quit;
is($node->safe_psql('postgres',
	q{SELECT count(*) FROM obx.events WHERE id = '0b0e0000-0000-4000-8000-000000000036'}),
	1, 'its event committed');

# 3. Held beyond its generation, on both installs.
sub held_after_truncation
{
	my ($node, $name) = @_;
	my $id = '0b0e0000-0000-4000-8000-0000000000a1';
	# Quarantined in the transaction that enqueues it, so no relay sends it.
	$node->safe_psql('postgres', qq{
		BEGIN;
		SELECT obx.enqueue('t.held', 'h', '{"v": "H"}', event_id => '$id');
		SELECT obx._hold(ARRAY['$id'::uuid]);
		UPDATE obx.event_states SET quarantined_at = now(), attempts = 1,
			   last_error = 'held by the test' WHERE id = '$id';
		COMMIT;});
	my $gen = $node->safe_psql('postgres', q{SELECT last_value >> 40 FROM obx.event_seq});
	$node->safe_psql('postgres',
		q{UPDATE obx.generations SET started_at = now() - interval '1 hour'});
	is($node->safe_psql('postgres', q{SELECT obx._rotate(1)}),
		'rotated to generation ' . ($gen + 1), "$name: the outbox rotates");
	# A claim in the new generation lets the old one be done; then, a
	# second after, truncated.
	$node->safe_psql('postgres', q{SELECT obx.enqueue('t.held', 'filler', '{}')});
	ok($node->poll_query_until('postgres', qq{
		SELECT obx._rotate(1) IS NOT DISTINCT FROM 'generation $gen truncated'
			OR NOT EXISTS (SELECT 1 FROM obx.generations WHERE generation = $gen)}),
		"$name: generation $gen is truncated");
	is($node->safe_psql('postgres', qq{
		SELECT (SELECT count(*) FROM obx.events WHERE id = '$id') || ','
			|| (SELECT count(*) FROM obx.quarantine WHERE id = '$id')}),
		'0,1', "$name: the quarantined event is held in its state only");
	my ($ret, $out, $err) = $node->psql('postgres',
		qq{SELECT obx.enqueue('t.held', 'h', '{"v": "other"}', event_id => '$id')},
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	like($err, qr/23505.*already exists with different content/,
		"$name: other content under the held event's id fails with 23505");
	is($node->safe_psql('postgres',
		qq{SELECT obx.enqueue('t.held', 'h', '{"v": "H"}', event_id => '$id')}),
		$id, "$name: the same content is a no-op returning the id");
	is($node->safe_psql('postgres', qq{SELECT count(*) FROM obx.events WHERE id = '$id'}),
		0, "$name: obx.events has no event with the held id");
	return;
}

held_after_truncation($node, 'extension');

my $sql = sql_only_node('event_id_locks_sql');
my $relay = start_relay(relay_config($sql, $mock, PostgreSQL::Test::Utils::tempdir('relay')));
ok($sql->poll_query_until('postgres', q{SELECT count(*) > 0 FROM obx.claims}),
	'SQL-only: obx-relay claims');
held_after_truncation($sql, 'SQL-only');
stop_relay($relay);

# 4. SQL-only: an obx.enqueue_many of 20,000 given ids (more than the lock
# table holds one lock each) goes in, and again is a no-op.
my $many = q{SELECT cardinality(obx.enqueue_many('t.many', array_agg('k' || (i % 10)),
	array_agg(jsonb_build_object('i', i)),
	event_ids => array_agg(md5('many' || i)::uuid))) FROM generate_series(1, 20000) i};
is($sql->safe_psql('postgres', $many), '20000', 'SQL-only: enqueue_many of 20,000 given ids');
is($sql->safe_psql('postgres', $many), '20000', 'SQL-only: the same again is a no-op');
is($sql->safe_psql('postgres', q{SELECT count(*) FROM obx.events WHERE topic = 't.many'}),
	'20000', 'SQL-only: one event per id');

done_testing();
