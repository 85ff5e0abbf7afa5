# obx-relay runs subscriptions: the in-database consumer's guarantees with
# the daemon, on a PostgreSQL that never loads obx's library (the SQL-only
# install), the daemon connecting as a role that holds only obx_worker's
# grants.  Events go through the outbox (the daemon publishes them to the
# Kafka stand-in) and come back to a handler through the daemon's
# consumer (src/daemon/consume.c, obx._consume).
#
# Proves:
# - a handler that is not SECURITY DEFINER owned by the subscription's
#   owner (with a SET search_path) is never called: the partition waits,
#   obx.consumer_status says why, nothing is marked; once the subscription
#   names a handler that meets the rule, the waiting event is applied;
# - the daemon calls handlers as obx_handler_caller, a role with no rights:
#   a handler turned SECURITY INVOKER after the check reads nothing of
#   obx's and cannot RESET ROLE to the daemon's role;
# - every event published reaches the handler exactly once (sets of event
#   ids), run as the subscription's owner (current_user), not the daemon's
#   role;
# - held partitions: an event whose handler fails transiently (40001) is
#   retried after a backoff, and the next event of its key (same
#   partition) is applied only after it;
# - a poison event (the handler raises 23514) becomes a dead letter
#   (class handler, its SQLSTATE and message), is not applied, and does not
#   block the events after it;
# - the crash window: the daemon SIGKILLed (its consumer process dies with
#   it) after the handlers' transactions committed and before any offset
#   was committed (auto.commit.interval.ms of an hour holds the window
#   open): the new daemon re-reads every
#   message, each is recognized as a duplicate (the handler is not called,
#   duplicates counts it), and every effect stays applied exactly once;
#   events sent after the restart are applied;
# - a handler that waits does not hold publishing back: an event enqueued
#   meanwhile is published before the handler returns (the subscriptions
#   run in a process of their own); that process killed -9 alone is
#   started again, and the events sent after are applied once; SIGHUP
#   stops it when the settings name no subscription (publishing goes on)
#   and starts one when they name them again; it records the partitions'
#   watermarks, so obx.consumer_status has the broker's ends and the lag;
# - a call that failed (its session terminated inside the handler) stores
#   no offset: the daemon stopped with SIGTERM before trying it again (a
#   close commits the offsets stored), the next one applies the event;
# - messages of another producer: the id from the payload's eventId, a
#   binary key as \x and hex, a value that is not JSON dead-lettered as
#   malformed with its bytes;
# - handler_timeout_ms: a handler past it is cancelled, its message
#   dead-lettered (57014), and the next one of its key applied;
# - SIGTERM stops the daemon with exit status 0;
# - an owner that may not SET ROLE obx_handler_caller installs with a
#   warning, obx._call_handler stays its SECURITY INVOKER function, and
#   every subscription of that database is refused.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxConsumer;
use ObxDaemon;
use ObxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $mock = start_mock();
my $dir = PostgreSQL::Test::Utils::tempdir('consume');
my $topic = 'stock.daemon.v1';
my $consumer = 'inventory';
create_topic($mock, $topic, 4);
my $node = sql_only_node('daemon_consume');

sub q1 { $node->safe_psql('postgres', $_[0]) }

# The install gave obx._call_handler to obx_handler_caller and kept no
# membership that inherits its rights (what subscribers grant it).
is(q1(q{SELECT p.proowner::regrole || ' ' || pg_has_role('shop_owner', 'obx_handler_caller', 'USAGE')
		  FROM pg_proc p WHERE p.oid = 'obx._call_handler(regprocedure, obx.inbound_event)'::regprocedure}),
	'obx_handler_caller false', 'obx._call_handler is obx_handler_caller\'s; the installer does not hold its rights');

