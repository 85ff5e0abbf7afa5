# ObxWindows.pm: the bodies of failure windows that run both against the
# Kafka stand-in (t/010, t/021) and against a real Kafka cluster (t/060).
# A broker argument is either (see ObxTest: start_mock, start_kafka).
package ObxWindows;

use strict;
use warnings;

use Exporter 'import';
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);
use ObxTest;

our @EXPORT = qw(late_committer run_producers wave_producer one_batch relay_waits_on_record
  crash_relay_at_record resent_batch);

# late_committer($node, $topic): a session that enqueues one event (key
# "late") and leaves its transaction open, so that the event takes its seq
# before every other and becomes visible last.  Returns the session and
# the event's id; the caller commits ($late->query_safe('COMMIT')).
sub late_committer
{
	my ($node, $topic) = @_;
	my $late = $node->background_psql('postgres');
	$late->set_query_timer_restart;    # it stays open for the whole run
	my $id = $late->query_safe(
		qq{BEGIN; SELECT obx.enqueue('$topic', 'late', '{"order": "late", "version": 1, "i": 1}');});
	return ($late, $id);
}

# run_producers($node, %o): the application of the concurrent-producers
# window.  Creates the table "orders" ($o{norders} rows), then runs
# pgbench with $o{clients} clients of $o{per_client} transactions each,
# and checks that all of them ran.  Four in five transactions lock an
# order row (SELECT ... FOR UPDATE), bump its version and enqueue one to
# three events for it, each carrying the version, the second on
# $o{second_topic} (default: $o{topic}); the fifth do the same and roll
# back (payload "rb": true).  orders.events counts the committed events.
# $o{what} names the check.
sub run_producers
{
	my ($node, %o) = @_;
	my ($norders, $t1) = ($o{norders}, $o{topic});
	my $t2 = $o{second_topic} // $t1;
	$node->safe_psql('postgres', qq{
		CREATE TABLE orders (
			id		int PRIMARY KEY,
			version	int NOT NULL DEFAULT 0,
			events	int NOT NULL DEFAULT 0);
		INSERT INTO orders (id) SELECT g FROM generate_series(1, $norders) g;});

	my $commit_script = qq{
\\set id random(1, $norders)
\\set n random(1, 3)
BEGIN;
SELECT version FROM orders WHERE id = :id FOR UPDATE;
UPDATE orders SET version = version + 1, events = events + :n WHERE id = :id RETURNING version \\gset
SELECT obx.enqueue('$t1', 'ord_' || :id, jsonb_build_object('order', :id, 'version', :version, 'i', 1, 'rb', false));
\\if :n >= 2
SELECT obx.enqueue('$t2', 'ord_' || :id, jsonb_build_object('order', :id, 'version', :version, 'i', 2, 'rb', false));
\\endif
\\if :n >= 3
SELECT obx.enqueue('$t1', 'ord_' || :id, jsonb_build_object('order', :id, 'version', :version, 'i', 3, 'rb', false));
\\endif
COMMIT;
};
	my $rollback_script = qq{
\\set id random(1, $norders)
BEGIN;
SELECT version FROM orders WHERE id = :id FOR UPDATE;
UPDATE orders SET version = version + 1, events = events + 2 WHERE id = :id;
SELECT obx.enqueue('$t1', 'ord_' || :id, jsonb_build_object('order', :id, 'version', -1, 'rb', true));
SELECT obx.enqueue('$t2', 'ord_' || :id, jsonb_build_object('order', :id, 'version', -1, 'rb', true));
ROLLBACK;
};
	my $total = $o{clients} * $o{per_client};
	$node->pgbench(
		"--no-vacuum --client=$o{clients} --jobs=2 --transactions=$o{per_client}",
		0,
		[qr{processed: $total/$total}],
		[qr{^$}],
		$o{what},
		{
			'producers_commit.sql@4' => $commit_script,
			'producers_rollback.sql@1' => $rollback_script,
		});
	return;
}

# wave_producer($node, $topic, %o): the application of the restart
# windows (t/012, t/060).  Returns a sub ($wave, $ntx) that commits $ntx
# transactions of $o{per_tx} (default 10) events each, on keys ord_0 ..
# ord_<$o{nkeys} - 1> spread so that every transaction touches several
# keys and every key gets events from several transactions, each under a
# 5 s statement and lock timeout; checks that each committed and returned
# its ids, and returns the ids.  ${ $o{slowest} } keeps the longest a
# transaction took, in seconds.  The checks are named "$o{label}wave W tx
# T committed with the brokers $o{brokers}".
sub wave_producer
{
	my ($node, $topic, %o) = @_;
	my $per_tx = $o{per_tx} // 10;
	my $label = $o{label} // '';
	my $n = 0;
	return sub {
		my ($wave, $ntx) = @_;
		my @ids;
		for my $tx (1 .. $ntx)
		{
			my $sql = "SET statement_timeout = '5s';\nSET lock_timeout = '5s';\nBEGIN;\n";
			for (1 .. $per_tx)
			{
				$n++;
				my $key = 'ord_' . ($n % $o{nkeys});
				$sql .= "SELECT obx.enqueue('$topic', '$key', '{\"wave\": $wave, \"n\": $n}');\n";
			}
			$sql .= "COMMIT;\n";
			my $t = time();
			my ($ret, $out, $err) = $node->psql('postgres', $sql, on_error_stop => 1);
			my $took = time() - $t;
			${ $o{slowest} } = $took if $took > ${ $o{slowest} };
			my @got = grep { length } split /\n/, $out;
			is($ret, 0, "${label}wave $wave tx $tx committed with the brokers $o{brokers}")
			  or diag($err);
			is(scalar(@got), $per_tx, "${label}wave $wave tx $tx returned $per_tx ids");
			push @ids, @got;
		}
		return @ids;
	};
}

