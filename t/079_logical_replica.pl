# A logical replica of obx's tables publishes nothing and consumes nothing
# (docs/operations.md, "Logical replication").  A publisher and a
# subscriber, both with obx, a relay and a consumer worker of their own,
# both pointed at the same broker; a publication FOR ALL TABLES on the
# publisher and a subscription on the subscriber carry the publisher's
# outbox (events, claims, records: every partition) and its subscriptions
# and dedupe records into the subscriber's obx tables.
#
# While the subscription exists the subscriber's relay claims nothing: its
# worker shows state "logical replica" with the subscription named in
# last_error, each relay process logs one WARNING, obx-relay --check fails
# naming it, and an obx-relay daemon serving the subscriber claims nothing
# either.
#
# Nor does the subscriber consume: the copy of a subscription made on the
# publisher would put its consumers into the publisher's consumer group,
# where they would take partitions and apply those messages to the copy,
# which the publisher never sees.  Its consumer worker logs one WARNING
# naming the subscription, and so does obx-relay's consumer process; the
# publisher's consumer applies every message, the subscriber's handler is
# never called.  After the cutover (below; the publisher's consumer
# unsubscribed) the subscriber's consumer resumes where the publisher's
# stopped: every later message applied once, none of the earlier again.
#
# The broker holds each of the publisher's events exactly once,
# even when the copies wait on the subscriber unpublished (a session holds
# the publisher's claim lock) while the subscriber's relay starts afresh,
# the moment a relay claims at once.  After the sequences are moved past
# the copied rows and DROP SUBSCRIPTION, both relays of the subscriber
# resume by themselves and publish its own new events, once each, over
# several claims.  The publisher's transaction ids run over 3,000 ahead of the
# subscriber's (an older cluster beside a new one, as in a blue/green
# upgrade): the copied events and claims carry them, and the subscriber's
# relays compare none of them with their own snapshots (obx._era()), so
# they neither miss the subscriber's events nor send a copy again.  At the
# cutover obx.lease_seq is moved last: until then both relays claim
# nothing, write no claim, and say why (obx.workers and a WARNING each).
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxConsumer;
use ObxDaemon;
use ObxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $topic = 'orders.replica.v1';
my $mock = start_mock();
my %conf = (
	'wal_level' => 'logical',
	'max_wal_senders' => 4,
	'max_replication_slots' => 4,
	'obx.workers' => 1,
	'obx.consumer_workers' => 1,
	'max_worker_processes' => 16);
my $pub = obx_node('publisher', $mock, %conf);
my $sub = obx_node('subscriber', $mock, %conf);
relay_ready($pub, 1);
relay_ready($sub, 1);
create_topic($mock, $topic, 2);

# The consumers' topic, and on both nodes the schema "shop" with the
# handler (a subscription names its handler, which must exist where it is
# consumed): it counts its calls in a sequence, which logical replication
# does not copy, so shop.handler_calls counts the calls on its own node.
my $ctopic = 'stock.replica.v1';
my $consumer = 'stock-replica';
create_topic($mock, $ctopic, 2);
for my $node ($pub, $sub)
{
	create_effects($node);
	handler($node, 'shop.reserve', q{
		PERFORM nextval('shop.handler_calls');
		PERFORM shop.record(e);});
}

# enqueue($node, $from, $n): $n events over 4 keys in one transaction;
# returns their ids.
sub enqueue
{
	my ($node, $from, $n) = @_;
	my $out = $node->safe_psql('postgres', qq{
		SELECT obx.enqueue('$topic', 'ord_' || (i % 4), jsonb_build_object('n', i))
		  FROM generate_series($from, $from + $n - 1) i});
	return split /\n/, $out;
}

# sub_relay(): the subscriber's relay worker as "pid|state|batches|last_error".
sub sub_relay
{
	return $sub->safe_psql('postgres',
		q{SELECT pid || '|' || state || '|' || batches || '|' || coalesce(last_error, '')
		    FROM obx.workers});
}

my $reason = qr/subscription "obx_sub" replicates \d+ of obx's tables into this database/;
my $log_start = -s $sub->logfile;

# sub_log(): what the subscriber logged since the subscription.
sub sub_log { return slurp_file($sub->logfile, $log_start) }
my $subscribed_at = $sub->safe_psql('postgres', 'SELECT now()');

