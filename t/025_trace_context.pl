# Trace context (W3C traceparent / tracestate) and CloudEvents headers,
# end to end: what enqueue stores is what the Kafka record carries, and
# what the in-database consumer hands to its handler.
#
#  1. obx.traceparent / obx.tracestate set with SET LOCAL reach the broker
#     as the record's traceparent and tracestate headers, next to the
#     caller's own headers; an event of the same transaction enqueued
#     after RESET carries none; a traceparent in the headers argument wins
#     over the setting.
#  2. A handler of the in-database consumer gets the traceparent in
#     e.headers, exactly as it was sent.
#  3. With obx.cloudevents = on the relay adds the CloudEvents binary-mode
#     headers: ce_specversion 1.0, ce_id = the event id, ce_type = the
#     event type, ce_source = obx.cloudevents_source, ce_time = occurred_at
#     in RFC 3339, content-type application/json (none for a tombstone); an
#     event without a type gets the topic as ce_type.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use ObxConsumer;
use PostgreSQL::Test::Utils;
use Test::More;

my $mock = start_mock();
my $topic = 'orders.traced.v1';
my $node = consumer_node('trace', $mock, topics => { $topic => 2 },
	relays => 1, consumers => 1);

sub q1 { $node->safe_psql('postgres', $_[0]) }

my $tp1 = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
# One list member: read_topic splits kcat's header list at commas.
my $ts1 = 'congo=t61rcWkgMzE';
my $tp2 = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00';

subscribe($node, 'trace-reader', [$topic],
	handler($node, 'shop.read_trace', q{PERFORM shop.record(e);}));

############################################################################
# 1. The broker gets the trace context.
############################################################################
my ($a, $b, $c) = split /\n/, q1(qq{
	BEGIN;
	SET LOCAL obx.traceparent = '$tp1';
	SET LOCAL obx.tracestate = '$ts1';
	SELECT obx.enqueue('$topic', 'ord-1', '{"n": 1}', headers => '{"tenant": "acme"}');
	SELECT obx.enqueue('$topic', 'ord-1', '{"n": 2}',
		headers => '{"traceparent": "$tp2"}');
	RESET obx.traceparent;
	RESET obx.tracestate;
	SELECT obx.enqueue('$topic', 'ord-1', '{"n": 3}');
	COMMIT;});

my $msgs = wait_for_broker($mock, $topic,
	sub { my %ids = map { $_->{event_id} => 1 } @{ $_[0] }; $ids{$a} && $ids{$b} && $ids{$c} },
	'the three events at the broker');
my %by_id = map { $_->{event_id} => $_ } @$msgs;
is($by_id{$a}{headers}{traceparent}, $tp1, 'obx.traceparent is the record\'s traceparent header');
is($by_id{$a}{headers}{tracestate}, $ts1, 'obx.tracestate is the record\'s tracestate header');
is($by_id{$a}{headers}{tenant}, 'acme', 'the caller\'s own header is still there');
is($by_id{$b}{headers}{traceparent}, $tp2, 'a traceparent in the headers argument wins over the setting');
ok(!exists $by_id{$b}{headers}{tracestate}, 'and the setting\'s tracestate does not go with it');
ok(!exists $by_id{$c}{headers}{traceparent} && !exists $by_id{$c}{headers}{tracestate},
	'after RESET an event carries no trace context');

############################################################################
# 2. The handler gets it.
############################################################################
ok($node->poll_query_until('postgres',
	"SELECT count(DISTINCT event_id) = 3 FROM shop.effects WHERE event_id IN ('$a', '$b', '$c')"),
	'the consumer handled the three events');
is(q1("SELECT headers->>'traceparent' || ' ' || (headers->>'tracestate') FROM shop.effects WHERE event_id = '$a'"),
	"$tp1 $ts1", 'the handler gets traceparent and tracestate in e.headers');
is(q1("SELECT headers->>'traceparent' FROM shop.effects WHERE event_id = '$b'"),
	$tp2, 'the handler gets the traceparent of the headers argument');
is(q1("SELECT count(*) FROM shop.effects WHERE event_id = '$c' AND headers ? 'traceparent'"),
	'0', 'and none for the event without trace context');

ok(!grep({ exists $_->{headers}{ce_id} } @$msgs), 'obx.cloudevents off: no CloudEvents headers');

############################################################################
# 3. CloudEvents binary mode.
############################################################################
$node->append_conf('postgresql.conf',
	"obx.cloudevents = on\nobx.cloudevents_source = '//shop.example/orders'\n");
$node->restart;
relay_ready($node, 1);
my ($typed, $untyped, $tomb) = split /\n/, q1(qq{
	SELECT obx.enqueue('$topic', 'ord-2', '{"n": 4}', event_type => 'OrderPlaced');
	SELECT obx.enqueue('$topic', 'ord-2', '{"n": 5}');
	SELECT obx.enqueue_tombstone('$topic', 'ord-2', event_type => 'OrderDeleted');});
$msgs = wait_for_broker($mock, $topic,
	sub { my %ids = map { $_->{event_id} => 1 } @{ $_[0] }; $ids{$typed} && $ids{$untyped} && $ids{$tomb} },
	'the CloudEvents events at the broker');
%by_id = map { $_->{event_id} => $_ } @$msgs;
my $h = $by_id{$typed}{headers};
my $time = q1(qq{SELECT to_char(occurred_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
				   FROM obx.outbox_events WHERE id = '$typed'});
is_deeply([ @$h{qw(ce_specversion ce_id ce_type ce_source ce_time content-type)} ],
	[ '1.0', $typed, 'OrderPlaced', '//shop.example/orders', $time, 'application/json' ],
	'ce_specversion, ce_id (event id), ce_type (event type), ce_source, ce_time (occurred_at, RFC 3339), content-type');
is($by_id{$untyped}{headers}{ce_type}, $topic, 'an event without a type: ce_type is the topic');
is($by_id{$tomb}{headers}{ce_id}, $tomb, 'a tombstone carries the CloudEvents headers');
ok(!exists $by_id{$tomb}{headers}{'content-type'}, 'but no content-type: it has no value');

done_testing();
