# Many databases on one server (obx.databases).  Each listed database has
# its own relay and consumer workers: the broker holds exactly each
# database's committed events, in per-key order, and nothing crosses over
# (a database's outbox publishes only its own events, a subscription
# applies only to its own database's tables).  The list follows reload: a
# database added while running gets workers that publish, one removed
# loses them, one dropped while listed is reported and not crash-looped,
# and a list longer than the worker slots (or max_worker_processes) allows
# is reported in the log, obx.workers and obx.status.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use ObxConsumer;
use PostgreSQL::Test::Utils;
use Test::More;

my $mock = start_mock();
my $node = obx_node('many_dbs', $mock,
	'obx.databases' => "'db_a, db_b'",
	'obx.workers' => 2,
	'obx.consumer_workers' => 1,
	'max_worker_processes' => 11);

# The databases come after the server: the launcher reports them missing
# and looks again at the poll interval.
for my $db (qw(db_a db_b))
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION obx');
}
sub relays_idle
{
	my ($db, $n) = @_;
	return $node->poll_query_until('postgres', qq{
		SELECT count(*) = $n FROM obx.workers
		 WHERE database = '$db' AND pid IS NOT NULL AND state = 'idle'});
}
ok(relays_idle('db_a', 2) && relays_idle('db_b', 2),
	'two relay workers per listed database, idle');

create_topic($mock, $_, 2) for qw(a.orders.v1 b.orders.v1 c.orders.v1);

# enqueue($db, $topic, $n): $n events over 5 keys; returns the ids.
sub enqueue
{
	my ($db, $topic, $n) = @_;
	my $out = $node->safe_psql($db, qq{
		SELECT obx.enqueue('$topic', 'k' || (i % 5), jsonb_build_object('n', i))
		  FROM generate_series(1, $n) i});
	return [ split /\n/, $out ];
}

# per_key($db): per key, the outbox's ids in enqueue order.
sub per_key
{
	my ($db) = @_;
	my %order;
	for my $line (split /\n/, $node->safe_psql($db,
		'SELECT event_key, id FROM obx.outbox_events ORDER BY seq'))
	{
		my ($k, $id) = split /\|/, $line;
		push @{ $order{$k} }, $id;
	}
	return \%order;
}

# published($db, $topic, \@ids): the broker holds exactly @ids in $topic,
# per key in enqueue order, and the database's outbox has them published.
sub published
{
	my ($db, $topic, $ids) = @_;
	my %want = map { $_ => 1 } @$ids;
	my $msgs = wait_for_broker($mock, $topic, sub {
		my $seen = event_ids_at_broker(shift);
		!grep { !$seen->{$_} } @$ids }, "every event of $db at the broker");
	is_deeply([ sort keys %{ event_ids_at_broker($msgs) } ], [ sort @$ids ],
		"$topic holds exactly the committed events of $db");
	is_deeply(first_occurrences($msgs), per_key($db), "$db: per key, broker order is enqueue order");
	ok($node->poll_query_until($db,
		'SELECT count(*) = 0 FROM obx.outbox_events WHERE published_at IS NULL'),
		"$db: its outbox is all published");
	return;
}

# Each database: a table its subscription writes, and a subscription on the
# other database's topic, so an event crossing over would show up there.
for my $db (qw(db_a db_b))
{
	my $other = $db eq 'db_a' ? 'b' : 'a';
	$node->safe_psql($db, qq{
		CREATE TABLE seen (event_id text, topic text);
		CREATE FUNCTION public.note(e obx.inbound_event) RETURNS void
		LANGUAGE sql AS \$\$ INSERT INTO public.seen VALUES (e.event_id, e.topic) \$\$;
		SELECT obx.subscribe('${db}_reader', ARRAY['$other.orders.v1'],
			'public.note(obx.inbound_event)', '{"start": "earliest", "kafka": {"session.timeout.ms": "6000"}}');});
}


ok(wait_until(sub { my $log = slurp_file($node->logfile);
	$log =~ /joined consumer group "db_a_reader"/ && $log =~ /joined consumer group "db_b_reader"/ },
	'both consumers joined'), "each database's consumer runs its subscription");

# Publishing rests on the commit wake-up and the claim turns of each
# database alone: with a poll interval of an hour, an event waits for a
# poll only if a commit woke a relay of another database or counted as a
# change there.  (The workers pick the setting up at their next wait.)
$node->safe_psql('postgres', "ALTER SYSTEM SET obx.poll_interval = '1h'");
$node->reload;
my $a_ids = enqueue('db_a', 'a.orders.v1', 60);
my $b_ids = enqueue('db_b', 'b.orders.v1', 40);
published('db_a', 'a.orders.v1', $a_ids);
published('db_b', 'b.orders.v1', $b_ids);
is($node->safe_psql('db_a', 'SELECT count(*) FROM obx.outbox_events WHERE id IN ('
	  . join(',', map { "'$_'" } @$b_ids) . ')'), '0', "no event of db_b is in db_a's outbox");
