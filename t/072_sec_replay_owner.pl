# Security: obx.replay_dead_letter runs the handler as the subscription's
# owner, never as the caller.  mallory, a subscriber with the documented
# grants, has a handler that rejects an event (a dead letter) and, when it
# runs, tries to make mallory a superuser (public.pwn).  A superuser and an
# operator role (EXECUTE on the replay functions, nothing else) each replay a dead letter: the handler ran as mallory both
# times, nothing ran as a superuser, and mallory is an ordinary role.
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
my $topic = 'sec.replay.v1';
my $consumer = 'mallory-replay';

my $node = mallory_node('sec_replay', $mock, topics => { $topic => 1 });

sub q1 { $node->safe_psql('postgres', $_[0]) }

$node->safe_psql('postgres', q{
	SET ROLE mallory;
	CREATE TABLE mallory.applied (event_id text, who name, super boolean);
	CREATE TABLE mallory.fixed (yes boolean);
});
subscribe($node, $consumer, [$topic], handler($node, 'mallory.h', q{
		IF e.payload->>'bad' = 'yes' AND NOT EXISTS (SELECT FROM mallory.fixed) THEN
			RAISE EXCEPTION 'rejected %', e.event_id;
		END IF;
		PERFORM public.pwn('handler on ' || e.event_id);
		INSERT INTO mallory.applied
		SELECT e.event_id, current_user, r.rolsuper
		  FROM pg_catalog.pg_roles r WHERE r.rolname = current_user;},
	as => 'mallory'), as => 'mallory');

produce($mock, $topic,
	{ partition => 0, key => 'a', headers => [ event_id => 'rp-1' ], payload => '{"bad": "yes"}' },
	{ partition => 0, key => 'b', headers => [ event_id => 'rp-2' ], payload => '{"bad": "yes"}' },
	{ partition => 0, key => 'c', headers => [ event_id => 'rp-3' ], payload => '{"bad": "no"}' });
wait_caught_up($node, $consumer, $topic, partition_ends($mock, $topic), 'two rejected, one applied');
is(q1(qq{SELECT pg_catalog.string_agg(event_id, ',' ORDER BY event_id) FROM obx.dead_letters
		  WHERE consumer_name = '$consumer'}), 'rp-1,rp-2', 'the two rejected events are dead letters');

# mallory "fixes" the handler; a superuser replays one dead letter.
q1(q{INSERT INTO mallory.fixed VALUES (true)});
is(q1(qq{SELECT obx.replay_dead_letter(ARRAY(SELECT id FROM obx.dead_letters
		  WHERE event_id = 'rp-1'))}), '1', 'a superuser replayed rp-1');
is(q1(q{SELECT who || ' ' || super FROM mallory.applied WHERE event_id = 'rp-1'}),
	'mallory false', 'the superuser\'s replay ran the handler as mallory');
no_escalation($node, 'replay by a superuser');

# An operator with the replay grants replays the other.
q1(q{
	CREATE ROLE ops LOGIN;
	GRANT USAGE ON SCHEMA obx TO ops;
	GRANT EXECUTE ON FUNCTION obx.replay_dead_letter(bigint[]), obx.replay_dead_letter(text) TO ops;
});
is($node->safe_psql('postgres', qq{SET ROLE ops; SELECT obx.replay_dead_letter('$consumer')}),
	'1', 'an operator replayed rp-2');

is(q1(q{SELECT pg_catalog.string_agg(event_id || ' ' || who || ' ' || super, ', ' ORDER BY event_id)
		  FROM mallory.applied}),
	'rp-1 mallory false, rp-2 mallory false, rp-3 mallory false',
	'the handler ran as mallory, by the worker and in both replays');
is(q1(qq{SELECT pg_catalog.count(*) FROM obx.dead_letters
		  WHERE consumer_name = '$consumer' AND replayed_at IS NOT NULL}), '2',
	'both dead letters are marked replayed');
no_escalation($node, 'replay by an operator');

# The function behind the replay is not for everyone.
is(q1(q{SELECT pg_catalog.has_function_privilege('mallory', 'obx._replay_handler(bigint)', 'EXECUTE')}),
	'f', 'obx._replay_handler is not granted to PUBLIC');

done_testing();