# The subscriber: owns the schema of its handlers and effects.  obx's
# owner (shop_owner) needs USAGE on it to subscribe a handler there
# (docs/operations.md, "What differs from the extension").
q1(q{
	CREATE ROLE inventory LOGIN;
	GRANT USAGE ON SCHEMA obx TO inventory;
	GRANT EXECUTE ON FUNCTION obx.subscribe(text, text[], regprocedure, jsonb),
		obx.unsubscribe(text) TO inventory;
	CREATE SCHEMA shop AUTHORIZATION inventory;
	GRANT USAGE ON SCHEMA shop TO shop_owner;
	SET ROLE inventory;
	CREATE TABLE shop.effects (
		n bigserial PRIMARY KEY,
		event_id text NOT NULL,
		kafka_partition integer,
		kafka_offset bigint,
		event_key text,
		applied_by name NOT NULL DEFAULT current_user,
		session_role name NOT NULL DEFAULT session_user);
	CREATE SEQUENCE shop.flaky_calls;
	-- The rule met: SECURITY DEFINER, owned by the subscriber, its own path.
	CREATE FUNCTION shop.reserve(e obx.inbound_event) RETURNS void
	LANGUAGE plpgsql SECURITY DEFINER SET search_path = shop, pg_catalog AS $$
	BEGIN
		IF e.payload->>'poison' = 'true' THEN
			RAISE EXCEPTION 'poison event %', e.event_id USING ERRCODE = '23514';
		END IF;
		IF coalesce(e.payload->>'sleep', '') = 'true' THEN
			-- Not a wait of the test: a handler that outlives its
			-- handler_timeout_ms (1 s below) and must be cancelled.
			PERFORM pg_sleep(30);
		END IF;
		IF coalesce(e.payload->>'gate', '') = 'hold' THEN
			PERFORM pg_advisory_xact_lock_shared(4242);
		END IF;
		IF coalesce(e.payload->>'flaky', '') = 'true' THEN
			IF nextval('flaky_calls') <= 2 THEN
				RAISE EXCEPTION 'not yet' USING ERRCODE = '40001';
			END IF;
		END IF;
		INSERT INTO effects (event_id, kafka_partition, kafka_offset, event_key)
		VALUES (e.event_id, e.kafka_partition, e.kafka_offset, e.event_key);
	END $$;
	-- Not SECURITY DEFINER: it would run as the daemon's role.
	CREATE FUNCTION shop.reserve_invoker(e obx.inbound_event) RETURNS void
	LANGUAGE sql SET search_path = shop, pg_catalog AS $$
		INSERT INTO effects (event_id) VALUES (e.event_id) $$;
	RESET ROLE;
	-- SECURITY DEFINER, but another role's: it would run as a superuser.
	CREATE FUNCTION public.reserve_as_super(e obx.inbound_event) RETURNS void
	LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
		INSERT INTO shop.effects (event_id) VALUES (e.event_id) $$;
});

# subscribe_as($handler): (re)subscribe the consumer, as inventory.  An
# hour between offset commits: only a close of the consumer commits.
sub subscribe_as
{
	my ($name, $handler, %opt) = @_;
	subscribe($node, $name, [$topic], $handler, as => 'inventory',
		kafka => { 'auto.commit.interval.ms' => 3600000, 'session.timeout.ms' => 6000 },
		%opt);
}

# enqueue(\@payloads, $key_of): each payload (a hash) enqueued in its own
# transaction on key sku-<n % 4>; returns the event ids in order.
my $seq = 0;
sub enqueue
{
	my (@payloads) = @_;
	my @ids;
	for my $p (@payloads)
	{
		$seq++;
		my $key = $p->{key} // 'sku-' . ($seq % 4);
		my $extra = join('', map { qq{, "$_": "$p->{$_}"} } grep { $_ ne 'key' } sort keys %$p);
		push @ids, q1(qq{SELECT obx.enqueue('$topic', '$key', '{"n": $seq$extra}')});
	}
	return @ids;
}

sub effects
{
	my %n;
	for my $line (split /\n/, q1('SELECT event_id, count(*) FROM shop.effects GROUP BY 1'))
	{
		my ($id, $c) = split /\|/, $line;
		$n{$id} = $c;
	}
	return \%n;
}

sub caught_up
{
	my ($what) = @_;
	ok(all_published($node), "the daemon published the events: $what");
	wait_caught_up($node, $consumer, $topic, partition_ends($mock, $topic), $what);
}

############################################################################
# A handler that does not meet the rule is never called.
############################################################################
subscribe_as($consumer, 'shop.reserve_invoker(obx.inbound_event)');
subscribe_as('super', 'public.reserve_as_super(obx.inbound_event)');
my $config = relay_config($node, $mock, $dir, subscriptions => '*');
my $relay = start_relay($config);

my ($first) = enqueue({});
ok($node->poll_query_until('postgres', qq{
	SELECT count(*) = 1 FROM obx.consumer_status
	 WHERE consumer_name = '$consumer' AND last_error LIKE
	   '%handler shop.reserve_invoker(obx.inbound_event) must be SECURITY DEFINER and owned by the subscription''s owner inventory%'}),
	'a handler that is not SECURITY DEFINER: obx.consumer_status says why');