# Turns of 500 ms (obx.claim_gap 1 s over two workers): an event of db_b
# committed during db_b's turn waits for it to end, while db_a's claim of
# its own event, right after, must not count as having seen db_b's.
$node->safe_psql('postgres', "ALTER SYSTEM SET obx.claim_gap = '1s'");
$node->reload;
for (1 .. 4)
{
	push @$b_ids, @{ enqueue('db_b', 'b.orders.v1', 1) };
	push @$b_ids, @{ enqueue('db_b', 'b.orders.v1', 1) };
	push @$a_ids, @{ enqueue('db_a', 'a.orders.v1', 1) };
	published('db_b', 'b.orders.v1', $b_ids);
	published('db_a', 'a.orders.v1', $a_ids);
}
$node->safe_psql('postgres', 'ALTER SYSTEM RESET obx.poll_interval; ALTER SYSTEM RESET obx.claim_gap');
$node->reload;

# The subscriptions: each database's table holds exactly the other's events.
for my $case ([ 'db_b', $a_ids, 'a.orders.v1' ], [ 'db_a', $b_ids, 'b.orders.v1' ])
{
	my ($db, $ids, $topic) = @$case;
	ok($node->poll_query_until($db, "SELECT count(*) >= @{[ scalar @$ids ]} FROM seen"),
		"$db applied every event of $topic");
	is_deeply([ split /\n/, $node->safe_psql($db, 'SELECT DISTINCT event_id FROM seen ORDER BY 1') ],
		[ sort @$ids ], "$db applied exactly the events of $topic, in its own table");
}

# Added while running: a new database gets workers that publish.
$node->safe_psql('postgres', 'CREATE DATABASE db_c');
$node->safe_psql('db_c', 'CREATE EXTENSION obx');
$node->safe_psql('postgres', "ALTER SYSTEM SET obx.databases = 'db_a, db_b, db_c'");
$node->reload;
ok(relays_idle('db_c', 2), 'db_c, added by a reload, has two idle relay workers');
published('db_c', 'c.orders.v1', enqueue('db_c', 'c.orders.v1', 20));

# Removed while running: its workers stop, and obx.status says why.
$node->safe_psql('postgres', "ALTER SYSTEM SET obx.databases = 'db_a, db_c'");
$node->reload;
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 0 FROM pg_stat_activity
	 WHERE datname = 'db_b' AND backend_type IN ('obx relay', 'obx consumer')}),
	"db_b's relay and consumer workers stop once it leaves the list");
is($node->safe_psql('postgres', "SELECT count(*) FROM obx.workers WHERE database = 'db_b'"),
	'0', 'obx.workers no longer lists db_b');
like($node->safe_psql('db_b', 'SELECT obx._relay_problem()'), qr/not in obx\.databases/,
	'obx.status of db_b: not in obx.databases');

# Dropped while listed: reported in the log and obx.workers, not restarted.
my $log_at = -s $node->logfile;
$node->safe_psql('postgres', 'DROP DATABASE db_c WITH (FORCE)');
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 2 FROM obx.workers
	 WHERE database = 'db_c' AND state = 'database does not exist'}),
	'obx.workers: the dropped database does not exist');
my $starts = sub {
	my $log = slurp_file($node->logfile, $log_at);
	return scalar(() = $log =~ /started for database "db_c"|database "db_c" does not exist/g);
};
my $before = $starts->();
# An absence is shown over a window: 15 poll intervals, 3 launcher passes.
my $t0 = time();
wait_until(sub { time() - $t0 >= 3 }, 'a window of three seconds');
is($starts->(), $before, 'no worker was started for the dropped database (no crash loop)');
like(slurp_file($node->logfile, $log_at),
	qr/WARNING:  obx relay workers cannot serve database "db_c" \(obx.databases\): database does not exist/,
	'the log says the listed database does not exist');
published('db_a', 'a.orders.v1', [ @$a_ids, @{ enqueue('db_a', 'a.orders.v1', 10) } ]);

# More databases than worker slots (32 / obx.workers = 16): the ones past
# the 16th are reported.  More workers than max_worker_processes (11: the
# logical replication launcher, obx's, db_a's three, and two relays for
# each of d1 .. d4) too.
$node->safe_psql('postgres', "CREATE DATABASE $_") for qw(d1 d2 d3 d4);
$log_at = -s $node->logfile;
$node->safe_psql('postgres', 'ALTER SYSTEM SET obx.databases = '
	  . "'db_a, d1, d2, d3, d4, " . join(', ', map { "gone$_" } 1 .. 11) . ", db_b'");
$node->reload;
ok(wait_until(sub { slurp_file($node->logfile, $log_at) =~
	/obx relay workers cannot serve database "db_b": obx.databases lists more databases than 16/ },
	'the capacity warning'), 'the 17th database is reported as past the worker slots');
like($node->safe_psql('db_b', 'SELECT obx._relay_problem()'),
	qr/too many databases for the worker slots/, 'obx.status of db_b says so too');
ok(wait_until(sub { slurp_file($node->logfile, $log_at) =~
	/cannot serve database "d\d" \(obx\.(consumer_)?databases\): no free background worker slot/ },
	'the max_worker_processes warning'), 'workers past max_worker_processes are reported');
ok($node->poll_query_until('postgres', q{
	SELECT count(*) > 0 FROM obx.workers WHERE state = 'no free background worker slot'}),
	'obx.workers shows the workers that found no slot');

done_testing();
