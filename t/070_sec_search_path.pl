# Security: no search_path trick makes an obx worker run a function of
# someone else's as a superuser.  The workers connect as the bootstrap
# superuser; obx's own statements name everything with its schema and run
# with search_path pinned to pg_catalog, pg_temp, set by the worker after
# connecting (docs/security.md).  Three attacks, each with the documented
# grants only, each against both workers:
#   1. a subscriber's handler sets search_path for the rest of the session
#      (set_config(..., false)) to its own schema, which holds now() and
#      to_regclass(text);
#   2. a database owner who is not a superuser runs ALTER DATABASE ... SET
#      search_path = evil, pg_catalog, with evil.now() and
#      evil.to_regclass(text), and the workers restart;
#   3. the same owner shadows, in schema public (the default path), the
#      functions obx's statements used to call unqualified with a better
#      matching signature: unnest(text[]) and concat_ws(...).
# Every attacker function records who ran it and tries ALTER ROLE mallory
# SUPERUSER.  After events went both ways (relay published, consumer
# handled), nothing ran as a superuser and mallory is an ordinary role.
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
my $in_topic = 'sec.sp.in.v1';
my $out_topic = 'sec.sp.out.v1';
my $consumer = 'mallory-sp';

my $node = mallory_node('sec_search_path', $mock, topics => { $in_topic => 1 }, relays => 1);

sub q1 { $node->safe_psql('postgres', $_[0]) }

q1(q{
	CREATE ROLE dbo LOGIN;
	ALTER DATABASE postgres OWNER TO dbo;
	GRANT EXECUTE ON FUNCTION obx.enqueue(text, text, jsonb, text, text, jsonb, uuid) TO dbo;
	GRANT USAGE ON SCHEMA obx TO dbo;
});

# 1. The handler's session-wide search_path.
$node->safe_psql('postgres', q{
	SET ROLE mallory;
	CREATE TABLE mallory.seen (event_id text, who name, path text);
	CREATE FUNCTION mallory.now() RETURNS timestamptz
	LANGUAGE plpgsql AS $$
	BEGIN
		PERFORM public.pwn('mallory.now');
		RETURN pg_catalog.now();
	END $$;
	CREATE FUNCTION mallory.to_regclass(text) RETURNS regclass
	LANGUAGE plpgsql AS $$
	BEGIN
		PERFORM public.pwn('mallory.to_regclass');
		RETURN pg_catalog.to_regclass($1);
	END $$;
});
subscribe($node, $consumer, [$in_topic], handler($node, 'mallory.h', q{
		INSERT INTO mallory.seen VALUES (e.event_id, current_user,
			pg_catalog.current_setting('search_path'));
		PERFORM pg_catalog.set_config('search_path', 'mallory, pg_catalog', false);},
	as => 'mallory'), as => 'mallory');

sub consume_round
{
	my ($n, $what) = @_;
	produce($mock, $in_topic,
		map { { partition => 0, key => "k$_", headers => [ event_id => "$what-$_" ],
			payload => qq({"n": $_}) } } 1 .. $n);
	wait_caught_up($node, $consumer, $in_topic, partition_ends($mock, $in_topic), $what);
	return;
}

sub publish_round
{
	my ($n, $what) = @_;
	$node->safe_psql('postgres', qq{
		SET ROLE dbo;
		SELECT obx.enqueue('$out_topic', 'k' || i, pg_catalog.jsonb_build_object('n', i, 'what', '$what'))
		  FROM pg_catalog.generate_series(1, $n) i});
	all_published($node) or die "the relay did not publish $what";
	return;
}

consume_round(3, 'handler-path');
# The worker's statements after the handler ran: the progress of each
# message, the watermarks (every second), the extension check (every
# poll); and events the relay publishes meanwhile.
my $t0 = q1('SELECT pg_catalog.clock_timestamp()');
consume_round(2, 'handler-path-after');
ok($node->poll_query_until('postgres', qq{
	SELECT pg_catalog.max(watermarks_at) > '$t0' FROM obx.consumer_partitions
	 WHERE consumer_name = '$consumer'}), 'the consumer worker recorded watermarks after the handler ran');
publish_round(5, 'handler-path');
is(q1(q{SELECT pg_catalog.count(*) || ' ' || pg_catalog.string_agg(DISTINCT who || ' ' || path, ',')
		  FROM mallory.seen}),
	'5 mallory pg_catalog, pg_temp',
	'the handler ran five times, as mallory, with search_path pg_catalog, pg_temp every time');
no_escalation($node, 'a handler setting search_path');

# 2. ALTER DATABASE ... SET search_path by the database owner.
$node->safe_psql('postgres', q{
	SET ROLE dbo;
	CREATE SCHEMA evil;
	GRANT USAGE ON SCHEMA evil TO PUBLIC;
	CREATE FUNCTION evil.now() RETURNS timestamptz
	LANGUAGE plpgsql AS $$
	BEGIN
		PERFORM public.pwn('evil.now');
		RETURN pg_catalog.now();
	END $$;
	CREATE FUNCTION evil.to_regclass(text) RETURNS regclass
	LANGUAGE plpgsql AS $$
	BEGIN
		PERFORM public.pwn('evil.to_regclass');
		RETURN pg_catalog.to_regclass($1);
	END $$;
	CREATE FUNCTION evil.make_interval(secs double precision) RETURNS interval
	LANGUAGE plpgsql AS $$
	BEGIN
		PERFORM public.pwn('evil.make_interval');
		RETURN pg_catalog.make_interval(secs => secs);
	END $$;
	ALTER DATABASE postgres SET search_path = evil, pg_catalog;
});
$node->restart;
relay_ready($node, 1);
wait_consumer_pids($node, 1);
consume_round(3, 'database-path');
publish_round(5, 'database-path');
no_escalation($node, 'ALTER DATABASE ... SET search_path');

# 3. Shadowing in public, with the default search_path.
$node->safe_psql('postgres', q{
	SET ROLE dbo;
	ALTER DATABASE postgres RESET search_path;
	CREATE FUNCTION public.unnest(a text[]) RETURNS SETOF text
	LANGUAGE plpgsql AS $$
	BEGIN
		PERFORM public.pwn('public.unnest');
		RETURN QUERY SELECT pg_catalog.unnest(a);
	END $$;
	CREATE FUNCTION public.concat_ws(text, text, oid, oid, text, boolean) RETURNS text
	LANGUAGE plpgsql AS $$
	BEGIN
		PERFORM public.pwn('public.concat_ws');
		RETURN pg_catalog.concat_ws($1, $2, $3, $4, $5, $6);
	END $$;
});
$node->restart;
relay_ready($node, 1);
wait_consumer_pids($node, 1);
consume_round(3, 'public-path');
publish_round(5, 'public-path');
no_escalation($node, 'functions shadowed in schema public');

is(q1(q{SELECT pg_catalog.count(*) FROM mallory.seen}), '11',
	'every message reached the handler once');
is(q1(qq{SELECT pg_catalog.count(*) FROM obx.outbox_events WHERE topic = '$out_topic'
		   AND published_at IS NOT NULL}), '15', 'every event was published');

done_testing();