ok($node->poll_query_until('postgres', qq{
	SELECT count(*) = 1 FROM obx.consumer_status
	 WHERE consumer_name = 'super' AND last_error LIKE
	   '%handler public.reserve_as_super(obx.inbound_event) must be SECURITY DEFINER and owned by the subscription''s owner inventory%'}),
	'a SECURITY DEFINER handler of another role (a superuser): refused too');
like(relay_log($relay), qr/obx-relay cannot run subscription "inventory": its handler/,
	'the daemon logs the refusal');
is(q1('SELECT count(*) FROM shop.effects'), '0', 'neither handler was called');
is(q1('SELECT count(*) FROM obx.processed_events'), '0', 'no event was marked processed');
is(q1(qq{SELECT coalesce(sum(processed + duplicates + dead_lettered), 0) FROM obx.consumer_status
		 WHERE consumer_name IN ('$consumer', 'super')}), '0',
	'the refused event is neither processed nor dead-lettered: its partition waits');
q1(q{SET ROLE inventory; SELECT obx.unsubscribe('super')});

# A handler that meets the rule, in a schema the daemon's role may not
# use: refused too (not dead-lettered), until the subscriber grants it.
subscribe_as($consumer, 'shop.reserve(obx.inbound_event)');
ok($node->poll_query_until('postgres', qq{
	SELECT count(*) = 1 FROM obx.consumer_status
	 WHERE consumer_name = '$consumer' AND last_error LIKE
	   '%role obx_handler_caller needs USAGE on schema shop and EXECUTE on its handler shop.reserve(obx.inbound_event)%'}),
	'a handler in a schema the daemon may not use: obx.consumer_status says why');
is(q1('SELECT count(*) FROM shop.effects'), '0', 'still no handler called');
is(q1('SELECT count(*) FROM obx.dead_letters'), '0', 'and nothing dead-lettered');
my ($status, $out) = relay_check($config);
isnt($status, 0, 'obx-relay --check fails while a subscription cannot be served');
like($out, qr/FAIL  subscription "$consumer": role obx_handler_caller needs USAGE on schema shop/,
	'--check says which subscription and why');
q1('SET ROLE inventory; GRANT USAGE ON SCHEMA shop TO obx_handler_caller');
($status, $out) = relay_check($config);
like($out, qr/ok    subscription "$consumer": its handler may be called/,
	'--check passes the subscription once its handler may be called');
is($status, 0, 'obx-relay --check: ok') or diag($out);
caught_up('after the subscription names a handler that meets the rule');
is_deeply(effects(), { $first => 1 }, 'the event that waited is applied once');

# The daemon calls a handler through obx._call_handler, as the rights-less
# obx_handler_caller: a handler a CREATE OR REPLACE made SECURITY INVOKER
# between obx._daemon_handler_problem and the call (a race obx._consume
# cannot close) runs as that role, not with the daemon's rights.  The spy
# reports what it could do; run by the daemon's role directly, it could.
q1(q{SET ROLE inventory;
	CREATE FUNCTION shop.spy(e obx.inbound_event) RETURNS void
	LANGUAGE plpgsql SET search_path = pg_catalog AS $$
	DECLARE
		r text;
	BEGIN
		BEGIN
			PERFORM count(*) FROM obx.events;
			r := 'read the outbox';
		EXCEPTION WHEN insufficient_privilege THEN
			r := 'outbox denied';
		END;
		BEGIN
			RESET ROLE;
			r := r || ', RESET ROLE to ' || current_user;
		EXCEPTION WHEN insufficient_privilege THEN
			r := r || ', RESET ROLE denied';
		END;
		RAISE EXCEPTION 'spy: % as %', r, current_user;
	END $$;
	GRANT USAGE ON SCHEMA shop TO relay;});
my (undef, undef, $direct) = $node->psql('postgres',
	'SELECT shop.spy(NULL::obx.inbound_event)', extra_params => [ '-U', 'relay' ]);
like($direct, qr/spy: read the outbox, RESET ROLE to relay as relay/,
	'the spy called by the daemon\'s role itself reads the outbox');
my (undef, undef, $wrapped) = $node->psql('postgres',
	q{SELECT obx._call_handler('shop.spy(obx.inbound_event)', NULL::obx.inbound_event)},
	extra_params => [ '-U', 'relay' ]);
