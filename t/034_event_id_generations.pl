# Issue 56: an event id names one event, across the outbox's generations.
#
# obx.events has three partitions, one per generation (seq >> 40), and
# obx._rotate moves the sequence to the next one.  The unique index on id is
# per partition, so a second call with an id that an open transaction has
# just inserted into the previous generation finds no conflict in its own.
# Proves, on the extension (with its relay, on the Kafka stand-in) and on
# the SQL-only install, each time with both transactions in one generation
# and with a rotation between them:
# - a call with event id X while another open transaction has inserted X
#   waits for that transaction (pg_stat_activity shows it waiting on a
#   lock, and pg_blocking_pids names the first session);
# - then, at READ COMMITTED: a no-op returning X if the first committed the
#   same content, 23505 "already exists with different content" if it
#   committed other content, an insert if it rolled back; at REPEATABLE
#   READ and SERIALIZABLE: 40001 if the first committed (whatever the
#   content), an insert if it rolled back (on the SQL-only install across a
#   rotation, 40001 is accepted for a rollback too, never a second row);
# - a REPEATABLE READ transaction whose snapshot predates X's commit gets
#   40001, without waiting, when it enqueues X;
# - obx.enqueue_many and obx.enqueue_tombstone follow the same rules; a
#   failing element of obx.enqueue_many inserts none of the call's events;
# - an event committed before the rotation stays idempotent after it;
# - an event quarantined and then skipped keeps its id: enqueueing it again,
#   with the same content or not, fails with 23505 "was skipped" and
#   inserts nothing;
# - in the end obx.events holds each id at most once, with the content
#   that committed first, and the broker holds one value per event id.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use IPC::Run;
use ObxDaemon;
use ObxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $topic = 't.idem';
my $poison_topic = 't.poison';

my $mock = start_mock();
# One relay publishes while the test runs.  librdkafka refuses a message
# over 20,000 bytes (MSG_SIZE_TOO_LARGE, a permanent error): that is how the
# skipped event gets quarantined.  Every race holds a session open.
my $ext = obx_node('event_id_ext', $mock,
	'obx.workers' => 1,
	'obx.kafka_properties' => "'message.max.bytes=20000'",
	'max_connections' => 40);
relay_ready($ext, 1);
my $sql = sql_only_node('event_id_sql', max_connections => 40);

# The SQL of one call.  Contents are {"v": "A"} and the like.
sub enqueue_call
{
	my ($id, $v) = @_;
	return "obx.enqueue('$topic', 'k1', '{\"v\": \"$v\"}', event_id => '$id')";
}

sub tombstone_call
{
	my ($id) = @_;
	return "obx.enqueue_tombstone('$topic', 'k1', event_id => '$id')";
}

# obx.enqueue_many of the ids with the contents, one key each.
sub many_call
{
	my ($ids, $vs) = @_;
	my $keys = join(', ', map { "'k$_'" } 1 .. @$ids);
	my $payloads = join(', ', map { "'{\"v\": \"$_\"}'" } @$vs);
	my $event_ids = join(', ', map { "'$_'" } @$ids);
	return "obx.enqueue_many('$topic', ARRAY[$keys], ARRAY[$payloads]::jsonb[], "
	  . "event_ids => ARRAY[$event_ids]::uuid[])";
}

# The id of case $n of round $r.
sub case_id
{
	my ($r, $n) = @_;
	return sprintf('7d0c2f3e-0000-4000-8%03d-%012d', $r, $n);
}

