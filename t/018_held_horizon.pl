# The outbox under a held-back xmin horizon: no dead row per event.
#
# docs/internals.md, "The outbox log": an event is inserted once and never
# updated or deleted; publishing appends one record per batch.  Here two
# sessions hold the horizon back for the whole run, as in production: a
# report in REPEATABLE READ that keeps its snapshot, and a transaction that
# wrote something and sits idle (its xid stays among every snapshot's
# running ones, so every claim's tick names it).  Meanwhile producers
# commit events in many transactions, some of them late committers (a
# transaction that drew its seq before others and commits after them).
#
# Every event reaches the broker, per key in enqueue order; the report's
# snapshot still sees what it saw at its start (the horizon really was
# held); and obx's tables gained no dead tuple: n_dead_tup of every table of
# the publish path is 0, read once the statistics counted every insert the
# run made (pgstat is flushed by each backend at the end of its
# transactions, at most once a second).  The one table the housekeeping
# deletes from, obx.published_counts (the relay's counts per batch and
# topic, summed every 10 s), has no more dead rows than batches were
# recorded.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $topic = 'orders.horizon.v1';
my $rounds = 40;
my $per_round = 50;
my $nkeys = 20;

my $mock = start_mock();
my $node = obx_node('horizon', $mock,
	'obx.workers' => 2,
	'log_min_messages' => 'warning');
relay_ready($node, 2);
mock_cmd($mock, "topic-create $topic 4 3");

sub q1 { $node->safe_psql('postgres', $_[0]) }

# The tables of the publish path, and their dead tuples now.
my $tables = q{c.relnamespace = 'obx'::regnamespace AND c.relkind = 'r'
	AND c.relname ~ '^(events_|claims_|records_|renewals_)[0-2]$|^event_states$|^generations$'};
q1('CREATE TABLE app_orders (id bigint PRIMARY KEY, v integer)');

# The report: a snapshot held for the whole run.
my $report = $node->background_psql('postgres');
$report->query_safe('BEGIN ISOLATION LEVEL REPEATABLE READ');
my $seen_at_start = $report->query_safe('SELECT count(*) FROM obx.events');
# The idle writer: an xid that stays running.
my $idle = $node->background_psql('postgres');
$idle->query_safe('BEGIN; INSERT INTO app_orders VALUES (0, 0)');
my $idle_xid = $idle->query_safe('SELECT pg_current_xact_id()');

ok(q1(qq{SELECT count(*) = 2 FROM pg_stat_activity
	WHERE state = 'idle in transaction'
	  AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)}) eq 't',
	'two sessions hold the horizon: a REPEATABLE READ snapshot and an idle writer');

# Producers: rounds of events over $nkeys keys; in every tenth round a
# late committer draws its seq first and commits after the round (on a key
# of its own: a late committer's event follows the events of its key that
# committed before it, whatever the seqs, and the check below is by seq).
my @ids;
for my $r (1 .. $rounds)
{
	my $late;
	if ($r % 10 == 0)
	{
		$late = $node->background_psql('postgres');
		$late->query_safe('BEGIN');
		push @ids, $late->query_safe(qq{
			SELECT obx.enqueue('$topic', 'late' || $r, '{"late": $r}')});
	}
	push @ids, split /\n/, q1(qq{
		SELECT obx.enqueue('$topic', 'k' || (($r * $per_round + i) % $nkeys),
						   jsonb_build_object('round', $r, 'i', i))
		  FROM generate_series(1, $per_round) i});
	if ($late)
	{
		$late->query_safe('COMMIT');
		$late->quit;
	}
}
my $n = scalar @ids;
note("$n events committed while the horizon was held");

broker_holds_exactly($mock, $node, $topic, \@ids);
ok(all_published($node), 'the outbox shows every event published');

is($report->query_safe('SELECT count(*) FROM obx.events'), $seen_at_start,
	'the report\'s snapshot still sees only what it saw at its start');
like(q1(q{SELECT string_agg(x::text, ' ') FROM obx.claims c, pg_snapshot_xip(c.snap) x
	WHERE c.lease_id = (SELECT max(lease_id) FROM obx.claims)}),
	qr/\b$idle_xid\b/, 'the latest tick names the idle writer among the running transactions');

# The statistics have counted every insert of the run: the events', and
# the records' (the relay's last step).
ok($node->poll_query_until('postgres', qq{
	SELECT (SELECT sum(n_tup_ins) FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
			 WHERE c.relnamespace = 'obx'::regnamespace AND c.relname ~ '^events_[0-2]\$') >= $n
	   AND (SELECT sum(n_tup_ins) FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
			 WHERE c.relnamespace = 'obx'::regnamespace AND c.relname ~ '^records_[0-2]\$')
		   >= (SELECT count(*) FROM obx.records)}),
	'the statistics counted every event and every record');
my $rows = q1(qq{
	SELECT string_agg(c.relname || '=' || s.n_dead_tup, ' ' ORDER BY c.relname)
	  FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid WHERE $tables});
my $dead = q1(qq{
	SELECT sum(s.n_dead_tup) FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
	 WHERE $tables});
note("dead tuples per table: $rows");
is($dead, '0', "no dead tuple in obx's tables after $n events published under a held horizon");
my ($records, $claims) = split /\|/, q1(q{
	SELECT (SELECT count(*) FROM obx.records), (SELECT count(*) FROM obx.claims)});
note("the run appended $records records and $claims claims for $n events");
my $counts_dead = q1(q{
	SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'obx.published_counts'::regclass});
cmp_ok($counts_dead, '<=', $records,
	"obx.published_counts: $counts_dead dead rows, no more than the batches recorded");

$idle->query_safe('ROLLBACK');
$idle->quit;
$report->query_safe('COMMIT');
$report->quit;

done_testing();