like($wrapped, qr/spy: outbox denied, RESET ROLE denied as obx_handler_caller/,
	'called as the daemon calls handlers, it runs as obx_handler_caller: no outbox, no way back');
q1('SET ROLE inventory; REVOKE USAGE ON SCHEMA shop FROM relay; DROP FUNCTION shop.spy');

############################################################################
# Exactly once, as the owner; a held partition; a poison event.
############################################################################
my @ids = ($first, enqueue(map { {} } 1 .. 20));
my ($flaky) = enqueue({ key => 'sku-held', flaky => 'true' });
my ($after_flaky) = enqueue({ key => 'sku-held' });
my ($poison) = enqueue({ key => 'sku-poison', poison => 'true' });
my @after_poison = enqueue({ key => 'sku-poison' }, { key => 'sku-poison' });
push @ids, $flaky, $after_flaky, @after_poison;
caught_up('the events, the flaky and the poison one');

is_deeply(effects(), { map { $_ => 1 } @ids },
	'every event published reached the handler exactly once (the poison one never)');
is(q1(q{SELECT string_agg(DISTINCT applied_by || '/' || session_role, ',') FROM shop.effects}),
	'inventory/relay', 'the handler ran as the subscription owner, in the daemon\'s session');

my $t = consumer_totals($node, $consumer, $topic);
is(q1(qq{SELECT s.retries || ' ' || s.last_error FROM obx.consumer_status s
		   JOIN shop.effects e ON e.kafka_partition = s.kafka_partition
		  WHERE s.consumer_name = '$consumer' AND e.event_id = '$flaky'}),
	'2 40001: not yet', 'the flaky event was retried twice, its error recorded');
is(q1(qq{SELECT a.n > f.n AND a.kafka_partition = f.kafka_partition
		   FROM shop.effects f, shop.effects a
		  WHERE f.event_id = '$flaky' AND a.event_id = '$after_flaky'}), 't',
	'held partition: the next event of its key (same partition) was applied only after the flaky one');
is(q1("SELECT last_value FROM shop.flaky_calls"), '3',
	'the flaky handler failed twice, then succeeded');

is(q1(qq{SELECT event_id || '|' || error_class || '|' || error_sqlstate || '|' || error_message
		   FROM obx.dead_letters WHERE consumer_name = '$consumer'}),
	"$poison|handler|23514|poison event $poison",
	'the poison event is a dead letter with its SQLSTATE and message');
is(q1("SELECT count(*) FROM shop.effects WHERE event_id = '$poison'"), '0',
	'the poison event had no effect');
is("$t->{processed} $t->{duplicates} $t->{dead_lettered}", scalar(@ids) . ' 0 1',
	'consumer_status: every event processed once, no duplicate, one dead letter');
like(relay_log($relay), qr/message dead-lettered: 23514: poison event/,
	'the daemon logs the dead letter');

############################################################################
# Killed after the commits, before any offset commit.
############################################################################
my $before = $t;
stop_relay($relay, 'KILL');
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 0 FROM pg_stat_activity WHERE application_name LIKE 'obx-relay%'}),
	'the daemon killed -9 is gone, its consumer process too');
$relay = start_relay($config);
my $n_before = $before->{processed} + $before->{dead_lettered};
ok($node->poll_query_until('postgres', qq{
	SELECT sum(duplicates) >= $n_before FROM obx.consumer_status
	 WHERE consumer_name = '$consumer' AND topic = '$topic'}),
	'the new daemon re-reads every message handled before the kill (no offset was committed)');
my @later = enqueue(map { {} } 1 .. 8);
push @ids, @later;
caught_up('after the restart');
$t = consumer_totals($node, $consumer, $topic);
is($t->{duplicates}, $n_before,
	'each redelivered message is recognized as a duplicate, the dead letter included');
is_deeply(effects(), { map { $_ => 1 } @ids },
	'every effect is applied exactly once: before the kill, redelivered, and after');
is($t->{processed}, scalar(@ids), 'processed counts each event once');
is(q1(qq{SELECT count(*) FROM obx.dead_letters WHERE consumer_name = '$consumer'}), '1',
	'the poison event is dead-lettered once');
is(q1(qq{SELECT count(*) FROM obx.processed_events WHERE consumer_name = '$consumer'}),
	scalar(@ids) + 1, 'obx.processed_events holds each event once (the dead letter too)');

is(q1("SELECT last_value FROM shop.flaky_calls"), '3',
	'the redelivered flaky event is a duplicate: its handler was not called again');
