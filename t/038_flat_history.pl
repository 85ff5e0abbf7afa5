# Reads that cost what is pending, never what was published and is merely
# retained (docs/sql.md, "What a read costs").
#
# The relay publishes 200,000 events of two topics to the Kafka stand-in,
# with obx.retention = 0: every event stays, and the housekeeping still
# sums the counts of published events.  Then, with nothing pending, one
# event quarantined and one batch leased:
#   - obx.status says how many events of each topic were published, exactly
#     the number enqueued, and the newest publish time of each;
#   - obx.published_counts holds one row per generation and topic once the
#     housekeeping ran (the relay appended one per batch and topic);
#   - obx.outbox_events' state agrees with obx.status;
#   - each read an operator or the exporter makes, run with EXPLAIN
#     (ANALYZE, BUFFERS), touches fewer buffers than 2% of the pages the
#     history fills (obx.events, obx.records and obx.claims with their
#     indexes): obx.status, every query of monitoring/obx-queries.yaml,
#     obx.publish_latency_summary, obx.quarantine, obx.leases,
#     obx.outbox_events filtered on state (with and without a topic) and on
#     an id.  A full read of the history (obx.outbox_events filtered on
#     published_at IS NULL) touches more than that: the bound can fail;
#   - the planner knows it: in each of those plans, the scans of obx.events
#     are estimated at fewer rows in all than 0.5% of the history (else
#     the estimates, and the cost, grow with the history, and past
#     jit_above_cost each read is compiled).
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use JSON::PP;
use ObxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my @topics = ('orders.history.v1', 'payments.history.v1');
my $n = 200_000;

my $mock = start_mock();
mock_cmd($mock, "topic-create $_ 3") for @topics;
my $node = obx_node('history', $mock, 'obx.workers' => 1, 'obx.retention' => '0');
relay_ready($node, 1);
sub q1 { $node->safe_psql('postgres', $_[0]) }

# Two topics, three events of the first to one of the second, 1,000 keys,
# in 10,000 transactions of 20 events, as an application enqueues them (a
# transaction id for every few events, as the planner sees it in production).
q1("\\o /dev/null\n" . join('', map {
	my $t = $_;
	my $topic = $t % 4 == 0 ? $topics[1] : $topics[0];
	"SELECT obx.enqueue_many('$topic', array_agg('k' || (i % 1000)),"
	  . " array_agg(jsonb_build_object('n', i, 'note', repeat('x', 100))))"
	  . " FROM generate_series(${\($t * 20)}, ${\($t * 20 + 19)}) i;\n"
} 0 .. $n / 20 - 1));
ok(all_published($node), "the relay published all $n events");

# Counted exactly: the relay appended a count per batch and topic, and the
# housekeeping (every 10 s) sums them into one row per generation and topic.
is(q1(q{SELECT string_agg(topic || ' ' || published, ', ' ORDER BY topic) FROM obx.status}),
	"$topics[0] 150000, $topics[1] 50000",
	'obx.status: each topic\'s published events, counted exactly');
ok($node->poll_query_until('postgres',
		'SELECT count(*) = 2 FROM obx.published_counts'),
	'the housekeeping summed the counts into one row per generation and topic (at obx.retention 0)');
is(q1(q{SELECT string_agg(topic || ' ' || published, ', ' ORDER BY topic) FROM obx.status}),
	"$topics[0] 150000, $topics[1] 50000", 'the same after the sum');
is(q1(q{
	SELECT count(*) FROM obx.status s
	 WHERE s.last_published_at IS DISTINCT FROM (
			SELECT max(x.t) FROM obx.records r, unnest(r.ids, r.published_at) AS x(id, t),
				   obx.events e
			 WHERE e.id = x.id AND e.topic = s.topic)}),
	'0', 'obx.status: each topic\'s last_published_at is its newest publish');

# An hour later, the history is an hour old: its records' times moved back
# (obx.publish_latency_summary's window, the last minute, holds none of it).
q1(q{
	UPDATE obx.records
	   SET recorded_at = recorded_at - interval '1 hour',
		   published_at = ARRAY(SELECT t - interval '1 hour' FROM unnest(published_at) AS t)});

