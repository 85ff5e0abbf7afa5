# ALTER EXTENSION obx UPDATE from each release to 1.2: the schema and the rows.
#
# The schema.  t/lib/obx-schema.sql lists every object of obx with its
# definition: columns in order, indexes, constraints, triggers, views,
# functions, sequences, grants, comments, the extension's members and the
# tables pg_dump keeps.  A fresh install, a database created as 1.0 and
# updated, and one created as 1.1 and updated have the same list.  Against
# t/expected, made on PostgreSQL 16 (views' and functions' text differs
# between majors, so only there): CREATE EXTENSION obx VERSION '1.1' gives
# the 1.1 release's schema (fcecabf's scripts), and so does 1.0 updated to
# 1.1; a fresh install is what main's scripts make (written there anew
# whenever they change it, from the catalog of a fresh install on
# PostgreSQL 16), but for where the column era stands, which
# obx--1.1--1.2.sql adds last to obx.events and obx.claims instead of after
# xid (and so last in the views that read them with e.* and c.*).
#
# The rows.  A 1.1 database as 1.1's relay left it: published events (a
# claim and its record), pending ones, one backing off, one quarantined
# with one of its key behind it, a subscription, consumer marks and a dead
# letter.  The pending events are enqueued by this library on the 1.1
# schema, as between the package's upgrade and the update, when the relay
# waits and says so, and sends nothing.  After the update: every pending
# and backing-off event reaches the broker once, and no published one is
# sent again; each published one keeps where it landed; the quarantined
# one stays quarantined and blocks its key until obx.retry, and then its
# key goes out in enqueue order; marks, dead letters and the subscription
# are as they were; every event and claim is of this install's era.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $topic = 'orders.upgrade11.v1';
my $other = 'other.upgrade11.v1';

my $mock = start_mock();
my $node = obx_node('upgrade11', $mock, 'obx.workers' => 2);
mock_cmd($mock, "topic-create $topic 3 3");
mock_cmd($mock, "topic-create $other 1");
sub q1 { $node->safe_psql('postgres', $_[0]) }

# --- the schema ----------------------------------------------------------

my $schema_sql = slurp_file("$FindBin::RealBin/lib/obx-schema.sql");
my $owner = q1('SELECT current_user');

# catalog($db): obx's objects in $db, one per line (continuations indented),
# the installing superuser's name as OWNER.
sub catalog
{
	my ($db) = @_;
	my $out = $node->safe_psql($db, $schema_sql);
	$out =~ s/\b\Q$owner\E\b/OWNER/g;
	return $out;
}

sub objects { return grep { length } split /\n(?! )/, $_[0] }