is(stop_relay($relay), 0, 'SIGTERM stops the daemon with exit status 0');

############################################################################
# A call that fails stores no offset: its session is terminated inside
# the handler, the daemon stopped (SIGTERM commits the offsets stored)
# before the backoff lets it try again; the next daemon applies it.
############################################################################
$relay = start_relay(relay_config($node, $mock, $dir, subscriptions => '*',
	backoff_min => 600000, backoff_max => 600000));
my $gate = $node->background_psql('postgres');
$gate->query_safe('SELECT pg_advisory_lock(4242)');
my ($gated) = enqueue({ gate => 'hold' });
push @ids, $gated;
ok($node->poll_query_until('postgres', q{
	SELECT count(*) = 1 FROM pg_stat_activity
	 WHERE application_name = 'obx-relay consumer' AND wait_event = 'advisory'}),
	'the daemon is inside the handler of the gated event');
# A handler that waits does not hold the relay back: its consumer runs in a
# process of its own.
my ($meanwhile) = enqueue({ key => 'sku-meanwhile' });
push @ids, $meanwhile;
ok($node->poll_query_until('postgres', qq{
	SELECT published_at IS NOT NULL FROM obx.outbox_events WHERE id = '$meanwhile'}),
	'an event enqueued while a handler waits is published');
is(q1(q{SELECT count(*) FROM pg_stat_activity
		 WHERE application_name = 'obx-relay consumer' AND wait_event = 'advisory'}), '1',
	'published while the handler still waited');
q1(q{SELECT pg_terminate_backend(pid) FROM pg_stat_activity
	  WHERE application_name = 'obx-relay consumer' AND wait_event = 'advisory'});
wait_until(sub { relay_log($relay) =~ /offset \d+: obx\._consume failed/ },
	'the daemon to see its call fail');
$gate->quit;
is(stop_relay($relay), 0, 'the daemon stopped (SIGTERM) while the failed event waits');
is(q1("SELECT count(*) FROM shop.effects WHERE event_id = '$gated'"), '0',
	'the failed call left no effect');
$relay = start_relay($config);
caught_up('after a failed call and a restart');
is_deeply(effects(), { map { $_ => 1 } @ids },
	'the event whose call failed is applied by the next daemon, once: its offset was not committed');

############################################################################
# Messages from other producers: the event id from the payload's eventId
# when there is no event_id header; a value that is not JSON is a
# malformed dead letter, with its bytes (src/consumer/inbound.c's rules).
############################################################################
produce($mock, $topic,
	{ partition => 0, key => "\x01\xfe", payload => '{"eventId": "evt-payload-1", "sku": "x"}' },
	{ partition => 0, headers => [ event_id => 'evt-bad-1' ], payload => 'not json' });
push @ids, 'evt-payload-1';
caught_up('after messages of another producer');
is(q1(q{SELECT event_key FROM shop.effects WHERE event_id = 'evt-payload-1'}), '\x01fe',
	'no event_id header: the id from the payload; a key that is not UTF-8 as \x and hex');
is(q1(q{SELECT error_class || '|' || convert_from(raw_payload, 'UTF8') || '|' || (payload IS NULL)
		     || '|' || (error_message LIKE 'payload is not JSON: %')
		   FROM obx.dead_letters WHERE event_id = 'evt-bad-1'}),
	'malformed|not json|true|true', 'a value that is not JSON: a malformed dead letter with its bytes');

############################################################################
# handler_timeout_ms: a handler past it is cancelled and its message
# dead-lettered; the partition goes on.
############################################################################
my $changes = () = relay_log($relay) =~ /subscription "inventory" changed/g;
subscribe_as($consumer, 'shop.reserve(obx.inbound_event)', handler_timeout_ms => 1000);
wait_until(sub { my $n = () = relay_log($relay) =~ /subscription "inventory" changed/g; $n > $changes },
	'the daemon to rebuild the consumer with the new timeout');
my ($slow) = enqueue({ key => 'sku-slow', sleep => 'true' });
my @after_slow = enqueue({ key => 'sku-slow' });
push @ids, @after_slow;
caught_up('after a handler that ran past its timeout');
is(q1(qq{SELECT error_class || '|' || error_sqlstate || '|' || error_message
		   FROM obx.dead_letters WHERE event_id = '$slow'}),
	'handler|57014|obx handler shop.reserve(obx.inbound_event) ran longer than its timeout of 1000 ms and was cancelled',
	'a handler past handler_timeout_ms: its message is a dead letter (57014)');