$pub->safe_psql('postgres', 'CREATE PUBLICATION obx_pub FOR ALL TABLES');
my $pub_conn = $pub->connstr . ' dbname=postgres';
$sub->safe_psql('postgres', qq{
	CREATE SUBSCRIPTION obx_sub CONNECTION '$pub_conn' PUBLICATION obx_pub
	  WITH (copy_data = false)});
ok($sub->poll_query_until('postgres', q{
	SELECT count(*) = 5
	  FROM pg_subscription_rel r JOIN pg_class c ON c.oid = r.srrelid
	 WHERE c.relnamespace = 'obx'::regnamespace
	   AND c.relname IN ('events_0', 'events_1', 'events_2', 'claims_0', 'records_0')}),
	'the subscription covers the outbox\'s partitions');
ok($sub->poll_query_until('postgres',
	q{SELECT state = 'logical replica' FROM obx.workers}),
	'the subscriber\'s relay is in state "logical replica"');
like(sub_relay(), $reason, 'obx.workers names the subscription in last_error');
ok(wait_until(sub { sub_log() =~ /WARNING:  obx relay \d+ claims nothing in database "postgres": $reason/ },
	'the subscriber\'s relay to log why it claims nothing'),
	'the subscriber\'s relay logged a WARNING naming the subscription');

# obx-relay on the subscriber, as a role holding obx_worker's grants only:
# --check fails naming the subscription (the role can read the catalogs
# the check reads), and a daemon started there claims nothing either.
$sub->safe_psql('postgres', 'CREATE ROLE relay LOGIN IN ROLE obx_worker');
my $dir = PostgreSQL::Test::Utils::tempdir('relay');
my $config = "$dir/relay.conf";
open(my $fh, '>', $config) or die "cannot write $config: $!";
printf $fh "database = host=%s port=%d dbname=postgres user=relay\n", $sub->host, $sub->port;
print $fh "brokers = $mock->{bootstrap}\npoll_interval = 20\nlease_timeout = 5\nsubscriptions = *\n";
close $fh;
my ($status, $out) = relay_check($config);
isnt($status, 0, 'obx-relay --check fails on the subscriber');
like($out, qr/FAIL  $reason: obx-relay claims nothing here/, '--check names the subscription')
  or diag($out);
my $daemon = start_relay($config);
ok(wait_until(sub { relay_log($daemon) =~ /WARNING: claims nothing in database "postgres": $reason/ },
	'obx-relay to say why it claims nothing on the subscriber'),
	'obx-relay logged why it claims nothing');
ok(wait_until(sub { relay_log($daemon) =~ /WARNING: consumes nothing in database "postgres": $reason/ },
	'obx-relay\'s consumer process to say why it consumes nothing'),
	'obx-relay\'s consumer process logged why it consumes nothing');

# A subscription made on the publisher is copied to the subscriber; only
# the publisher's consumer applies its messages.
subscribe($pub, $consumer, [$ctopic], 'shop.reserve(obx.inbound_event)');
ok($sub->poll_query_until('postgres',
	"SELECT count(*) = 1 FROM obx.subscriptions WHERE consumer_name = '$consumer'"),
	'the subscription was copied to the subscriber');
ok(wait_until(sub { sub_log() =~ /WARNING:  obx consumer \d+ consumes nothing in database "postgres": $reason/ },
	'the subscriber\'s consumer worker to log why it consumes nothing'),
	'the subscriber\'s consumer worker logged a WARNING naming the subscription');

