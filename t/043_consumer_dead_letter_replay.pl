# Consumer window: events that can never be handled as they are.  A
# message that is not JSON, an empty value, JSON without any event id
# (malformed), and an event whose handler fails with an error that is not
# transient (a required field missing; a tombstone, which reaches the
# handler as a deletion with a NULL payload, refused by this handler) are
# each dead-lettered in obx.dead_letters with topic, partition, offset,
# consumer, error class and message; the partition moves on (the messages after them are
# handled); the log names the first event of each error class (at most
# one line a minute per class) and never shows the payload.  A
# dead-lettered event delivered again is a duplicate, not a second dead
# letter.  After the handler is fixed (CREATE OR REPLACE FUNCTION),
# obx.replay_dead_letter applies each dead letter exactly once: a replay
# that is rolled back applies nothing, two concurrent replays apply it
# once, a second replay applies nothing, and a dead letter the handler
# still refuses stays one, with its replay error.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use ObxConsumer;
use IPC::Run;
use PostgreSQL::Test::Utils;
use Test::More;

my $mock = start_mock();
my $topic = 'stock.dl.v1';
my $consumer = 'stock-dl';

my $node = consumer_node('consumer_dead_letter', $mock, topics => { $topic => 2 });

sub q1 { $node->safe_psql('postgres', $_[0]) }

# The handler as first deployed: a reservation needs a sku.
subscribe($node, $consumer, [$topic], handler($node, 'shop.reserve', q{
		IF e.payload IS NULL THEN
			RAISE EXCEPTION 'reservation event has no payload';
		END IF;
		IF e.payload->>'sku' IS NULL THEN
			RAISE EXCEPTION 'missing required field sku';
		END IF;
		PERFORM shop.record(e);}));

############################################################################
# 1. Dead letters, and the partition moves on.
############################################################################
# Partition 0, offsets 0..7.  Every payload holds the word SECRET, which
# must never reach the log.
produce($mock, $topic,
	{ partition => 0, key => 'sku-1', headers => [ event_id => 'evt-dl-g1' ],
	  payload => '{"sku": "sku-1", "qty": 1, "note": "SECRET"}' },
	{ partition => 0, key => 'sku-9', headers => [ event_id => 'evt-dl-bad1' ],
	  payload => 'SECRET card 4111 reserve sku-9' },
	{ partition => 0, key => 'sku-7',
	  payload => '{"sku": "sku-7", "qty": 1, "note": "SECRET no id"}' },
	{ partition => 0, key => 'sku-h1', headers => [ event_id => 'evt-dl-h1' ],
	  payload => '{"eventType": "StockReserved", "qty": 2, "note": "SECRET h1"}' },
	{ partition => 0, key => 'sku-tomb', headers => [ event_id => 'evt-dl-tomb' ],
	  payload => undef },
	{ partition => 0, key => 'sku-empty', headers => [ event_id => 'evt-dl-empty' ],
	  payload => '' },
	{ partition => 0, key => 'sku-2',
	  payload => '{"eventId": "evt-dl-g2", "sku": "sku-2", "qty": 1, "note": "SECRET"}' },
	{ partition => 0, key => 'sku-3',
	  payload => '{"event_id": "evt-dl-g3", "sku": "sku-3", "qty": 1, "note": "SECRET"}' },
	{ partition => 1, key => 'sku-4', headers => [ event_id => 'evt-dl-o1' ],
	  payload => '{"sku": "sku-4", "qty": 1}' });
my $ends = partition_ends($mock, $topic);
is_deeply($ends, { 0 => 8, 1 => 1 }, 'the broker holds the nine messages');
wait_caught_up($node, $consumer, $topic, $ends, 'dead letters and the events after them');

is_deeply(effects_per_event($node),
	{ map { $_ => 1 } qw(evt-dl-g1 evt-dl-g2 evt-dl-g3 evt-dl-o1) },
	'the good events, before and after the bad ones, have their effect once; the failed one none');

