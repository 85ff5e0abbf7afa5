# ALTER EXTENSION obx UPDATE from 1.0 (the release's obx--1.0.sql) through
# 1.1 to 1.2, with events in every state.
#
# 1.0 kept one row per event and wrote it again when it was published
# (published_at, partition, offset) or failed (error, backoff, quarantine);
# a lease was a row of obx.leases.  obx--1.0--1.1.sql carries them into the
# outbox log (docs/internals.md): published events become records and stay
# published, failing and quarantined ones get their state, pending and
# leased ones stay pending (a 1.0 lease is dropped: its events were not
# published yet).  With the library of 1.2 loaded and the schema still at
# 1.0, the relay waits for the update and says so.
#
# The states are written as 1.0's relay wrote them.  After the update:
# every pending and leased event reaches the broker once; no published one
# is sent again, and each keeps where it landed; the backing-off event is
# sent once its backoff ends; the quarantined one stays quarantined with its
# error and still blocks its key, until obx.retry, after which its key's
# events go out in enqueue order; the skipped one stays skipped; a
# subscription names its handler by name, and a mark still dedupes.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $topic = 'orders.upgrade.v1';

my $mock = start_mock();
my $node = obx_node('upgrade', $mock, 'obx.workers' => 2);
mock_cmd($mock, "topic-create $topic 3 3");
sub q1 { $node->safe_psql('postgres', $_[0]) }

my $log_offset = -s $node->logfile;
# The relays claim all along: DROP EXTENSION, which locks obx's tables one
# by one, can deadlock with a claim, and PostgreSQL then cancels one of the
# two.  It is run again until it is not the one cancelled.
wait_until(sub {
	my ($ret, $out, $err) = $node->psql('postgres',
		q{DROP EXTENSION obx; CREATE EXTENSION obx VERSION '1.0'});
	die "DROP EXTENSION obx failed: $err" if $ret != 0 && $err !~ /deadlock detected/;
	$ret == 0 }, 'DROP EXTENSION obx without a deadlock');
is(q1(q{SELECT extversion FROM pg_extension WHERE extname = 'obx'}), '1.0', 'obx 1.0 is installed');

# id($n): a readable event id.
sub id { sprintf('00000000-0000-4000-8000-%012d', $_[0]) }
sub enqueue
{
	my ($n, $key) = @_;
	q1(qq{SELECT obx.enqueue('$topic', '$key', '{"n": $n}', event_id => '@{[ id($n) ]}')});
	return id($n);
}

# Published: 1,500 of them (more than one carried-over record), at
# partitions and offsets the broker does not hold: sending one again would
# show at the broker.
q1(qq{SELECT obx.enqueue('$topic', 'pub' || (i % 7), jsonb_build_object('n', i),
						 event_id => ('00000000-0000-4000-8001-' || lpad(i::text, 12, '0'))::uuid)
		FROM generate_series(1, 1500) i});
q1(q{UPDATE obx.outbox_events
		SET published_at = now() - interval '1 hour', kafka_partition = 2,
			kafka_offset = 100000 + seq, attempts = 1
	  WHERE event_key LIKE 'pub%'});
# Pending, on keys of their own, two per key.
my @pending = map { enqueue($_, 'p' . ($_ % 5)) } 1 .. 10;
# Leased by a 1.0 worker that is gone.
my $leased = enqueue(20, 'lk');
q1(qq{INSERT INTO obx.leases (lease_id, owner, until, ids, topics, keys)
	  VALUES (nextval('obx.lease_seq'), 0, now() + interval '1 hour',
			  ARRAY['$leased']::uuid[], ARRAY['$topic'], ARRAY['lk'])});
# Backing off for a few seconds after a transient error.
my $backing = enqueue(30, 'bk');
q1(qq{UPDATE obx.outbox_events
		SET attempts = 2, last_error = 'REQUEST_TIMED_OUT: Broker: Request timed out',
			last_error_class = 'transient', last_error_at = now(),
			next_attempt_at = now() + interval '3 seconds'
	  WHERE id = '$backing'});
# Quarantined, and a pending event of its key behind it.
my $poison = enqueue(40, 'qk');
my $behind = enqueue(41, 'qk');
q1(qq{UPDATE obx.outbox_events
		SET attempts = 1, failures = 1, quarantined_at = now(),
			last_error = 'MSG_SIZE_TOO_LARGE: Broker: Message size too large',
			last_error_class = 'permanent', last_error_at = now()
	  WHERE id = '$poison'});
# Skipped.
my $skipped = enqueue(50, 'sk');
q1(qq{UPDATE obx.outbox_events SET quarantined_at = now(), last_error = 'x', last_error_class = 'permanent'
	  WHERE id = '$skipped'});