# Something unpublished, as operators see it: one event quarantined, one
# batch leased (a claim of a relay that stopped answering: its floor the
# leased event, the lowest unpublished), one pending.
$node->append_conf('postgresql.conf', "obx.workers = 0\n");
$node->restart;
my $quarantined = q1(qq{SELECT obx.enqueue('$topics[1]', 'k-q', '{"q": 1}')});
my $leased = q1(qq{SELECT obx.enqueue('$topics[0]', 'k-l', '{"l": 1}')});
my $pending = q1(qq{SELECT obx.enqueue('$topics[0]', 'k-p', '{"p": 1}')});
q1(qq{
	SELECT obx._hold(ARRAY['$quarantined']::uuid[]);
	UPDATE obx.event_states
	   SET attempts = 1, failures = 1, last_error = 'Broker: Message size too large',
		   last_error_class = 'permanent', last_error_at = now(), quarantined_at = now()
	 WHERE id = '$quarantined';
	INSERT INTO obx.claims (lease_id, owner, until, snap, floor, max_seq, ids, topics, keys)
	SELECT nextval('obx.lease_seq'), 0, now() + interval '1 hour', t.snap, seq,
		   seq, ARRAY[id], ARRAY[topic], ARRAY[event_key]
	  FROM obx.events, obx._latest_tick t WHERE id = '$leased'});
is(q1(q{SELECT string_agg(concat_ws(' ', topic, pending, leased, quarantined), ', ' ORDER BY topic)
		  FROM obx.status}),
	"$topics[0] 1 1 0, $topics[1] 0 0 1", 'obx.status: one pending, one leased, one quarantined');
is(q1(q{SELECT string_agg(topic || ' ' || state || ' ' || n, ', ' ORDER BY topic, state)
		  FROM (SELECT topic, state, count(*) AS n FROM obx.outbox_events
				 WHERE state <> 'published' GROUP BY 1, 2) s}),
	"$topics[0] leased 1, $topics[0] pending 1, $topics[1] quarantined 1",
	'obx.outbox_events: the same three by state');

# The history's pages: the events, records and claims, with their indexes.
my $pages = q1(q{
	SELECT (sum(pg_total_relation_size(c.oid)) / current_setting('block_size')::bigint)::bigint
	  FROM pg_class c
	 WHERE c.relnamespace = 'obx'::regnamespace AND c.relkind = 'r'
	   AND c.relname ~ '^(events|records|claims)_[0-9]$'});
my $bound = int($pages / 50);
cmp_ok($pages, '>', 5_000, "the history fills $pages pages");
q1('ANALYZE');

# buffers($sql): the shared buffers one execution of $sql touched, and the
# rows the planner expected its scans of obx.events to return.
sub buffers
{
	my ($sql) = @_;
	my $plan = decode_json(q1("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) $sql"))->[0]{Plan};
	return ($plan->{'Shared Hit Blocks'} + $plan->{'Shared Read Blocks'}, event_rows($plan));
}

sub event_rows
{
	my ($node) = @_;
	my $rows = ($node->{'Relation Name'} // '') =~ /^events_\d$/ ? $node->{'Plan Rows'} : 0;
	$rows += event_rows($_) for @{ $node->{Plans} // [] };
	return $rows;
}

my %reads = (
	'obx.status' => 'SELECT * FROM obx.status',
	'obx.publish_latency_summary' => 'SELECT * FROM obx.publish_latency_summary',
	'obx.quarantine' => 'SELECT * FROM obx.quarantine',
	'obx.leases' => 'SELECT * FROM obx.leases',
	'obx.leased_events' => 'SELECT * FROM obx.leased_events',
	'obx.outbox_events, unpublished' =>
	  q{SELECT count(*) FROM obx.outbox_events WHERE state <> 'published'},
	'obx.outbox_events, pending of a topic' =>
	  qq{SELECT count(*) FROM obx.outbox_events WHERE state = 'pending' AND topic = '$topics[0]'},
	'obx.outbox_events, one event' =>
	  qq{SELECT * FROM obx.outbox_events WHERE id = '$leased'});

# Every query of the exporter's file, by its name.
my $yaml = slurp_file("$FindBin::RealBin/../monitoring/obx-queries.yaml");
while ($yaml =~ /^(\w+):\n  query: \|\n((?:    .*\n|\n)+)/mg)
{
	$reads{"exporter's $1"} = $2;
}
cmp_ok(scalar(grep { /^exporter's / } keys %reads), '>=', 8, 'the exporter\'s queries are read');

my $row_bound = int($n / 200);
for my $name (sort keys %reads)
{
	my ($b, $rows) = buffers($reads{$name});
	cmp_ok($b, '<', $bound, "$name touches $b buffers, under 2% of the history's $pages pages")
	  or diag(q1("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) $reads{$name}"));
	cmp_ok($rows, '<', $row_bound, "$name: the planner expects $rows rows of obx.events, under 0.5% of $n")
	  or diag(q1("EXPLAIN $reads{$name}"));
}
my ($b, $rows) = buffers(q{SELECT count(*) FROM obx.outbox_events WHERE published_at IS NULL});
cmp_ok($b, '>', $bound, "a read of the whole history touches $b buffers: the bound can fail");
cmp_ok($rows, '>', $row_bound, "and the planner expects $rows rows of obx.events: so can the other");

done_testing();