# The races of one round.  first: the first transaction's call, which it
# ends with ends; second: the concurrent call, at isolation level iso.  The
# second returns returns, or fails with error (and a message like
# message).  rows: whose content obx.events holds for the id in the end,
# the first's (v1, in its generation), the second's (v2, in its
# generation), or none.  snapshot_first: the second transaction takes its
# snapshot before the first enqueues, and does not wait.
sub race_cases
{
	my ($r) = @_;
	my @c;
	my $n = 0;
	my $x;

	$x = case_id($r, ++$n);
	push @c, { name => 'READ COMMITTED, the first commits the same content', x => $x,
		first => enqueue_call($x, 'A'), ends => 'COMMIT', iso => 'READ COMMITTED',
		second => enqueue_call($x, 'A'), returns => $x, rows => 'first', v1 => 'A' };
	$x = case_id($r, ++$n);
	push @c, { name => 'READ COMMITTED, the first commits other content', x => $x,
		first => enqueue_call($x, 'A'), ends => 'COMMIT', iso => 'READ COMMITTED',
		second => enqueue_call($x, 'B'), error => '23505',
		message => qr/obx event id $x already exists with different content/,
		rows => 'first', v1 => 'A' };
	$x = case_id($r, ++$n);
	push @c, { name => 'READ COMMITTED, the first rolls back', x => $x,
		first => enqueue_call($x, 'A'), ends => 'ROLLBACK', iso => 'READ COMMITTED',
		second => enqueue_call($x, 'B'), returns => $x, rows => 'second', v2 => 'B' };
	$x = case_id($r, ++$n);
	push @c, { name => 'REPEATABLE READ, the first commits the same content', x => $x,
		first => enqueue_call($x, 'A'), ends => 'COMMIT', iso => 'REPEATABLE READ',
		second => enqueue_call($x, 'A'), error => '40001', rows => 'first', v1 => 'A' };
	$x = case_id($r, ++$n);
	push @c, { name => 'REPEATABLE READ, the first rolls back', x => $x,
		first => enqueue_call($x, 'A'), ends => 'ROLLBACK', iso => 'REPEATABLE READ',
		second => enqueue_call($x, 'B'), returns => $x, rows => 'second', v2 => 'B' };
	$x = case_id($r, ++$n);
	push @c, { name => 'SERIALIZABLE, the first commits other content', x => $x,
		first => enqueue_call($x, 'A'), ends => 'COMMIT', iso => 'SERIALIZABLE',
		second => enqueue_call($x, 'B'), error => '40001', rows => 'first', v1 => 'A' };
	$x = case_id($r, ++$n);
	push @c, { name => 'SERIALIZABLE, the first rolls back', x => $x,
		first => enqueue_call($x, 'A'), ends => 'ROLLBACK', iso => 'SERIALIZABLE',
		second => enqueue_call($x, 'B'), returns => $x, rows => 'second', v2 => 'B' };
	$x = case_id($r, ++$n);
	push @c, { name => 'enqueue_many, READ COMMITTED, the first commits the same content',
		x => $x, first => many_call([$x], ['A']), ends => 'COMMIT', iso => 'READ COMMITTED',
		second => many_call([$x], ['A']), returns => "{$x}", rows => 'first', v1 => 'A' };
	$x = case_id($r, ++$n);
	my $z = case_id($r, 100 + $n);
	push @c, { name => 'enqueue_many, READ COMMITTED, the first commits other content',
		x => $x, first => many_call([$x], ['A']), ends => 'COMMIT', iso => 'READ COMMITTED',
		second => many_call([ $z, $x ], [ 'C', 'B' ]), error => '23505',
		message => qr/obx event id $x already exists with different content/,
		rows => 'first', v1 => 'A', absent => $z };
	$x = case_id($r, ++$n);
	push @c, { name => 'enqueue_tombstone, READ COMMITTED, the first commits the same tombstone',
		x => $x, first => tombstone_call($x), ends => 'COMMIT', iso => 'READ COMMITTED',
		second => tombstone_call($x), returns => $x, rows => 'first', v1 => 'tombstone' };
	$x = case_id($r, ++$n);
	push @c, { name => 'REPEATABLE READ, snapshot taken before the first enqueued, which commits',
		x => $x, first => enqueue_call($x, 'A'), ends => 'COMMIT', iso => 'REPEATABLE READ',
		second => enqueue_call($x, 'B'), error => '40001', rows => 'first', v1 => 'A',
		snapshot_first => 1 };
	return @c;
}

# The SQLSTATE and message of the error psql printed (VERBOSITY verbose),
# or empty strings.
sub sqlstate
{
	my ($stderr) = @_;
	return $stderr =~ /ERROR:\s+([0-9A-Z]{5}):\s+([^\n]*)/ ? ($1, $2) : ('', '');
}

