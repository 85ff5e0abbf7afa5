# obx-relay purges as the in-database housekeeping does (src/protocol/
# protocol.h, OBX_SQL_PURGE_*), on the SQL-only install:
# - dedupe rows of obx.processed_events older than processed_retention go,
#   more than one batch of them, and the younger ones stay;
# - dead letters older than dead_letter_retention go, counted from the
#   replay for a replayed one, and the log says how many were never
#   replayed; the younger ones stay;
# - with both settings 0, nothing is purged;
# - obx.status.problem says no obx-relay serves the database while an
#   event no claim has seen waits over a minute and no claim came in that
#   minute (before any daemon ran, and after the daemon stopped), and is
#   NULL while one serves it.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxDaemon;
use ObxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $mock = start_mock();
my $node = sql_only_node('daemon_purge');
my $dir = PostgreSQL::Test::Utils::tempdir('relay');

# Old and young rows: 1,500 old dedupe rows (more than one purge batch) and
# 10 young ones; dead letters failed 2 h ago (one of them replayed 2 h ago,
# one replayed a minute ago) and one failed a minute ago.
$node->safe_psql('postgres', q{
	INSERT INTO obx.processed_events (consumer_name, event_id, processed_at)
	SELECT 'stock', 'old-' || i, now() - interval '2 hours' FROM generate_series(1, 1500) i;
	INSERT INTO obx.processed_events (consumer_name, event_id, processed_at)
	SELECT 'stock', 'young-' || i, now() - interval '1 minute' FROM generate_series(1, 10) i;
	INSERT INTO obx.dead_letters (consumer_name, topic, kafka_partition, kafka_offset,
								  error_class, error_message, failed_at, replayed_at)
	VALUES ('stock', 't', 0, 1, 'handler', 'never replayed', now() - interval '2 hours', NULL),
		   ('stock', 't', 0, 2, 'handler', 'never replayed', now() - interval '2 hours', NULL),
		   ('stock', 't', 0, 3, 'handler', 'replayed long ago', now() - interval '2 hours',
			now() - interval '2 hours'),
		   ('stock', 't', 0, 4, 'handler', 'replayed lately', now() - interval '2 hours',
			now() - interval '1 minute'),
		   ('stock', 't', 0, 5, 'handler', 'young', now() - interval '1 minute', NULL);});

# No daemon yet: an event that waited over a minute (aged by hand) is seen.
my $problem = q{SELECT coalesce(max(problem), 'none') FROM obx.status};
is($node->safe_psql('postgres', $problem), 'none', 'no event waits: no problem');
$node->safe_psql('postgres', q{
	SELECT obx.enqueue('t.purge', 'early', '{}');
	UPDATE obx.events SET occurred_at = now() - interval '2 minutes' WHERE event_key = 'early';});
like($node->safe_psql('postgres', $problem),
	qr/^no obx-relay claims in this database: none ever has, and events have waited over a minute since$/,
	'an event waiting over a minute and no claim: obx.status.problem says no obx-relay serves the database');

# Both settings 0: the daemon claims, and purges nothing.
my $keep = start_relay(relay_config($node, $mock, $dir, processed_retention => 0,
	dead_letter_retention => 0));
ok($node->poll_query_until('postgres', q{SELECT count(*) > 0 FROM obx.claims}),
	'the daemon claims');
$node->safe_psql('postgres', q{SELECT obx.enqueue('t.purge', 'k', '{}')});
ok($node->poll_query_until('postgres',
	q{SELECT count(*) = 0 FROM obx.outbox_events WHERE published_at IS NULL}),
	'it publishes, so it has run its turns');
is($node->safe_psql('postgres', q{
	SELECT (SELECT count(*) FROM obx.processed_events) || ',' || (SELECT count(*) FROM obx.dead_letters)}),
	'1510,5', 'with processed_retention and dead_letter_retention 0 nothing is purged');
is($node->safe_psql('postgres', $problem), 'none', 'while the daemon serves the database: no problem');
stop_relay($keep);
$node->safe_psql('postgres', q{
	SELECT obx.enqueue('t.purge', 'late', '{}');
	UPDATE obx.events SET occurred_at = now() - interval '2 minutes' WHERE event_key = 'late';});
is($node->safe_psql('postgres', $problem), 'none', 'a claim came within the minute: no problem yet');
$node->safe_psql('postgres', q{UPDATE obx.claims SET claimed_at = claimed_at - interval '2 minutes'});
like($node->safe_psql('postgres', $problem), qr/^no obx-relay claims in this database: the latest claim was at /,
	'the daemon stopped a minute ago with an event waiting: the problem says so');

# An hour each: the old rows go, the young stay.
my $relay = start_relay(relay_config($node, $mock, $dir, processed_retention => 3600,
	dead_letter_retention => 3600));
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 0 FROM obx.processed_events WHERE event_id LIKE 'old-%'}),
	'the 1,500 dedupe rows older than processed_retention are purged');
is($node->safe_psql('postgres', q{SELECT count(*) FROM obx.processed_events}), '10',
	'the 10 younger ones stay');
ok($node->poll_query_until('postgres', q{
	SELECT string_agg(error_message, ',' ORDER BY kafka_offset) = 'replayed lately,young'
	  FROM obx.dead_letters}),
	'dead letters older than dead_letter_retention are purged (a replayed one from its replay)');
ok(wait_until(sub { relay_log($relay) =~ /purged 2 dead letters that were never replayed/ },
	'the log to count the dead letters never replayed'), 'the log says 2 were never replayed');
stop_relay($relay);

done_testing();