# One dead letter per bad message: offset, id, class.
is(q1(qq{SELECT string_agg(kafka_partition || ':' || kafka_offset || ' ' || coalesce(event_id, '-')
							 || ' ' || coalesce(event_key, '-') || ' ' || error_class, ', '
							 ORDER BY kafka_partition, kafka_offset)
		   FROM obx.dead_letters WHERE consumer_name = '$consumer' AND topic = '$topic'}),
	'0:1 evt-dl-bad1 sku-9 malformed, 0:2 - sku-7 malformed, 0:3 evt-dl-h1 sku-h1 handler, '
	  . '0:4 evt-dl-tomb sku-tomb handler, 0:5 evt-dl-empty sku-empty malformed',
	'obx.dead_letters: the three malformed messages and the two handler failures, where they were');
is(q1(qq{SELECT payload IS NULL, convert_from(raw_payload, 'UTF8'), headers->>'event_id'
		   FROM obx.dead_letters WHERE consumer_name = '$consumer' AND event_id = 'evt-dl-bad1'}),
	't|SECRET card 4111 reserve sku-9|evt-dl-bad1',
	'not JSON: no payload, the raw bytes kept, the headers kept');
is(q1(qq{SELECT payload->>'note', raw_payload IS NULL
		   FROM obx.dead_letters WHERE consumer_name = '$consumer' AND kafka_offset = 2}),
	'SECRET no id|t', 'JSON without an event id: the payload kept');
is(q1(qq{SELECT payload IS NULL, raw_payload IS NULL FROM obx.dead_letters
		  WHERE consumer_name = '$consumer' AND event_id = 'evt-dl-tomb'}),
	't|t', 'a tombstone: no payload, no raw bytes');
is(q1(qq{SELECT error_sqlstate, payload->>'qty', replayed_at IS NULL, replay_attempts
		   FROM obx.dead_letters WHERE consumer_name = '$consumer' AND event_id = 'evt-dl-h1'}),
	'P0001|2|t|0',
	'the handler failure: its SQLSTATE, the payload, not replayed');
like(q1(qq{SELECT error_message FROM obx.dead_letters
		    WHERE consumer_name = '$consumer' AND event_id = 'evt-dl-h1'}),
	qr/missing required field sku/, 'the handler failure: its error message');
is(q1(qq{SELECT count(*) FROM obx.dead_letters
		  WHERE consumer_name = '$consumer' AND (error_message IS NULL OR error_message = ''
			OR failed_at IS NULL OR replayed_at IS NOT NULL)}), '0',
	'every dead letter has an error message and a time, none is replayed');

my $s = partition_status($node, $consumer, $topic);
is("$s->{0}{processed} $s->{0}{duplicates} $s->{0}{dead_lettered} $s->{0}{retries}", '3 0 5 0',
	'consumer_status of partition 0: 3 processed, 5 dead-lettered, no retries');
is(q1(qq{SELECT dead_letters_pending FROM obx.consumers WHERE consumer_name = '$consumer'}), '5',
	'obx.consumers: five dead letters pending');
is(q1(qq{SELECT string_agg(event_id, ' ' ORDER BY event_id COLLATE "C") FROM obx.processed_events
		  WHERE consumer_name = '$consumer'}),
	'evt-dl-bad1 evt-dl-empty evt-dl-g1 evt-dl-g2 evt-dl-g3 evt-dl-h1 evt-dl-o1 evt-dl-tomb',
	'every message with an event id is marked processed, dead letters included');

