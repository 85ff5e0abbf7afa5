# Contract evolution: version 2 of an event adds an optional field;
# producers on version 1 and on version 2 publish side by side, and one
# handler handles both, in order per key, with nothing dead-lettered.  The
# seed: "evolve by adding optional fields and test old event versions".
#
# Also what the handler is given: every field of obx.inbound_event is
# checked against the message at the broker (event id from the event_id
# header, or from the payload's eventId; event type from the event_type
# header, or from the payload's eventType; topic, partition, offset, key,
# headers, payload, timestamp), for events sent through obx's outbox and
# for one from another producer; and the handler runs as the role that
# owns the subscription.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use ObxConsumer;
use PostgreSQL::Test::Utils;
use Test::More;

my $mock = start_mock();
my $topic = 'stock.sv.v1';
my $consumer = 'stock-sv';

my $node = consumer_node('consumer_schema_versions', $mock, topics => { $topic => 4 },
	relays => 1);

sub q1 { $node->safe_psql('postgres', $_[0]) }

q1(q{
	CREATE TABLE shop.reservations (
		n bigserial PRIMARY KEY,
		event_id text NOT NULL,
		order_id text NOT NULL,
		sku text NOT NULL,
		qty integer NOT NULL,
		warehouse text NOT NULL,
		schema_version integer NOT NULL);
});
# StockReserved, version 1: orderId, sku, qty.  Version 2 adds the
# optional "warehouse" (absent: the main warehouse).  Unknown fields are
# ignored; an unknown version is refused.
my $reserve = handler($node, 'shop.reserve', q{
		PERFORM nextval('shop.handler_calls');
		IF e.event_type IS DISTINCT FROM 'StockReserved' THEN
			RAISE EXCEPTION 'unexpected event type %', e.event_type;
		END IF;
		IF v IS NULL OR v NOT IN (1, 2) THEN
			RAISE EXCEPTION 'unsupported schemaVersion %', v;
		END IF;
		INSERT INTO shop.reservations (event_id, order_id, sku, qty, warehouse, schema_version)
		VALUES (e.event_id, e.payload->>'orderId', e.payload->>'sku',
				(e.payload->>'qty')::integer, coalesce(e.payload->>'warehouse', 'main'), v);
		PERFORM shop.record(e);},
	declare => q{		v integer := (e.payload->>'schemaVersion')::integer;});
# The handler runs as the subscription's owner: an application role with
# rights on its own tables only, not the superuser the workers connect as.
# That role subscribes (the owner is whoever writes the subscription).
q1(q{
	CREATE ROLE shop_app;
	GRANT USAGE ON SCHEMA shop TO shop_app;
	GRANT INSERT ON shop.effects, shop.reservations TO shop_app;
	GRANT USAGE ON ALL SEQUENCES IN SCHEMA shop TO shop_app;
	GRANT USAGE ON SCHEMA obx TO shop_app;
	GRANT EXECUTE ON FUNCTION obx.subscribe(text, text[], regprocedure, jsonb) TO shop_app;
});
subscribe($node, $consumer, [$topic], $reserve, as => 'shop_app');
is(q1("SELECT owner::text FROM obx.subscriptions WHERE consumer_name = '$consumer'"),
	'shop_app', 'the subscription is owned by the role that made it');

