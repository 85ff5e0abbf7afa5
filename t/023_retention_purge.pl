# The retention purge (docs/operations.md, section Retention).
#
# Relay worker 0 rotates the outbox (docs/internals.md, "The outbox log"):
# a generation older than half of obx.retention is closed, marked done once
# every event of it is published, and truncated obx.retention after that;
# it deletes rows of obx.processed_events whose processed_at is older
# than obx.processed_retention, and dead letters that failed (or, for a
# replayed one, were replayed) longer ago than obx.dead_letter_retention,
# at most 1000 rows of each a pass, logging how many of the dead letters
# were never replayed.  Unpublished events are never purged: neither one
# that waits behind a quarantined event of its key nor the quarantined
# one, however old; they outlive their generation in obx.event_states.
# After the purge an id can be enqueued and published again, obx.replay
# ignores a purged id, and a purged dedupe mark no longer stops the effect
# (the dedupe rule of the docs).
#
# Age is made, not waited for: the generation and the rows that must go are
# moved two days into the past and the retentions set to one day, so no
# row's fate depends on how fast the test runs.  Every retention is 0
# (forever) until the rows are in place.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $topic = 'ret.v1';
my $nold = 1100;    # several batches, published before the generation is closed
my $nnew = 20;

# The poison: the producer's own size limit (see t/022).
my $mock = start_mock();
my $node = obx_node('retention', $mock,
	'obx.workers' => 1,
	'obx.kafka_properties' => "'message.max.bytes=20000'",
	'obx.max_payload_size' => "'1MB'",
	'obx.max_attempts' => 1,
	'obx.retention' => 0,
	'obx.processed_retention' => 0,
	'obx.dead_letter_retention' => 0);
relay_ready($node, 1);

sub q1 { $node->safe_psql('postgres', $_[0]) }

# count_set($set): how many events of that set are in the outbox.
sub count_set
{
	my ($set) = @_;
	return q1("SELECT count(*) FROM obx.outbox_events WHERE payload->>'set' = '$set'");
}

############################################################################
# The rows.
############################################################################

# Published events of the first generation, to be aged.
q1(qq{SELECT obx.enqueue('$topic', 'k' || (i % 10), jsonb_build_object('set', 'old', 'i', i))
	    FROM generate_series(1, $nold) i});
ok(all_published($node), 'every event of the old set is published');

# A quarantined event and one that waits behind it on its key.
my $poison = q1(qq{SELECT obx.enqueue('$topic', 'kq',
	jsonb_build_object('set', 'poison', 'blob', repeat('x', 50000)))});
ok($node->poll_query_until('postgres',
	"SELECT quarantined_at IS NOT NULL FROM obx.outbox_events WHERE id = '$poison'"),
	'the poison event is quarantined');
my $blocked = q1(qq{SELECT obx.enqueue('$topic', 'kq', '{"set": "blocked"}')});

# Dedupe marks, and dead letters of every kind.
q1(q{SELECT obx.mark_processed('ret-app', s || '-' || i)
	   FROM unnest(ARRAY['old', 'new']) s, generate_series(1, 200) i});
q1(q{
	INSERT INTO obx.dead_letters (consumer_name, event_id, topic, kafka_partition,
			kafka_offset, error_class, error_message, failed_at, replayed_at)
	VALUES
		('ret-app', 'dl-old', 'ret.in.v1', 0, 0, 'handler', 'e', now() - interval '2 days', NULL),
		('ret-app', 'dl-replayed-old', 'ret.in.v1', 0, 1, 'handler', 'e',
		 now() - interval '3 days', now() - interval '2 days'),
		('ret-app', 'dl-replayed-new', 'ret.in.v1', 0, 2, 'handler', 'e',
		 now() - interval '3 days', now()),
		('ret-app', 'dl-new', 'ret.in.v1', 0, 3, 'handler', 'e', now(), NULL);
});

# Age: every event occurred two days ago, the first generation started
# then, the old marks were made then.
q1(qq{
	UPDATE obx.events SET occurred_at = now() - interval '2 days';
	UPDATE obx.generations SET started_at = now() - interval '2 days';
	UPDATE obx.processed_events SET processed_at = now() - interval '2 days'
	 WHERE event_id LIKE 'old-%';
});
is(q1(qq{SELECT count(*) FROM obx.outbox_events
		  WHERE id IN ('$poison', '$blocked') AND published_at IS NULL}),
	'2', 'the quarantined event and the one behind it are unpublished');
my ($old_id, $old_key, $old_payload) = split /\|/,
  q1(q{SELECT id, event_key, payload FROM obx.outbox_events WHERE payload = '{"set": "old", "i": 1}'});

# Before the purge, the same id and content is a no-op.
is(q1(qq{SELECT obx.enqueue('$topic', '$old_key', '$old_payload', event_id => '$old_id')}),
	$old_id, 'before the purge, enqueueing a retained event again returns its id');
is(count_set('old'), $nold, '... and adds no row');