# same_catalog($got, $want, $name): one test; on a difference, the objects
# found on one side only.
sub same_catalog
{
	my ($got, $want, $name) = @_;
	my %want = map { $_ => 1 } objects($want);
	my %got = map { $_ => 1 } objects($got);
	my @missing = grep { !$got{$_} } objects($want);
	my @extra = grep { !$want{$_} } objects($got);
	ok(!@missing && !@extra, $name)
	  or diag(join("\n", (map { "missing: $_" } @missing[0 .. ($#missing < 9 ? $#missing : 9)]),
			(map { "extra:   $_" } @extra[0 .. ($#extra < 9 ? $#extra : 9)])));
}

# era_anywhere($catalog): the same, but for where era stands among the
# columns of obx.events, obx.claims, their partitions and the views that
# read them whole.
sub era_anywhere
{
	my @objs = map {
		s/^(column (?:events|events_\d|claims|claims_\d|_unpublished_events|_live_claims)) \d+ /$1 # /;
		if (/^view (?:_unpublished_events|_live_claims) /)
		{
			s/\n +[ce]\.era,(?=\n)//g;
			s/,\n +[ce]\.era(?=\n|$)//g;
		}
		$_
	} objects($_[0]);
	return join("\n", sort @objs);
}

for my $db (qw(fresh from10 from11))
{
	q1("CREATE DATABASE $db");
}
$node->safe_psql('fresh', 'CREATE EXTENSION obx');
$node->safe_psql('from10', q{CREATE EXTENSION obx VERSION '1.0'});
$node->safe_psql('from11', q{CREATE EXTENSION obx VERSION '1.1'});
my $at_1_1 = catalog('from11');
$node->safe_psql('from10', q{ALTER EXTENSION obx UPDATE TO '1.1'});
my $from10_at_1_1 = catalog('from10');
$node->safe_psql($_, 'ALTER EXTENSION obx UPDATE') for qw(from10 from11);
for my $db (qw(fresh from10 from11))
{
	is($node->safe_psql($db, q{SELECT extversion FROM pg_extension WHERE extname = 'obx'}),
		'1.2', "$db: obx is at 1.2");
}
my $fresh = catalog('fresh');
cmp_ok(scalar(objects($fresh)), '>', 600, 'the catalog lists every object (' . scalar(objects($fresh)) . ')');
same_catalog($from10_at_1_1, $at_1_1, '1.0 updated to 1.1 is CREATE EXTENSION obx VERSION 1.1');
same_catalog(catalog('from10'), $fresh, '1.0 updated to 1.2 is a fresh install');
same_catalog(catalog('from11'), $fresh, '1.1 updated to 1.2 is a fresh install');
like($fresh, qr/^column events 11 era integer not null default obx\._era\(\)/m,
	'era is the last of the 11 columns of obx.events');
like($fresh, qr/^column claims 11 era integer not null default obx\._era\(\)/m,
	'era is the last of the 11 columns of obx.claims');

my $major = q1(q{SELECT current_setting('server_version_num')::integer / 10000});
SKIP:
{
	my $expected = "$FindBin::RealBin/expected";
	skip "t/expected has the catalogs as PostgreSQL 16 prints them, not $major", 2
	  unless -f "$expected/obx-schema-1.1-pg$major.txt";
	same_catalog($at_1_1, slurp_file("$expected/obx-schema-1.1-pg$major.txt"),
		"CREATE EXTENSION obx VERSION '1.1' is the 1.1 release (fcecabf's scripts)");
	same_catalog(era_anywhere($fresh), era_anywhere(slurp_file("$expected/obx-schema-main-pg$major.txt")),
		"a fresh install is t/expected's, but for era's place");
}

# --- the rows --------------------------------------------------------------

my $log_offset = -s $node->logfile;
# DROP EXTENSION, which locks obx's tables one by one, can deadlock with a
# claim (t/091 says more): it is run again until it is not the one cancelled.
wait_until(sub {
	my ($ret, $out, $err) = $node->psql('postgres',
		q{DROP EXTENSION obx; CREATE EXTENSION obx VERSION '1.1'});
	die "DROP EXTENSION obx failed: $err" if $ret != 0 && $err !~ /deadlock detected/;
	$ret == 0 }, 'DROP EXTENSION obx without a deadlock');
is(q1(q{SELECT extversion FROM pg_extension WHERE extname = 'obx'}), '1.1', 'obx 1.1 is installed');
ok($node->wait_for_log(qr/is waiting for ALTER EXTENSION obx UPDATE in database "postgres"/, $log_offset),
	'the relay waits for ALTER EXTENSION obx UPDATE, and says so');

sub id { sprintf('00000000-0000-4000-8000-%012d', $_[0]) }
sub enqueue
{
	my ($n, $key) = @_;
	q1(qq{SELECT obx.enqueue('$topic', '$key', '{"n": $n}', event_id => '@{[ id($n) ]}')});
	return id($n);
}

# Published: 1,500 events, claimed and recorded as 1.1's relay does (the
# claim is the latest tick), at offsets the broker does not hold.
q1(qq{SELECT obx.enqueue('$topic', 'pub' || (i % 7), jsonb_build_object('n', i),
						 event_id => ('00000000-0000-4000-8001-' || lpad(i::text, 12, '0'))::uuid)
		FROM generate_series(1, 1500) i});
q1(q{INSERT INTO obx.claims (lease_id, owner, until, snap, floor, max_seq, ids, topics, keys)
	 SELECT nextval('obx.lease_seq'), 0, now() + interval '1 minute', pg_current_snapshot(),
			min(seq), max(seq), array_agg(id ORDER BY seq), array_agg(topic ORDER BY seq),
			array_agg(event_key ORDER BY seq)
	   FROM obx.events});
q1(q{INSERT INTO obx.records (lease_id, max_seq, ids, partitions, offsets, published_at)
	 SELECT (SELECT max(lease_id) FROM obx.claims), max(seq), array_agg(id ORDER BY seq),
			array_agg(2 ORDER BY seq), array_agg(100000 + seq ORDER BY seq),
			array_agg(now() - interval '1 hour' ORDER BY seq)
	   FROM obx.events});
# Pending, two per key, enqueued by this library into 1.1's schema.
my @pending = map { enqueue($_, 'p' . ($_ % 5)) } 1 .. 10;
# Backing off for a few seconds after a transient error.
my $backing = enqueue(30, 'bk');
q1(qq{INSERT INTO obx.event_states (id, seq, aggregate_id, topic, event_key, event_type, headers,
			payload, occurred_at, attempts, failures, next_attempt_at, last_error,
			last_error_class, last_error_at)
	  SELECT id, seq, aggregate_id, topic, event_key, event_type, headers, payload, occurred_at,
			 2, 2, now() + interval '3 seconds', 'REQUEST_TIMED_OUT: Broker: Request timed out',
			 'transient', now()
		FROM obx.events WHERE id = '$backing'});
# Quarantined, and a pending event of its key behind it.
my $poison = enqueue(40, 'qk');
my $behind = enqueue(41, 'qk');
q1(qq{INSERT INTO obx.event_states (id, seq, aggregate_id, topic, event_key, event_type, headers,
			payload, occurred_at, attempts, failures, quarantined_at, last_error,
			last_error_class, last_error_at)
	  SELECT id, seq, aggregate_id, topic, event_key, event_type, headers, payload, occurred_at,
			 1, 1, now(), 'MSG_SIZE_TOO_LARGE: Broker: Message size too large', 'permanent', now()
		FROM obx.events WHERE id = '$poison'});
# The consumer side: a subscription, marks and a dead letter.
q1(q{CREATE FUNCTION public.on_event(e obx.inbound_event) RETURNS void
	 LANGUAGE plpgsql AS $$BEGIN END$$});
q1(qq{SELECT obx.subscribe('shop', ARRAY['$other'], 'public.on_event(obx.inbound_event)')});
q1(q{SELECT obx.mark_processed('shop', 'm' || i) FROM generate_series(1, 5) i});
q1(qq{INSERT INTO obx.dead_letters (consumer_name, event_id, topic, kafka_partition, kafka_offset,
			event_key, headers, payload, error_class, error_sqlstate, error_message)
	  VALUES ('shop', 'd1', '$other', 0, 7, 'k1', '{}', '{"n": 1}', 'handler', 'P0001', 'boom')});

my %before = (
	published => q{SELECT string_agg(id || ' ' || kafka_partition || ' ' || kafka_offset || ' '
		|| to_char(published_at, 'YYYY-MM-DD HH24:MI:SS.US'), ',' ORDER BY id)
		FROM obx.outbox_events WHERE id::text LIKE '00000000-0000-4000-8001-%'},
	marks => q{SELECT string_agg(consumer_name || ' ' || event_id || ' ' || processed_at, ','
		ORDER BY event_id) FROM obx.processed_events},
	'dead letters' => q{SELECT string_agg(d::text, ',' ORDER BY id) FROM obx.dead_letters d},
	subscriptions => q{SELECT string_agg(s::text, ',') FROM obx.subscriptions s});
$before{$_} = [ $before{$_}, q1($before{$_}) ] for keys %before;
is(q1(q{SELECT count(*) FROM obx.outbox_events WHERE published_at IS NOT NULL}), '1500',
	'the 1,500 are published under 1.1');
# The library is 1.2's and the schema 1.1's: the relay waited all along.
is(scalar @{ read_topic($mock, $topic) }, 0, 'nothing was sent before the update');

q1(q{ALTER EXTENSION obx UPDATE});
is(q1(q{SELECT extversion FROM pg_extension WHERE extname = 'obx'}), '1.2', 'obx is at 1.2');
relay_ready($node, 2);

my @expected = (@pending, $backing);
my $msgs = wait_for_broker($mock, $topic, sub {
	my $seen = event_ids_at_broker(shift);
	!grep { !$seen->{$_} } @expected }, 'the pending and backing-off events at the broker');
my $seen = event_ids_at_broker($msgs);
is_deeply([ sort keys %$seen ], [ sort @expected ],
	'the broker holds exactly those: no published, quarantined or blocked event was sent');
is(scalar(grep { $_ > 1 } values %$seen), 0, 'each once');

for my $what (sort keys %before)
{
	is(q1($before{$what}[0]), $before{$what}[1], "$what are as they were");
}
is(q1(qq{SELECT attempts || ' ' || last_error_class FROM obx.outbox_events WHERE id = '$backing'}),
	'3 transient', 'the backing-off event kept its attempts and error, and counted its publication');
is(q1(q{SELECT count(*) FROM obx.events WHERE era <> obx._era()}) . ' '
	. q1(q{SELECT count(*) FROM obx.claims WHERE era <> obx._era()}),
	'0 0', "every event and claim is of this install's era");
is(q1(q{SELECT count(*) FROM obx.records WHERE min_seq IS NULL}), '1',
	"1.1's record has no min_seq (no lower bound)");
is(q1(q{SELECT consumer_name || ' ' || coalesce(problem, 'no problem') FROM obx.consumers}),
	'shop no problem', 'the subscription is served');
is(q1(q{SELECT obx.mark_processed('shop', 'm1')::text || ' ' || obx.mark_processed('shop', 'm6')::text}),
	'false true', 'a mark made under 1.1 still dedupes');
is(q1(q{SELECT obx.replay_dead_letter('shop')}), '1', "1.1's dead letter replays");

is(q1(qq{SELECT id || ' ' || attempts || ' ' || last_error_class FROM obx.quarantine}),
	"$poison 1 permanent", 'the quarantined event is still quarantined, with its error');
is(q1(qq{SELECT count(*) FROM obx.outbox_events WHERE id IN ('$poison', '$behind')
		   AND published_at IS NULL}), '2', 'it still blocks its key');
is(q1(qq{SELECT obx.retry('$poison')}), 't', 'obx.retry takes the quarantined event');
$msgs = wait_for_broker($mock, $topic, sub {
	my $s = event_ids_at_broker(shift);
	$s->{$poison} && $s->{$behind} }, 'the retried event and the one behind it at the broker');
is_deeply(first_occurrences($msgs)->{qk}, [ $poison, $behind ],
	'the retried event went first, then the one behind it');
ok(all_published($node), 'nothing is left unpublished');
is_deeply(first_occurrences($msgs), committed_ids($node, "event_key NOT LIKE 'pub%'"),
	'per key, the broker order is the enqueue order');

same_catalog(catalog('postgres'), $fresh, 'the updated database with its rows is a fresh install too');

done_testing();