is_deeply(effects(), { map { $_ => 1 } @ids },
	'the slow event had no effect, the next one of its key was applied');

############################################################################
# The consumer process killed -9 alone: the daemon starts a new one.
############################################################################
sub children_of_relay
{
	return grep {
		(eval { slurp_file("/proc/$_/stat") } // q{}) =~ /\) \S+ $relay->{pid} /
	} map { m{^/proc/(\d+)$} ? $1 : () } glob('/proc/[0-9]*');
}
my @children = children_of_relay();
is(scalar @children, 1, 'the daemon runs one process of its own: the consumer');
kill('KILL', $children[0]);
wait_until(sub { relay_log($relay) =~ /the consumer process was killed by signal 9; a new one in 1 s/ },
	'the daemon to see its consumer process die');
push @ids, enqueue(map { {} } 1 .. 4);
caught_up('after the consumer process was killed alone');
is_deeply(effects(), { map { $_ => 1 } @ids },
	'a new consumer process applies the events sent after, each once');

# SIGHUP: settings without subscriptions stop the consumer process, while
# the daemon goes on publishing; settings with them start one again.
relay_config($node, $mock, $dir, path => $relay->{config});
kill('HUP', $relay->{pid});
wait_until(sub { scalar(children_of_relay()) == 0 }, 'the consumer process to stop on SIGHUP');
like(relay_log($relay), qr/no subscription to run: the consumer process stops/,
	'SIGHUP without subscriptions: the consumer process stops, and says so');
my @unconsumed = enqueue(map { {} } 1 .. 2);
push @ids, @unconsumed;
ok(all_published($node), 'the daemon still publishes');
relay_config($node, $mock, $dir, path => $relay->{config}, subscriptions => '*');
kill('HUP', $relay->{pid});
caught_up('after SIGHUP named the subscriptions again');
is(scalar(children_of_relay()), 1, 'a new consumer process runs them');
is_deeply(effects(), { map { $_ => 1 } @ids },
	'the events sent while no consumer ran are applied, each once');
# The lag: the consumer process records each partition's watermarks, as the
# consumer workers do, so obx.consumer_status has the broker's ends.
my $ends = partition_ends($mock, $topic);
my $values = join(', ', map { "($_, $ends->{$_})" } sort keys %$ends);
ok($node->poll_query_until('postgres', qq{
	SELECT count(*) = @{[ scalar(keys %$ends) ]} FROM (VALUES $values) AS e(p, o)
	  JOIN obx.consumer_status s ON s.kafka_partition = e.p AND s.high_watermark = e.o AND s.lag = 0
	 WHERE s.consumer_name = '$consumer' AND s.topic = '$topic'}),
	'each partition\'s high watermark is the broker\'s end, and the lag 0 once all is handled');
is(stop_relay($relay), 0, 'SIGTERM stops the daemon with exit status 0');

############################################################################
# An owner that may not SET ROLE obx_handler_caller (made by shop_owner
# above) installs all the same, with a warning; obx._call_handler is then
# no SECURITY DEFINER function of its own (it would run handlers as obx's
# owner), and the daemon would call no handler in that database.
############################################################################
q1(q{CREATE ROLE plain_owner LOGIN; CREATE DATABASE plain OWNER plain_owner});
my $file = $ENV{OBX_SQL_ONLY} || 'obx-sql-only.sql';
my ($rc, $stdout, $stderr) = $node->psql('plain', undef,
	extra_params => [ '-X', '-v', 'ON_ERROR_STOP=1', '-U', 'plain_owner', '-f', $file ]);
is($rc, 0, 'an owner without CREATEROLE installs in a cluster where obx_handler_caller exists');
like($stderr, qr/WARNING:  obx-relay will run no subscription in database "plain"/,
	'with a warning that says what is missing');
is($node->safe_psql('plain', q{
	SELECT pg_get_userbyid(p.proowner) || ' ' || p.prosecdef
	  FROM pg_proc p WHERE p.oid = 'obx._call_handler(regprocedure, obx.inbound_event)'::regprocedure}),
	'plain_owner false', 'obx._call_handler stays the installer\'s and runs as its caller');
like($node->safe_psql('plain', 'SELECT obx._daemon_handler_problem(NULL, NULL)', extra_params => [ '-U', 'plain_owner' ]),
	qr/^obx\._call_handler is not a SECURITY DEFINER function of role obx_handler_caller/,
	'every subscription there is refused, and says why');

done_testing();