# Through the outbox: both versions, interleaved on keys ord_1 and ord_3.
my @ids = split /\n/, q1(qq{
	SELECT obx.enqueue('$topic', 'ord_1',
		'{"eventType": "StockReserved", "schemaVersion": 1, "orderId": "ord_1", "sku": "sku-1", "qty": 1}',
		event_type => 'StockReserved');
	SELECT obx.enqueue('$topic', 'ord_1',
		'{"eventType": "StockReserved", "schemaVersion": 2, "orderId": "ord_1", "sku": "sku-2", "qty": 2, "warehouse": "berlin"}',
		event_type => 'StockReserved');
	SELECT obx.enqueue('$topic', 'ord_2',
		'{"eventType": "StockReserved", "schemaVersion": 2, "orderId": "ord_2", "sku": "sku-3", "qty": 3}',
		event_type => 'StockReserved', headers => '{"trace_id": "trace-2"}');
	SELECT obx.enqueue('$topic', 'ord_3',
		'{"eventType": "StockReserved", "schemaVersion": 2, "orderId": "ord_3", "sku": "sku-4", "qty": 4, "warehouse": "lyon", "giftWrap": true}',
		event_type => 'StockReserved');
	SELECT obx.enqueue('$topic', 'ord_3',
		'{"eventType": "StockReserved", "schemaVersion": 1, "orderId": "ord_3", "sku": "sku-5", "qty": 5}',
		event_type => 'StockReserved');
});
is(scalar(@ids), 5, 'five events enqueued');
ok(all_published($node), 'the relay published them');

# Another producer, still on version 1, with neither header: the id and
# the type are in the payload.
produce($mock, $topic,
	{ partition => 3, key => 'ord_4',
	  payload => '{"eventId": "evt-sv-old", "eventType": "StockReserved", "schemaVersion": 1, "orderId": "ord_4", "sku": "sku-6", "qty": 6}' });

wait_caught_up($node, $consumer, $topic, partition_ends($mock, $topic), 'both versions');

is(q1(q{SELECT string_agg(order_id || ' ' || sku || ' ' || qty || ' ' || warehouse || ' v' || schema_version,
						  ', ' ORDER BY order_id, n)
		  FROM shop.reservations}),
	'ord_1 sku-1 1 main v1, ord_1 sku-2 2 berlin v2, ord_2 sku-3 3 main v2, '
	  . 'ord_3 sku-4 4 lyon v2, ord_3 sku-5 5 main v1, ord_4 sku-6 6 main v1',
	'one handler applied versions 1 and 2, the optional field present or not, each once, in order per key');
is_deeply(effects_per_event($node), { map { $_ => 1 } @ids, 'evt-sv-old' },
	'every event has its effect once');
my $t = consumer_totals($node, $consumer, $topic);
is("$t->{processed} $t->{duplicates} $t->{dead_lettered} $t->{retries}", '6 0 0 0',
	'six processed, nothing duplicated, dead-lettered or retried');
is(handler_calls($node), '6', 'the handler ran once per event');
is(q1('SELECT string_agg(DISTINCT applied_by, \' \') FROM shop.effects'), 'shop_app',
	'the handler ran as the subscription\'s owner');
is(q1(qq{SELECT count(*) FROM obx.dead_letters WHERE consumer_name = '$consumer'}), '0',
	'no dead letters');

# The event as the handler saw it, against the message at the broker.
my $msgs = read_topic($mock, $topic);
is(scalar(@$msgs), 6, 'six messages at the broker');
for my $m (@$msgs)
{
	my $old = !defined $m->{event_id};
	my $id = $old ? 'evt-sv-old' : $m->{event_id};
	my $headers = $old ? '{}'
	  : $m->{key} eq 'ord_2'
	  ? qq{{"event_id": "$id", "event_type": "StockReserved", "trace_id": "trace-2"}}
	  : qq{{"event_id": "$id", "event_type": "StockReserved"}};
	is(q1(qq{
		SELECT event_id, event_type, topic, event_key,
			   headers = '$headers'::jsonb, payload = \$j\$$m->{payload}\$j\$::jsonb,
			   kafka_timestamp BETWEEN now() - interval '10 minutes' AND now()
		  FROM shop.effects WHERE kafka_partition = $m->{partition} AND kafka_offset = $m->{offset}}),
		"$id|StockReserved|$topic|$m->{key}|t|t|t",
		"the handler got partition $m->{partition} offset $m->{offset} ($m->{key}) as it is at the broker"
		  . ($old ? ', id and type from the payload' : ''));
}

done_testing();