is(q1('SELECT count(*) FROM obx.outbox_events'), $nold + 2,
	'with every retention 0 nothing was purged');

############################################################################
# The purge.
############################################################################
my $log_offset = -s $node->logfile;
q1(q{
	ALTER SYSTEM SET obx.retention = '1d';
	ALTER SYSTEM SET obx.processed_retention = '1d';
	ALTER SYSTEM SET obx.dead_letter_retention = '1d';
	SELECT pg_reload_conf();
});
# The first generation, older than half the retention, is closed; every
# event of it is published or held, so it is done.
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 1 FROM obx.generations WHERE generation = 1}),
	'the first generation is closed: new events go to the next');
ok($node->poll_query_until('postgres', q{
	SELECT done_at IS NOT NULL FROM obx.generations WHERE generation = 0}),
	'the first generation is done once the event behind the quarantined one is held');
is(count_set('old'), $nold, 'a done generation stays for obx.retention');

# Published events of the new generation, to stay recent.
q1(qq{SELECT obx.enqueue('$topic', 'k' || (i % 10), jsonb_build_object('set', 'new', 'i', i))
	    FROM generate_series(1, $nnew) i});
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 0 FROM obx.outbox_events
	 WHERE payload->>'set' = 'new' AND published_at IS NULL}),
	'every event of the new set is published');
my ($new_id, $new_key, $new_payload) = split /\|/,
  q1(q{SELECT id, event_key, payload FROM obx.outbox_events WHERE payload = '{"set": "new", "i": 1}'});
is(q1(qq{SELECT count(*) FROM obx.events WHERE payload->>'set' = 'new' AND seq >> 40 = 1}),
	$nnew, 'the new set is in the new generation');

# The first generation was done two days ago.
q1(q{UPDATE obx.generations SET done_at = now() - interval '2 days' WHERE generation = 0});
ok($node->poll_query_until('postgres', q{
	SELECT (SELECT count(*) FROM obx.outbox_events WHERE payload->>'set' = 'old') = 0
	   AND (SELECT count(*) FROM obx.processed_events WHERE event_id LIKE 'old-%') = 0
	   AND (SELECT count(*) FROM obx.dead_letters
	         WHERE event_id IN ('dl-old', 'dl-replayed-old')) = 0}),
	"the purge truncated the first generation's $nold published events, deleted the old marks and the old dead letters");
is(q1(q{SELECT count(*) FROM obx.events_0}), '0', 'the first generation\'s partition is empty');

is(count_set('new'), $nnew, 'published events younger than obx.retention stay');
is(q1(qq{SELECT string_agg(payload->>'set' || ' ' || (quarantined_at IS NOT NULL)
				|| ' ' || (published_at IS NULL), ', ' ORDER BY seq)
		  FROM obx.outbox_events WHERE id IN ('$poison', '$blocked')}),
	'poison true true, blocked false true',
	'the quarantined event and the unpublished one behind it stay, although they occurred two days ago');
is(q1(q{SELECT count(*) FROM obx.processed_events WHERE event_id LIKE 'new-%'}),
	'200', 'dedupe marks younger than obx.processed_retention stay');
is(q1(q{SELECT string_agg(event_id, ', ' ORDER BY event_id) FROM obx.dead_letters}),
	'dl-new, dl-replayed-new',
	'dead letters stay while their failure, or their replay for a replayed one, is younger than obx.dead_letter_retention');
like(slurp_file($node->logfile, $log_offset),
	qr/obx purged 1 dead letters that were never replayed/,
	'the purge logs how many dead letters were never replayed');

############################################################################
# After the purge.
############################################################################
is(q1(qq{SELECT obx.replay(ARRAY['$old_id']::uuid[])}), '0', 'obx.replay ignores a purged id');
is(q1(qq{SELECT obx.enqueue('$topic', '$new_key', '$new_payload', event_id => '$new_id')}),
	$new_id, 'a retained event enqueued again is still a no-op');
is(q1(qq{SELECT obx.enqueue('$topic', '$old_key', '$old_payload', event_id => '$old_id')}),
	$old_id, 'a purged id can be enqueued again');
is(count_set('old'), '1', '... as a new row');
ok($node->poll_query_until('postgres',
	"SELECT published_at IS NOT NULL FROM obx.outbox_events WHERE id = '$old_id'"),
	'and it is published again');
my $copies = wait_for_broker($mock, $topic,
	sub { 2 == grep { ($_->{event_id} // '') eq $old_id } @{ $_[0] } },
	'the second copy of the purged id at the broker');
is(scalar(grep { ($_->{event_id} // '') eq $new_id } @$copies), 1,
	'the retained event was not sent again');
is(q1(q{SELECT obx.mark_processed('ret-app', 'old-1')}), 't',
	'a purged dedupe mark no longer stops a redelivery: mark_processed returns true again');
is(q1(q{SELECT obx.mark_processed('ret-app', 'new-1')}), 'f',
	'a retained mark still does');

done_testing();
