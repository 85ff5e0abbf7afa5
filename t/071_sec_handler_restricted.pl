# Security: a handler runs as its subscription's owner in a
# security-restricted operation, inside a GUC nest level unwound after
# each call (as PostgreSQL runs index expressions during VACUUM).  With the
# documented grants only, mallory's handler sets settings for the session
# (set_config(..., false)): a custom one, work_mem, search_path; the next
# call sees none of them.  Every call runs as mallory, sees search_path =
# pg_catalog, pg_temp, and cannot create a temporary table (which would
# outlive the call and could shadow obx's relations through pg_temp).
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use ObxConsumer;
use ObxSecurity;
use PostgreSQL::Test::Utils;
use Test::More;

my $mock = start_mock();
my $topic = 'sec.restricted.v1';
my $consumer = 'mallory-restricted';

my $node = mallory_node('sec_restricted', $mock, topics => { $topic => 1 });

sub q1 { $node->safe_psql('postgres', $_[0]) }

$node->safe_psql('postgres', q{
	SET ROLE mallory;
	CREATE TABLE mallory.calls (
		n serial, event_id text, who name, path text, marker text,
		work_mem text, temp_table text);
});
subscribe($node, $consumer, [$topic], handler($node, 'mallory.h', q{
		INSERT INTO mallory.calls (event_id, who, path, marker, work_mem)
		VALUES (e.event_id, current_user, pg_catalog.current_setting('search_path'),
				pg_catalog.current_setting('mallory.marker', true),
				pg_catalog.current_setting('work_mem'));
		PERFORM pg_catalog.set_config('mallory.marker', 'set by ' || e.event_id, false);
		PERFORM pg_catalog.set_config('work_mem', '77kB', false);
		PERFORM pg_catalog.set_config('search_path', 'mallory, public, pg_catalog', false);
		BEGIN
			CREATE TEMP TABLE mallory_tmp (x integer);
			outcome := 'created';
		EXCEPTION WHEN OTHERS THEN
			outcome := SQLERRM;
		END;
		UPDATE mallory.calls c SET temp_table = outcome WHERE c.event_id = e.event_id;},
	declare => '		outcome text;', as => 'mallory'), as => 'mallory');

produce($mock, $topic,
	map { { partition => 0, key => "k$_", headers => [ event_id => "r-$_" ],
		payload => qq({"n": $_}) } } 1 .. 3);
wait_caught_up($node, $consumer, $topic, partition_ends($mock, $topic), 'three messages');

my $default_work_mem = q1('SELECT pg_catalog.current_setting(\'work_mem\')');
is(q1(q{SELECT pg_catalog.string_agg(event_id || ': ' || who || ' | ' || path || ' | '
				|| coalesce(nullif(marker, ''), '-') || ' | ' || work_mem, E'\n' ORDER BY n)
		  FROM mallory.calls}),
	join("\n", map { "r-$_: mallory | pg_catalog, pg_temp | - | $default_work_mem" } 1 .. 3),
	'each call ran as mallory with search_path pg_catalog, pg_temp and none of the settings the previous call made');
is(q1(q{SELECT pg_catalog.string_agg(DISTINCT temp_table, ', ') FROM mallory.calls}),
	'cannot create temporary table within security-restricted operation',
	'a handler cannot create a temporary table');
is(q1(qq{SELECT processed FROM obx.consumer_status WHERE consumer_name = '$consumer'}),
	'3', 'the three messages were processed, none dead-lettered');
no_escalation($node, 'a handler changing settings');

done_testing();