# send_stock($name, $n): $n messages over both partitions of the consumers'
# topic, ids "evt-$name-1" on; returns the ids.
sub send_stock
{
	my ($name, $n) = @_;
	my @ids = map { "evt-$name-$_" } 1 .. $n;
	produce($mock, $ctopic, map { sku_message($_ % 2, $ids[$_]) } 0 .. $#ids);
	return @ids;
}

# applied($node, $n, $what): $node's shop.effects holds $n events.
sub applied
{
	my ($node, $n, $what) = @_;
	return ok($node->poll_query_until('postgres',
		"SELECT count(DISTINCT event_id) = $n FROM shop.effects"), $what);
}

my @before = send_stock('before', 10);
applied($pub, 10, 'the publisher\'s consumer applied every message');
is_deeply(effects_per_event($pub), { map { $_ => 1 } @before },
	'the publisher applied each message once');
is(handler_calls($sub), 0, 'the subscriber\'s handler was never called');

# The publisher's transaction ids run far ahead of the subscriber's.
$pub->safe_psql('postgres', q{
	CREATE PROCEDURE burn_xids(n integer) LANGUAGE plpgsql AS $$
	BEGIN
		FOR i IN 1 .. n LOOP PERFORM pg_current_xact_id(); COMMIT; END LOOP;
	END $$;
	CALL burn_xids(5000)});

# The publisher's relay is held back (a session holds its claim lock) while
# events are enqueued there, so their copies wait on the subscriber
# unpublished and unclaimed.
my $blocker = $pub->background_psql('postgres');
$blocker->query_safe('SELECT pg_advisory_lock(7299704, 1)');
my @pub_ids = enqueue($pub, 1, 40);
ok($pub->poll_query_until('postgres', q{
	SELECT count(*) = 1 FROM pg_stat_activity
	 WHERE backend_type = 'obx relay' AND wait_event_type = 'Lock'}),
	'the publisher\'s relay waits for its claim lock');
ok($sub->poll_query_until('postgres',
	'SELECT count(*) = 40 FROM obx.events'),
	'the 40 events were copied to the subscriber');

# A relay claims at once on its first pass: stop the subscriber's; the
# launcher starts it again, and it must find the subscription before any
# claim.
my ($old_pid) = split /\|/, sub_relay();
$sub->safe_psql('postgres', "SELECT pg_terminate_backend($old_pid)");
ok($sub->poll_query_until('postgres', qq{
	SELECT pid <> $old_pid AND state IN ('logical replica', 'idle') FROM obx.workers}),
	'the subscriber\'s relay started again');
like(sub_relay(), qr/^\d+\|logical replica\|0\|$reason$/,
	'the new relay process is in state "logical replica" too, with no batch');

$blocker->query_safe('SELECT pg_advisory_unlock(7299704, 1)');
$blocker->quit;
ok(all_published($pub), 'the publisher published its events');
$pub->wait_for_catchup('obx_sub');
ok($sub->poll_query_until('postgres',
	'SELECT count(*) = 40 FROM obx.outbox_events WHERE published_at IS NOT NULL'),
	'the subscriber sees the copies published (the records were replicated)');
my $claims = qq{SELECT lease_id || ' ' || claimed_at FROM obx.claims
	WHERE claimed_at >= '$subscribed_at' ORDER BY 1};
my %pub_claims = map { $_ => 1 } split /\n/, $pub->safe_psql('postgres', $claims);
is_deeply([ grep { !$pub_claims{$_} } split /\n/, $sub->safe_psql('postgres', $claims) ], [],
	'every claim made on the subscriber since the subscription is a copy of the publisher\'s');
my $msgs = read_topic($mock, $topic);
is_deeply([ sort map { $_->{event_id} } @$msgs ], [ sort @pub_ids ],
	'the broker holds each of the publisher\'s events exactly once');
like(sub_relay(), qr/^\d+\|logical replica\|0\|/, 'the subscriber\'s relay made no batch');
is(scalar(() = sub_log() =~ /claims nothing in database/g), 2,
	'one WARNING per relay process, not one per check');
is(scalar(() = relay_log($daemon) =~ /claims nothing in database/g), 1,
	'obx-relay warned once');

# obx-relay's consumer process stops (a SIGHUP with no subscription left
# in its settings): the consumers after the cutover are the workers'.
open($fh, '>', $config) or die "cannot write $config: $!";
printf $fh "database = host=%s port=%d dbname=postgres user=relay\n", $sub->host, $sub->port;
print $fh "brokers = $mock->{bootstrap}\npoll_interval = 20\nlease_timeout = 5\n";
close $fh;
kill('HUP', $daemon->{pid});
ok(wait_until(sub { relay_log($daemon) =~ /no subscription to run: the consumer process stops/ },
	'obx-relay\'s consumer process to stop'), 'obx-relay\'s consumer process stopped');
is(scalar(() = relay_log($daemon) =~ /consumes nothing in database/g), 1,
	'obx-relay\'s consumer process warned once');
is(scalar(() = sub_log() =~ /consumes nothing in database/g), 1,
	'the subscriber\'s consumer worker warned once, not once per check');

# Cut over: every change applied, the sequences past the copied rows
# (logical replication copies no sequence), then DROP SUBSCRIPTION.  Both
# relays and the consumer resume by themselves.
$pub->wait_for_catchup('obx_sub');
my $seqs = $pub->safe_psql('postgres', q{
	SELECT (SELECT last_value FROM obx.event_seq) || ',' || (SELECT last_value FROM obx.lease_seq)
	       || ',' || (SELECT last_value FROM shop.effects_n_seq)});
my ($event_seq, $lease_seq, $effects_seq) = split /,/, $seqs;
# obx.lease_seq is left behind at first: the relays claim nothing, say
# why, and write no claim until it is moved.
$sub->safe_psql('postgres',
	"SELECT setval('obx.event_seq', $event_seq), setval('shop.effects_n_seq', $effects_seq)");
my $cut_at = $sub->safe_psql('postgres', 'SELECT now()');
$sub->safe_psql('postgres', 'DROP SUBSCRIPTION obx_sub');
ok($sub->poll_query_until('postgres', q{
	SELECT last_error LIKE 'obx.lease_seq is behind the claims copied into this database%'
	  FROM obx.workers}), 'with obx.lease_seq behind, obx.workers says why the relay claims nothing');
ok(wait_until(sub { sub_log() =~ /WARNING:  obx relay \d+ claims nothing: obx.lease_seq is behind/ },
	'the subscriber\'s relay to warn of obx.lease_seq'), 'the subscriber\'s relay warned of obx.lease_seq');
ok(wait_until(sub { relay_log($daemon) =~
	/WARNING: claims nothing in database "postgres": obx.lease_seq is behind.*setval/ },
	'obx-relay to warn of obx.lease_seq'), 'obx-relay warned of obx.lease_seq, naming the fix');
is($sub->safe_psql('postgres',
	"SELECT count(*) FROM obx.claims WHERE era = obx._era() AND claimed_at >= '$cut_at'"), '0',
	'meanwhile neither relay wrote a claim');
$sub->safe_psql('postgres', "SELECT setval('obx.lease_seq', $lease_seq)");
ok($sub->poll_query_until('postgres', q{SELECT state = 'idle' FROM obx.workers}),
	'after DROP SUBSCRIPTION the subscriber\'s relay is idle');
ok(wait_until(sub { sub_log() =~ /LOG:  obx relay \d+ resumes in database "postgres"/ },
	'the subscriber\'s relay to log that it resumes'),
	'the subscriber\'s relay logged that it resumes');
ok(wait_until(sub { relay_log($daemon) =~ /LOG: resumes in database "postgres"/ },
	'obx-relay to resume'), 'obx-relay logged that it resumes');
($status, $out) = relay_check($config);
unlike($out, qr/replicates/, '--check no longer reports the subscription') or diag($out);

# The publisher's consumer leaves the group; the subscriber's takes over
# from the offsets it committed (and its dedupe records, copied).
$pub->safe_psql('postgres', "SELECT obx.unsubscribe('$consumer')");
ok(wait_until(sub { sub_log() =~ /LOG:  obx consumer \d+ resumes in database "postgres"/ },
	'the subscriber\'s consumer worker to log that it resumes'),
	'the subscriber\'s consumer worker logged that it resumes');
my @after = send_stock('after', 6);
applied($sub, 16, 'the subscriber\'s consumer applied the messages sent after the cutover');
is_deeply(effects_per_event($sub), { map { $_ => 1 } @before, @after },
	'each message applied once across the cutover: the earlier ones by the publisher, the later by the subscriber');
is(handler_calls($sub), scalar(@after), 'the subscriber\'s handler ran for the later messages only');

cmp_ok($pub->safe_psql('postgres', 'SELECT pg_current_xact_id()::text::bigint'), '>',
	3000 + $sub->safe_psql('postgres', 'SELECT pg_current_xact_id()::text::bigint'),
	'the publisher\'s transaction ids are more than 3,000 ahead of the subscriber\'s');
my @sub_ids;
for my $round (0 .. 3)
{
	push @sub_ids, enqueue($sub, 1001 + 5 * $round, 5);
	ok(all_published($sub), "the subscriber publishes its own events, round $round");
}
$msgs = wait_for_broker($mock, $topic, sub { @{ $_[0] } >= 60 }, 'the subscriber\'s events');
is_deeply([ sort map { $_->{event_id} } @$msgs ], [ sort @pub_ids, @sub_ids ],
	'the broker holds each event of both databases exactly once');
is(stop_relay($daemon), 0, 'obx-relay stops cleanly');

done_testing();