is(q1(qq{SELECT obx.skip('$skipped', 'reissued')}), 't', 'one event skipped under 1.0');

# A subscription (1.0 named its handler by OID) and a mark.
mock_cmd($mock, "topic-create other.upgrade.v1 1");
q1(q{CREATE FUNCTION public.on_event(e obx.inbound_event) RETURNS void
	 LANGUAGE plpgsql AS $$BEGIN END$$});
q1(q{SELECT obx.subscribe('shop', ARRAY['other.upgrade.v1'], 'public.on_event(obx.inbound_event)')});
is(q1(q{SELECT obx.mark_processed('shop', 'm1')}), 't', 'one mark under 1.0');
my $owner = q1('SELECT current_user');

my $before = q1(q{SELECT string_agg(id || ' ' || kafka_partition || ' ' || kafka_offset || ' '
		|| to_char(published_at, 'YYYY-MM-DD HH24:MI:SS.US'), ',' ORDER BY id)
	FROM obx.outbox_events WHERE published_at IS NOT NULL});

ok($node->wait_for_log(qr/is waiting for ALTER EXTENSION obx UPDATE in database "postgres"/, $log_offset),
	'the relay waits for ALTER EXTENSION obx UPDATE, and says so');
is(scalar @{ read_topic($mock, $topic) }, 0, 'nothing was sent before the update');

q1(q{ALTER EXTENSION obx UPDATE});
is(q1(q{SELECT extversion FROM pg_extension WHERE extname = 'obx'}), '1.2', 'obx is at 1.2');
relay_ready($node, 2);

# Everything publishable reaches the broker: pending, leased, backing off.
my @expected = (@pending, $leased, $backing);
my $msgs = wait_for_broker($mock, $topic, sub {
	my $seen = event_ids_at_broker(shift);
	!grep { !$seen->{$_} } @expected }, 'the pending, leased and backing-off events at the broker');
my $seen = event_ids_at_broker($msgs);
is_deeply([ sort keys %$seen ], [ sort @expected ],
	'the broker holds exactly those: no published, quarantined, blocked or skipped event was sent');
is(scalar(grep { $_ > 1 } values %$seen), 0, 'each once');

is(q1(q{SELECT string_agg(id || ' ' || kafka_partition || ' ' || kafka_offset || ' '
		|| to_char(published_at, 'YYYY-MM-DD HH24:MI:SS.US'), ',' ORDER BY id)
	FROM obx.outbox_events WHERE id::text LIKE '00000000-0000-4000-8001-%'}),
	$before, 'the 1,500 published events keep published_at, partition and offset');
is(q1(qq{SELECT attempts || ' ' || last_error_class FROM obx.outbox_events WHERE id = '$backing'}),
	'3 transient', 'the backing-off event kept its attempts and error, and counted its publication');
is(q1(qq{SELECT id || ' ' || attempts || ' ' || last_error_class FROM obx.quarantine}),
	"$poison 1 permanent", 'the quarantined event is still quarantined, with its error');
is(q1(qq{SELECT count(*) FROM obx.outbox_events WHERE id IN ('$poison', '$behind')
		   AND published_at IS NULL}), '2', 'it still blocks its key');
is(q1(qq{SELECT count(*) FROM obx.outbox_events WHERE id = '$skipped'}) . ' '
	. q1(qq{SELECT skip_reason FROM obx.skipped_events WHERE id = '$skipped'}),
	'0 reissued', 'the skipped event stays skipped');

is(q1(q{SELECT handler || ' ' || handler_owner || ' ' || owner FROM obx.subscriptions}),
	"public.on_event(obx.inbound_event) $owner $owner",
	'the subscription names its handler schema-qualified, with its owner');
is(q1(q{SELECT coalesce(problem, 'no problem') FROM obx.consumers}), 'no problem',
	'the subscription is served');
is(q1(q{SELECT obx.mark_processed('shop', 'm1')}), 'f', "1.0's mark still dedupes");

is(q1(qq{SELECT obx.retry('$poison')}), 't', 'obx.retry takes the quarantined event');
$msgs = wait_for_broker($mock, $topic, sub {
	my $s = event_ids_at_broker(shift);
	$s->{$poison} && $s->{$behind} }, 'the retried event and the one behind it at the broker');
is_deeply(first_occurrences($msgs)->{qk}, [ $poison, $behind ],
	'the retried event went first, then the one behind it');
ok(all_published($node), 'nothing is left unpublished');
is_deeply(first_occurrences($msgs), committed_ids($node, "event_key NOT LIKE 'pub%'"),
	'per key, the broker order is the enqueue order');

done_testing();