# one_batch($node, $topic, $label): three events on keys ord_1, ord_2 and
# ord_3, committed in one transaction, so that one claim takes them as one
# batch; returns their ids, the victim of the crash window first.
sub one_batch
{
	my ($node, $topic, $label) = @_;
	my @batch = split /\n/, $node->safe_psql('postgres', qq{
		BEGIN;
		SELECT obx.enqueue('$topic', 'ord_1', '{"n": 1}');
		SELECT obx.enqueue('$topic', 'ord_2', '{"n": 1}');
		SELECT obx.enqueue('$topic', 'ord_3', '{"n": 1}');
		COMMIT;});
	is(scalar(@batch), 3, "${label}three events committed in one transaction");
	return @batch;
}

# relay_waits_on_record($node, $broker, $topic, \@batch, $release, $label):
# the window of t/010.  @batch is one claimed batch, in flight; the first
# is the victim.  A session locks obx.records (the relay holds no
# lock while it waits on Kafka, so the lock is granted at once), then
# $release->() lets the batch through (brokers up, relays resumed).  Waits
# until the batch is at the broker and its relay waits on the lock, to
# record it, and checks that none of it is recorded as published yet.
# Returns the relay's pid and the session (which holds the lock).
sub relay_waits_on_record
{
	my ($node, $broker, $topic, $batch, $release, $label) = @_;
	my $victim = $batch->[0];
	my $bg = $node->background_psql('postgres', on_error_stop => 0);
	my $bg_pid = $bg->query_safe('SELECT pg_backend_pid()');
	my $t_lock = time();
	# The record step appends the batch's row to obx.records: a SHARE lock on
	# it makes the step wait (claims and renewals do not insert there).
	# lock_timeout: a relay holding a lock across the network fails the
	# test here instead of hanging it.
	$bg->query_safe(
		"SET lock_timeout = '10s'; BEGIN; LOCK TABLE obx.records IN SHARE MODE;");
	note(sprintf('%slock granted in %.3f s (the relay holds no lock while it waits on Kafka)',
		$label, time() - $t_lock));
	$release->();

	# The acknowledged batch is at the broker ...
	wait_for_broker($broker, $topic, sub {
		my $seen = event_ids_at_broker(shift);
		!grep { !$seen->{$_} } @$batch }, 'the claimed batch at the broker');

	# ... and its relay waits on our lock: published_at is not set yet.
	$node->poll_query_until('postgres', qq{
		SELECT count(*) = 1 FROM pg_stat_activity
		 WHERE backend_type = 'obx relay' AND wait_event_type = 'Lock'
		   AND $bg_pid = ANY (pg_blocking_pids(pid))})
	  or die 'the relay never waited on the lock';
	my ($relay_pid, $relay_query) = split /\|/, $node->safe_psql('postgres', qq{
		SELECT pid, query FROM pg_stat_activity
		 WHERE backend_type = 'obx relay' AND $bg_pid = ANY (pg_blocking_pids(pid))});
	note("relay $relay_pid blocked in: $relay_query");
	is($node->safe_psql('postgres',
		'SELECT count(*) FROM obx.outbox_events WHERE published_at IS NULL AND id IN ('
		  . join(',', map { "'$_'" } @$batch) . ')'),
		scalar(@$batch), "${label}acknowledged by Kafka, not yet recorded as published");
	return ($relay_pid, $bg);
}

# crash_relay_at_record($node, $relay_pid, $bg, $victim, $label): kill
# (SIGKILL) the relay that waits to record; the postmaster treats that as
# a crash and restarts everything, ending $bg's session and its lock.
# Checks the crash and its recovery, and that the victim and everything
# else are published after it.
sub crash_relay_at_record
{
	my ($node, $relay_pid, $bg, $victim, $label) = @_;
	my $log_offset = -s $node->logfile;
	ok(kill('KILL', $relay_pid), "${label}SIGKILL sent to relay $relay_pid");
	# psql only notices its session died at its next command.
	eval { $bg->quit; };

	wait_for_crash_restart($node, $log_offset, "${label}the relay killed");
	ok($node->poll_query_until('postgres',
		"SELECT published_at IS NOT NULL FROM obx.outbox_events WHERE id = '$victim'"),
		"${label}the victim is published after crash recovery");
	ok(all_published($node), "${label}the outbox has nothing left to publish");
	my $log = slurp_file($node->logfile, $log_offset);
	like($log, qr/\(PID $relay_pid\) was terminated by signal 9/,
		"${label}the postmaster saw the relay die of SIGKILL");
	like($log, qr/all server processes terminated; reinitializing/,
		"${label}the instance went through crash recovery");
	return;
}

# resent_batch($broker, $topic, \@batch, \@all, $label): wait until every
# event of the batch is at the broker at least twice (sent, then sent again
# after the crash) and every event of @all at least once; checks the
# copies of the batch and returns the topic's messages.
sub resent_batch
{
	my ($broker, $topic, $batch, $all, $label) = @_;
	my $msgs = wait_for_broker($broker, $topic, sub {
		my $seen = event_ids_at_broker(shift);
		!grep { ($seen->{$_} // 0) < 2 } @$batch and !grep { !$seen->{$_} } @$all },
		'the re-sent batch and every committed event at the broker');
	my $seen = event_ids_at_broker($msgs);
	for my $id (@$batch)
	{
		cmp_ok($seen->{$id}, '>=', 2,
			"${label}event $id of the unrecorded batch reached the broker $seen->{$id} times, with its event_id header each time");
	}
	return $msgs;
}

1;