# The log: a message naming consumer group, topic, partition, offset,
# event id and error class (in the message or its DETAIL), never the
# payload, for the first dead letter of each error class; the same trouble
# of a subscription is logged at most once a minute (the next line counts
# those kept back), so the other malformed ones, handled within a second
# of the first, are in obx.dead_letters (checked above) and not each in
# the log.  Our own statements, which the test harness logs, are left out.
my @entries;
for my $line (split /\n/, slurp_file($node->logfile))
{
	if ($line =~ /^\d{4}-\d\d-\d\d \S+ \S+ \[\d+\] .*?(DETAIL|HINT|CONTEXT|STATEMENT):  /
		|| $line !~ /^\d{4}-\d\d-\d\d /)
	{
		$entries[-1] .= "\n$line" if @entries;
	}
	else
	{
		push @entries, $line;
	}
}
my @server = grep { !/ statement: / } @entries;
for my $dl ([ 1, 'evt-dl-bad1', 'malformed' ], [ 3, 'evt-dl-h1', 'handler' ])
{
	my ($offset, $id, $class) = @$dl;
	my @hits = grep {
		/\Q$consumer\E/ && /\Q$topic\E/ && /partition\W{0,3}0\b/ && /offset\W{0,3}$offset\b/
		  && /\b$class\b/i && (!defined $id || /\Q$id\E/)
	} @server;
	ok(scalar(@hits),
		"the log names consumer group, topic, partition, offset, event id and error class of the dead letter at offset $offset")
	  or diag(join("\n", grep { /dead|quarantin/i } @server));
}
cmp_ok(scalar(grep { /quarantined a malformed message/ } @server), '<', 4,
	'the four malformed messages are not logged one by one');
unlike(join("\n", @server), qr/SECRET/, 'the log never shows a payload');

# The dead-lettered event delivered again, on the other partition: a
# duplicate, not a second dead letter.
produce($mock, $topic,
	{ partition => 1, key => 'sku-h1', headers => [ event_id => 'evt-dl-h1' ],
	  payload => '{"eventType": "StockReserved", "qty": 2, "note": "SECRET h1"}' });
wait_caught_up($node, $consumer, $topic, { 1 => 2 }, 'the copy of the dead-lettered event');
is(partition_status($node, $consumer, $topic)->{1}{duplicates}, '1',
	'the copy of a dead-lettered event counts as a duplicate');
is(q1(qq{SELECT count(*) FROM obx.dead_letters WHERE consumer_name = '$consumer'}), '5',
	'and is not dead-lettered a second time');

############################################################################
# 2. Replay.
############################################################################
my $h1 = q1(qq{SELECT id FROM obx.dead_letters WHERE consumer_name = '$consumer' AND event_id = 'evt-dl-h1'});
sub applied
{
	my ($id) = @_;
	return q1("SELECT count(*) FROM shop.effects WHERE event_id = '$id'");
}

# Before the fix, replay fails and keeps the dead letter.
is(q1("SELECT obx.replay_dead_letter(ARRAY[$h1]::bigint[])"), '0',
	'replay before the fix applies nothing');
is(q1("SELECT replayed_at IS NULL, replay_attempts FROM obx.dead_letters WHERE id = $h1"),
	't|1', 'the failed replay is counted');
like(q1("SELECT last_replay_error FROM obx.dead_letters WHERE id = $h1"),
	qr/missing required field sku/, 'the failed replay keeps its error');
is(applied('evt-dl-h1'), '0', 'no effect');

# The fix: a missing sku means the default warehouse bin.
q1(q{
	CREATE OR REPLACE FUNCTION shop.reserve(e obx.inbound_event) RETURNS void
	LANGUAGE plpgsql AS $$
	BEGIN
		IF e.payload IS NULL THEN
			RAISE EXCEPTION 'reservation event has no payload';
		END IF;
		PERFORM shop.record(e);
	END
	$$;
});

# A replay in a transaction that rolls back applies nothing.
is(q1("BEGIN; SELECT obx.replay_dead_letter(ARRAY[$h1]::bigint[]); ROLLBACK;"), '1',
	'inside a transaction, replay applies the fixed handler');
is(applied('evt-dl-h1') . ' ' . q1("SELECT replayed_at IS NULL FROM obx.dead_letters WHERE id = $h1"),
	'0 t', 'rolled back: no effect, still a dead letter');

