# Security: subscriptions have owners (issue 17, item 3; docs/security.md).
#
# bob subscribes "billing"; mallory, with the same documented grants
# (USAGE on obx, EXECUTE on subscribe, unsubscribe and mark_processed),
# cannot replace it with her handler, unsubscribe it, or suppress one of
# its events by marking it processed first: every event reaches bob's
# handler, as bob, and none reaches hers.  A row with bad options
# written directly into obx.subscriptions (as only a superuser can) is
# reported and skipped while the other subscriptions go on, and the
# consumer worker never restarts.  When the owner of a subscription is
# dropped, the worker reports that subscription and skips it: its events
# are neither applied nor dead-lettered.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use ObxConsumer;
use PostgreSQL::Test::Utils;
use Test::More;

my $mock = start_mock();
my $topic = 'sec.owner.v1';
my $other = 'sec.owner.other.v1';

my $node = consumer_node('sec_owner', $mock, topics => { $topic => 1, $other => 1 });
my ($worker) = @{ consumer_pids($node) };

sub q1 { $node->safe_psql('postgres', $_[0]) }

sub as_role
{
	my ($role, $sql) = @_;
	my ($rc, $out, $err) = $node->psql('postgres', "SET ROLE $role; $sql");
	return ($rc, $err);
}

q1(q{
	CREATE FUNCTION shop.steal(e obx.inbound_event) RETURNS void
	LANGUAGE sql AS $$ INSERT INTO shop.effects (event_id, topic) VALUES ('stolen:' || e.event_id, e.topic) $$;
	CREATE ROLE bob;
	CREATE ROLE mallory;
	CREATE ROLE carol;
	GRANT USAGE ON SCHEMA obx, shop TO bob, mallory, carol;
	GRANT INSERT ON shop.effects TO bob, mallory, carol;
	GRANT USAGE ON ALL SEQUENCES IN SCHEMA shop TO bob, mallory, carol;
	GRANT EXECUTE ON FUNCTION obx.subscribe(text, text[], regprocedure, jsonb),
		obx.unsubscribe(text), obx.mark_processed(text, text) TO bob, mallory, carol;
});
my ($rc, $err) = as_role('bob', qq{SELECT obx.subscribe('billing', ARRAY['$topic'],
	'shop.record(obx.inbound_event)', '{"kafka": {"session.timeout.ms": "6000"}}')});
is($rc, 0, 'bob subscribes billing');

sub msg
{
	my ($id) = @_;
	return { partition => 0, key => $id, headers => [ event_id => $id ],
		payload => qq({"id": "$id"}) };
}

produce($mock, $topic, msg('evt-1'));
ok($node->poll_query_until('postgres',
	"SELECT count(*) = 1 FROM shop.effects WHERE event_id = 'evt-1'"),
	'billing consumes as bob');

# mallory tries to take billing over, to remove it, and to suppress evt-2.
($rc, $err) = as_role('mallory', qq{SELECT obx.subscribe('billing', ARRAY['$topic'],
	'shop.steal(obx.inbound_event)')});
isnt($rc, 0, 'mallory cannot replace bob\'s subscription');
like($err, qr/must be owner of obx consumer "billing"/, 'and is told whose it is');
($rc, $err) = as_role('mallory', q{SELECT obx.unsubscribe('billing')});
isnt($rc, 0, 'mallory cannot unsubscribe it');
($rc, $err) = as_role('mallory', q{SELECT obx.mark_processed('billing', 'evt-2')});
isnt($rc, 0, 'mallory cannot mark billing\'s events processed');
($rc, $err) = as_role('mallory', q{UPDATE obx.subscriptions SET handler = 'shop.steal(obx.inbound_event)'});
like($err, qr/permission denied for table subscriptions/, 'nor write obx.subscriptions');

# A bad row written directly, and a subscription of carol's on another
# topic made after it: the worker reports the bad one and serves the rest.
q1(qq{INSERT INTO obx.subscriptions (consumer_name, topics, handler, options, owner)
	VALUES ('bad-row', ARRAY['$topic'], 'shop.record(obx.inbound_event)',
			'{"retry_sqlstates": {"a": 1}}', 'bob')});
($rc, $err) = as_role('carol', qq{SELECT obx.subscribe('carol-app', ARRAY['$other'],
	'shop.record(obx.inbound_event)', '{"kafka": {"session.timeout.ms": "6000"}}')});
is($rc, 0, 'carol subscribes carol-app');
produce($mock, $topic, msg('evt-2'), msg('evt-3'));
produce($mock, $other, msg('evt-c1'));
ok($node->poll_query_until('postgres', q{
	SELECT count(DISTINCT event_id) = 3 FROM shop.effects
	 WHERE event_id IN ('evt-2', 'evt-3', 'evt-c1')}),
	'with the bad row in place, billing and carol-app consume their events');
is(q1(q{SELECT string_agg(event_id || ':' || applied_by || ':' || n, ',' ORDER BY event_id)
		  FROM (SELECT event_id, applied_by, count(*) AS n FROM shop.effects GROUP BY 1, 2) e}),
	'evt-1:bob:1,evt-2:bob:1,evt-3:bob:1,evt-c1:carol:1',
	'each event applied once, by its owner\'s handler; nothing reached mallory\'s');
ok($node->wait_for_log(
	qr/obx subscription "bad-row" is not consumed: obx subscription option "retry_sqlstates" must be an array of SQLSTATE codes/),
	'the bad row is reported in the log');
is(q1(q{SELECT problem FROM obx.consumers WHERE consumer_name = 'bad-row'}),
	'obx subscription option "retry_sqlstates" must be an array of SQLSTATE codes',
	'and in obx.consumers');
is(q1(q{SELECT count(*) FROM obx.processed_events WHERE consumer_name = 'bad-row'}), '0',
	'the bad row consumed nothing');
is_deeply(consumer_pids($node), [$worker], 'the consumer worker never restarted');

# The owner of carol-app is dropped: reported, skipped, nothing dead-lettered.
q1(q{REASSIGN OWNED BY carol TO postgres; DROP OWNED BY carol; DROP ROLE carol});
ok($node->wait_for_log(
	qr/obx subscription "carol-app" is not consumed: its owner \(role with OID \d+\) no longer exists/),
	'a subscription whose owner was dropped is reported');
like(q1(q{SELECT problem FROM obx.consumers WHERE consumer_name = 'carol-app'}),
	qr/^its owner \(role with OID \d+\) no longer exists$/, 'obx.consumers says why');
produce($mock, $other, msg('evt-c2'));
produce($mock, $topic, msg('evt-4'));
ok($node->poll_query_until('postgres',
	"SELECT count(*) = 1 FROM shop.effects WHERE event_id = 'evt-4'"),
	'billing goes on');
is(q1(q{SELECT count(*) FROM shop.effects WHERE event_id = 'evt-c2'}), '0',
	'the orphaned subscription applied nothing');
is(q1(q{SELECT count(*) FROM obx.dead_letters}), '0', 'and dead-lettered nothing');
is_deeply(consumer_pids($node), [$worker], 'the consumer worker still never restarted');

done_testing();