# call($node, $iso, $call): one call in its own transaction at $iso;
# returns (output, SQLSTATE, message).
sub call
{
	my ($node, $iso, $call) = @_;
	my (undef, $out, $err) = $node->psql('postgres',
		"BEGIN ISOLATION LEVEL $iso;\nSELECT $call;\nCOMMIT;",
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
	return ($out, sqlstate($err));
}

# The rows of obx.events with the id: "generation:v" in seq order, v the
# payload's "v" or "tombstone".
sub rows_of
{
	my ($node, $id) = @_;
	return $node->safe_psql('postgres', qq{
		SELECT coalesce(string_agg((seq >> 40) || ':' || coalesce(payload->>'v', 'tombstone'),
								   ',' ORDER BY seq), '')
		  FROM obx.events WHERE id = '$id'});
}

# The second call, in a psql of its own that the test does not wait for.
sub start_second
{
	my ($node, $c) = @_;
	my %s = (out => '', err => '', app => 'obx_t034_second');
	$s{h} = IPC::Run::start(
		[ 'psql', '-XAtq', '-v', 'ON_ERROR_STOP=1', '-v', 'VERBOSITY=verbose',
		  '-d', $node->connstr('postgres') . " application_name=$s{app}",
		  '-c', "BEGIN ISOLATION LEVEL $c->{iso}", '-c', "SELECT $c->{second}", '-c', 'COMMIT' ],
		'<', \undef, '>', \$s{out}, '2>', \$s{err},
		IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
	return \%s;
}

# Wait until the second call waits for a lock that the first session
# holds, or has finished; returns whether it was seen waiting.
sub second_waits
{
	my ($node, $s, $first_pid) = @_;
	my $waiting = 0;
	wait_until(sub {
		$s->{h}->pump_nb;
		return 1 unless $s->{h}->pumpable;
		$waiting = $node->safe_psql('postgres', qq{
			SELECT count(*) FROM pg_stat_activity
			 WHERE application_name = '$s->{app}' AND wait_event_type = 'Lock'
			   AND $first_pid = ANY (pg_blocking_pids(pid))});
		$waiting > 0;
	}, 'the second call to wait for the first transaction, or to finish');
	return $waiting > 0;
}

sub finish_second
{
	my ($s) = @_;
	eval { $s->{h}->finish; };
	note("the second call's psql: $@") if $@;
	chomp $s->{out};
	return ($s->{out}, sqlstate($s->{err}));
}

# Check what the second call did and what obx.events holds for the id.
sub check_race
{
	my ($node, $c, $what, $g1, $g2, $lenient, $out, $state, $msg) = @_;
	my $rows = $c->{rows};
	if ($lenient && $state eq '40001')
	{
		note("$what: 40001, allowed here for a first transaction that rolled back");
		$rows = 'none';
	}
	elsif ($c->{error})
	{
		is($state, $c->{error}, "$what: the second call fails with $c->{error}");
		like($msg, $c->{message}, "$what: with the message") if $c->{message};
	}
	else
	{
		is($state, '', "$what: the second call succeeds");
		is($out, $c->{returns}, "$what: the second call returns the id");
	}
	my $want = $rows eq 'first' ? "$g1:$c->{v1}" : $rows eq 'second' ? "$g2:$c->{v2}" : '';
	is(rows_of($node, $c->{x}), $want,
		"$what: obx.events holds the id "
		  . ($rows eq 'none' ? 'nowhere' : "once, with the ${rows} call's content"));
	is(rows_of($node, $c->{absent}), '', "$what: the call's other element is not inserted")
	  if $c->{absent};
	return;
}

# rotate($node): obx._rotate moves the sequence to the next generation
# (the current one made old enough first); returns the new generation.
sub rotate
{
	my ($node, $name) = @_;
	my $cur = $node->safe_psql('postgres', 'SELECT last_value >> 40 FROM obx.event_seq');
	$node->safe_psql('postgres', qq{
		UPDATE obx.generations SET started_at = now() - interval '1 hour'
		 WHERE generation = $cur});
	is($node->safe_psql('postgres', 'SELECT obx._rotate(1)'),
		'rotated to generation ' . ($cur + 1), "$name: obx._rotate moves to the next generation");
	return $cur + 1;
}

# One round of races on $node: every first transaction enqueues and stays
# open; with $rotate the outbox then rotates; then, case by case, the
# second call starts, the first transaction ends, and the outcome is
# checked.
sub run_round
{
	my ($node, $name, $r, $rotate, $sql_only) = @_;
	my @cases = race_cases($r);
	my $where = $rotate ? 'across a rotation' : 'in one generation';

	for my $c (grep { $_->{snapshot_first} } @cases)
	{
		$c->{s2} = $node->background_psql('postgres', on_error_stop => 0,
			extra_params => [ '-v', 'VERBOSITY=verbose' ]);
		$c->{s2}->query_safe("BEGIN ISOLATION LEVEL $c->{iso}; SELECT 1;");
	}
	for my $c (@cases)
	{
		$c->{s1} = $node->background_psql('postgres');
		$c->{s1_pid} = $c->{s1}->query_safe('SELECT pg_backend_pid()');
		$c->{s1}->query_safe('BEGIN');
		my $ret = $c->{s1}->query_safe("SELECT $c->{first}");
		is($ret, $c->{first} =~ /enqueue_many/ ? "{$c->{x}}" : $c->{x},
			"$name, $where, $c->{name}: the first transaction enqueues the id");
		$c->{g1} = $c->{s1}->query_safe("SELECT seq >> 40 FROM obx.events WHERE id = '$c->{x}'");
	}
	my $g2 = $rotate ? rotate($node, $name)
	  : $node->safe_psql('postgres', 'SELECT last_value >> 40 FROM obx.event_seq');

	for my $c (@cases)
	{
		my $what = "$name, $where, $c->{name}";
		my $lenient = $sql_only && $rotate && $c->{ends} eq 'ROLLBACK'
		  && $c->{iso} ne 'READ COMMITTED';
		isnt($c->{g1}, $g2, "$what: the id is in an older generation than the second call's")
		  if $rotate;
		my ($out, $state, $msg);
		if ($c->{snapshot_first})
		{
			$c->{s1}->query_safe($c->{ends});
			$c->{s1}->quit;
			$c->{s2}->{stderr} = '';
			$out = $c->{s2}->query("SELECT $c->{second}");
			($state, $msg) = sqlstate($c->{s2}->{stderr});
			$c->{s2}->query('COMMIT');
			$c->{s2}->quit;
		}
		else
		{
			my $s = start_second($node, $c);
			ok(second_waits($node, $s, $c->{s1_pid}),
				"$what: the second call waits for the first transaction");
			$c->{s1}->query_safe($c->{ends});
			$c->{s1}->quit;
			($out, $state, $msg) = finish_second($s);
		}
		check_race($node, $c, $what, $c->{g1}, $g2, $lenient, $out, $state, $msg);
	}
	return;
}

# An event quarantined and skipped: on the extension the relay quarantines
# it (librdkafka refuses its size); on the SQL-only install, with no relay,
# it is quarantined by hand as the relay does it.  Returns its id and the
# call that enqueued it.
sub skipped_event
{
	my ($node, $name, $sql_only) = @_;
	my $p = case_id(0, 1);
	my $payload = $sql_only ? q{'{"v": "poison"}'::jsonb}
	  : q{jsonb_build_object('v', 'poison', 'blob', repeat('x', 50000))};
	my $call = "obx.enqueue('$poison_topic', 'p1', $payload, event_id => '$p')";
	$node->safe_psql('postgres', "SELECT $call");
	if ($sql_only)
	{
		$node->safe_psql('postgres', qq{
			SELECT obx._hold(ARRAY['$p']::uuid[]);
			UPDATE obx.event_states
			   SET quarantined_at = now(), next_attempt_at = '-infinity', attempts = 1,
				   failures = 1, last_error = 'MSG_SIZE_TOO_LARGE: set by the test',
				   last_error_class = 'permanent', last_error_at = now()
			 WHERE id = '$p'});
	}
	ok($node->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM obx.quarantine WHERE id = '$p'"),
		"$name: the poison event is quarantined");
	is($node->safe_psql('postgres', "SELECT obx.skip('$p', 'never publishable (test)')"), 't',
		"$name: obx.skip gives up on it");
	return ($p, $call);
}

# Enqueueing a skipped event's id again, with the same content and with
# other content, fails with 23505 "was skipped" and inserts nothing.
sub check_skipped
{
	my ($node, $what, $p, $same_call) = @_;
	my $other_call = "obx.enqueue('$poison_topic', 'p1', '{\"v\": \"other\"}', event_id => '$p')";
	for my $t ([ 'the same content', $same_call ], [ 'other content', $other_call ])
	{
		my ($out, $state, $msg) = call($node, 'READ COMMITTED', $t->[1]);
		is($state, '23505', "$what: enqueueing the skipped id with $t->[0] fails with 23505");
		like($msg, qr/was skipped/, "$what: saying that the id was skipped");
	}
	is($node->safe_psql('postgres', qq{
		SELECT (SELECT count(*) FROM obx.events WHERE id = '$p') || ' '
			|| (SELECT count(*) FROM obx.outbox_events WHERE id = '$p') || ' '
			|| (SELECT count(*) FROM obx.skipped_events WHERE id = '$p')}),
		'1 0 1', "$what: nothing inserted: one row in obx.events, skipped, none pending");
	return;
}

# Every case on one install.
sub run_install
{
	my ($node, $name, $sql_only) = @_;

	my ($p, $p_call) = skipped_event($node, $name, $sql_only);
	check_skipped($node, "$name, in one generation", $p, $p_call);

	run_round($node, $name, 1, 0, $sql_only);

	# An event committed before the rotation: idempotent after it.
	my $k = case_id(3, 1);
	$node->safe_psql('postgres', 'SELECT ' . enqueue_call($k, 'A'));
	run_round($node, $name, 2, 1, $sql_only);
	my $what = "$name, committed before the rotation";
	my ($out, $state, $msg) = call($node, 'READ COMMITTED', enqueue_call($k, 'A'));
	is("$out $state", "$k ", "$what: the same content is a no-op that returns the id");
	($out, $state, $msg) = call($node, 'REPEATABLE READ', enqueue_call($k, 'A'));
	is("$out $state", "$k ", "$what: at REPEATABLE READ too");
	($out, $state, $msg) = call($node, 'READ COMMITTED', enqueue_call($k, 'B'));
	is($state, '23505', "$what: other content fails with 23505");
	like($msg, qr/already exists with different content/, "$what: with the message");
	is(rows_of($node, $k), '0:A', "$what: obx.events holds the id once");

	check_skipped($node, "$name, after a rotation", $p, $p_call);

	is($node->safe_psql('postgres',
		'SELECT count(*) FROM (SELECT id FROM obx.events GROUP BY id HAVING count(*) > 1) d'),
		'0', "$name: no event id is in obx.events twice");
	return;
}

run_install($ext, 'extension', 0);
run_install($sql, 'SQL-only', 1);

# The broker: one value per event id, the one obx.events holds.
ok(all_published($ext), 'extension: every event is published');
my %db;
for my $line (split /\n/, $ext->safe_psql('postgres',
	"SELECT id, coalesce(payload::text, '') FROM obx.events WHERE topic = '$topic'"))
{
	my ($id, $payload) = split /\|/, $line, 2;
	$db{$id}{$payload} = 1;
}
my $msgs = wait_for_broker($mock, $topic, sub {
	my $seen = event_ids_at_broker(shift);
	!grep { !$seen->{$_} } keys %db }, "every committed event of $topic at the broker");
my %broker;
$broker{ $_->{event_id} }{ $_->{payload} // '' } = 1 for @$msgs;
is_deeply([ grep { keys %{ $broker{$_} } > 1 } sort keys %broker ], [],
	'the broker holds one value per event id');
is_deeply(\%broker, \%db, 'the broker holds each event with the content obx.events holds');
is($ext->safe_psql('postgres',
	"SELECT count(*) FROM obx.outbox_events WHERE topic = '$poison_topic'"),
	'0', 'the skipped event is not in the outbox');

done_testing();