# Two replays at once: A has applied it and not committed; B replays too.
my $sa = $node->background_psql('postgres');
is($sa->query_safe("BEGIN; SELECT obx.replay_dead_letter(ARRAY[$h1]::bigint[]);"), '1',
	'session A replays the dead letter (not committed yet)');
my ($sb_out, $sb_err) = ('', '');
my $sb = IPC::Run::start(
	[ 'psql', '-XAtq', '-d', $node->connstr('postgres') . ' application_name=replay_b',
	  '-c', "SELECT obx.replay_dead_letter(ARRAY[$h1]::bigint[])" ],
	'<', \undef, '>', \$sb_out, '2>', \$sb_err,
	IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
# B either waits for A's transaction, or is done (having skipped a dead
# letter that another transaction holds).
my $sb_waited = 0;
wait_until(sub {
	$sb->pump_nb;
	return 1 unless $sb->pumpable;
	$sb_waited = q1(q{SELECT count(*) FROM pg_stat_activity
					  WHERE application_name = 'replay_b' AND wait_event_type = 'Lock'});
	$sb_waited > 0;
}, 'session B to wait for A or finish');
note($sb_waited ? 'session B waited for A' : 'session B did not wait for A');
$sa->query_safe('COMMIT');
$sa->quit;
$sb->finish;
chomp $sb_out;
is($sb_out, '0', 'session B, after A committed, applies nothing');
is($sb_err, '', 'session B had no error');
is(applied('evt-dl-h1'), '1', 'two concurrent replays: the effect exactly once');

is(q1("SELECT obx.replay_dead_letter(ARRAY[$h1]::bigint[])"), '0',
	'replaying a replayed dead letter again applies nothing');
is(applied('evt-dl-h1'), '1', 'the effect still exactly once');
is(q1("SELECT replayed_at IS NOT NULL FROM obx.dead_letters WHERE id = $h1"), 't',
	'the dead letter is marked replayed');

# Malformed ones are repaired by hand first; the tombstone and the empty
# message are not, and the handler refuses them again (the tombstone is
# replayed as a deletion, the empty message is refused before the handler).
q1(qq{
	UPDATE obx.dead_letters SET payload = '{"sku": "sku-9", "qty": 1}'
	 WHERE consumer_name = '$consumer' AND event_id = 'evt-dl-bad1';
	-- (the payload was kept, being JSON; the coalesce only repairs it if
	-- it was not, which the check in part 1 already reports)
	UPDATE obx.dead_letters SET event_id = 'evt-dl-noid-fixed',
	       payload = coalesce(payload, convert_from(raw_payload, 'UTF8')::jsonb)
	 WHERE consumer_name = '$consumer' AND event_id IS NULL;
});
is(q1(qq{SELECT obx.replay_dead_letter('$consumer')}), '2',
	'replay of every dead letter of the consumer applies the two repaired ones');
is(q1(qq{SELECT obx.replay_dead_letter('$consumer')}), '0',
	'a second replay of the consumer applies nothing');
is_deeply(effects_per_event($node),
	{ map { $_ => 1 } qw(evt-dl-g1 evt-dl-g2 evt-dl-g3 evt-dl-o1 evt-dl-h1
		evt-dl-bad1 evt-dl-noid-fixed) },
	'every replayed event has its effect exactly once');
is(q1(qq{SELECT string_agg(event_id || ' ' || replay_attempts || ' ' || (last_replay_error IS NOT NULL), ', ' ORDER BY event_id COLLATE "C")
		   FROM obx.dead_letters WHERE consumer_name = '$consumer' AND replayed_at IS NULL}),
	'evt-dl-empty 2 true, evt-dl-tomb 2 true',
	'the tombstone and the empty message stay dead letters, with two failed replays each');
is(q1(qq{SELECT dead_letters_pending FROM obx.consumers WHERE consumer_name = '$consumer'}), '2',
	'obx.consumers: two dead letters pending');

done_testing();
