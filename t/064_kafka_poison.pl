# Poison from a real broker (Apache Kafka, SASL_SSL, ACLs enforced): events
# the broker itself refuses, for good, are quarantined with the broker's
# error class after one attempt while every other key and topic flows;
# once the cause is removed on the broker, obx.retry_quarantined publishes
# them, and the broker holds exactly the committed set, in order per key.
#
# (a) An event over the topic's max.message.bytes (10000 here): librdkafka's
#     own limit (message.max.bytes = 1000000) lets it go, the broker answers
#     MSG_SIZE_TOO_LARGE.  The broker refuses the whole record batch, so
#     small events of other keys sent with it to the same partition get
#     that error too; they must not be quarantined but sent again (the
#     topic has one partition and all go in one transaction, so they share
#     the poison's batch).  The same payload on a topic with the default
#     limit is published: the refusal is the broker's, not librdkafka's.
# (b) A topic the producer's user may not write (an ACL denies User:obx
#     Write on it): TOPIC_AUTHORIZATION_FAILED.
# The fix: raise the topic's max.message.bytes (kafka-configs) and remove
# the ACL (kafka-acls).
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use ObxSecure;
use PostgreSQL::Test::Utils;
use Test::More;

my $limited = 'limits.v1';
my $forbidden = 'forbidden.v1';
my $open = 'open.v1';
my $nworkers = 2;

my $kafka = start_kafka(secure => 1);
kafka_cluster($kafka, 'topic', $limited, 1, 'max.message.bytes=10000');
kafka_cluster($kafka, 'topic', $forbidden, 3);
kafka_cluster($kafka, 'topic', $open, 3);
kafka_cluster($kafka, 'acl', '--add', '--deny-principal', 'User:obx',
	'--operation', 'Write', '--topic', $forbidden);

# obx.max_attempts stays at its default (10): a quarantine after one
# failure means the error was classified permanent.
my $node = obx_node('poison_real', { bootstrap => $kafka->{secure_bootstrap} },
	'obx.workers' => $nworkers,
	'obx.consumer_workers' => 0,
	'obx.delivery_timeout' => "'10s'");
set_kafka_credentials($node, sasl_ssl_properties($kafka, 'message.max.bytes' => '1000000'));

sub q1 { $node->safe_psql('postgres', $_[0]) }
sub in_list { join(',', map { "'$_'" } @_) }

my %label;    # event id => label
my $poison_payload = q{jsonb_build_object('poison', true, 'blob', repeat('x', 50000))};

# events($sql): statements returning rows "label|event id"; returns a hash
# label => id.
sub events
{
	my ($sql) = @_;
	my %ids;
	for my $line (split /\n/, q1($sql))
	{
		my ($l, $id) = split /\|/, $line;
		$ids{$l} = $id;
		$label{$id} = $l;
	}
	return \%ids;
}

sub enq
{
	my ($label, $t, $key, $payload) = @_;
	$payload //= "jsonb_build_object('label', '$label')";
	return "SELECT '$label', obx.enqueue('$t', '$key', $payload);\n";
}

my $filler_no = 0;
sub fillers
{
	my ($n) = @_;
	my $sql = '';
	for (1 .. $n)
	{
		$filler_no++;
		$sql .= enq("o$filler_no", $open, 'open_' . (1 + $filler_no % 5));
	}
	return events($sql);
}

# Every event but the given ones is published (claims go in seq order, so
# once later events are out, a held one would be too had it been claimable).
sub all_published_except
{
	my ($what, @held) = @_;
	return ok($node->poll_query_until('postgres', qq{
		SELECT count(*) = 0 FROM obx.outbox_events
		 WHERE published_at IS NULL AND id NOT IN (@{[ in_list(@held) ]})}), $what);
}

sub quarantined
{
	my ($id) = @_;
	# failures counts the attempts that failed with a permanent or other
	# error, not transient ones (a producer rebuilt under a batch purges it
	# with _DESTROY, transient, which is an attempt but no failure).
	return q1(qq{SELECT last_error_class || ' ' || failures || ' ' || last_error
		FROM obx.outbox_events WHERE id = '$id' AND quarantined_at IS NOT NULL});
}

sub broker_order
{
	my ($t, @ids) = @_;
	my %want = map { $_ => 1 } @ids;
	my (@order, %seen);
	for my $m (sort { $a->{partition} <=> $b->{partition} || $a->{offset} <=> $b->{offset} }
		@{ read_topic($kafka, $t) })
	{
		next unless $want{ $m->{event_id} } && !$seen{ $m->{event_id} }++;
		push @order, $label{ $m->{event_id} };
	}
	return join(' ', @order);
}

############################################################################
# (a) Over the topic's max.message.bytes.
############################################################################
my $offset = -s $node->logfile;
my $ea = events("BEGIN;\n"
	  . enq('L1', $limited, 'lim_1')
	  . enq('L2', $limited, 'lim_2')
	  . enq('P1', $limited, 'big_1', $poison_payload)
	  . enq('L3', $limited, 'lim_3')
	  . enq('P2', $limited, 'big_1')
	  . enq('L4', $limited, 'lim_1')
	  . enq('BIG', $open, 'big_open', $poison_payload)
	  . "COMMIT;\n");
fillers(10);
ok($node->poll_query_until('postgres', "SELECT count(*) = 1 FROM obx.quarantine WHERE id = '$ea->{P1}'"),
	'the event over the topic\'s max.message.bytes is quarantined');
all_published_except('every other event is published, other keys of its partition included', $ea->{P1}, $ea->{P2});
like(quarantined($ea->{P1}), qr/^permanent 1 MSG_SIZE_TOO_LARGE: Broker: Message size too large$/,
	'quarantined: class permanent after one failure, the broker\'s MSG_SIZE_TOO_LARGE (not refused by librdkafka)');
is(q1(qq{SELECT count(*) FROM obx.quarantine WHERE topic = '$limited'}), '1',
	'only the oversized event is quarantined, none of the events refused in its batch');
is(q1(qq{SELECT published_at IS NULL AND quarantined_at IS NULL AND last_error IS NULL
		   FROM obx.outbox_events WHERE id = '$ea->{P2}'}),
	't', 'the later event of its key waits, never failed');
ok(slurp_file($node->logfile, $offset)
	  =~ /obx relay \d+: \d+ events? refused by the broker with a larger one \(MSG_SIZE_TOO_LARGE\)/,
	'the events refused together with it were sent again (the log says so)');
is(q1("SELECT published_at IS NOT NULL FROM obx.outbox_events WHERE id = '$ea->{BIG}'"), 't',
	'the same payload on a topic with the default limit is published: librdkafka let it go');
{
	my $seen = event_ids_at_broker(read_topic($kafka, $limited));
	is(join(' ', map { $label{$_} // '?' } sort { $label{$a} cmp $label{$b} } keys %$seen), 'L1 L2 L3 L4',
		"$limited at the broker: the other keys' events, not the poison nor its key's later event");
	is(broker_order($limited, map { $ea->{$_} } qw(L1 L4)), 'L1 L4', 'key lim_1 in enqueue order');
}

############################################################################
# (b) A topic the producer may not write.
############################################################################
my $eb = events("BEGIN;\n"
	  . enq('S1', $forbidden, 'sec_1')
	  . enq('S2', $forbidden, 'sec_2')
	  . "COMMIT;\n");
fillers(10);
ok($node->poll_query_until('postgres', qq{
	SELECT count(*) = 2 FROM obx.quarantine WHERE id IN (@{[ in_list($eb->{S1}, $eb->{S2}) ]})}),
	'the events of the topic User:obx may not write are quarantined');
like(quarantined($eb->{S1}), qr/^permanent 1 TOPIC_AUTHORIZATION_FAILED: /,
	'quarantined: class permanent after one failure, the broker\'s TOPIC_AUTHORIZATION_FAILED');
$eb = { %$eb, %{ events(enq('S3', $forbidden, 'sec_1')) } };
fillers(10);
all_published_except('other topics flow meanwhile', $ea->{P1}, $ea->{P2}, $eb->{S1}, $eb->{S2}, $eb->{S3});
is(q1("SELECT published_at IS NULL AND quarantined_at IS NULL FROM obx.outbox_events WHERE id = '$eb->{S3}'"),
	't', 'the later event of key sec_1 waits');
is(scalar(keys %{ event_ids_at_broker(read_topic($kafka, $forbidden)) }), 0,
	"$forbidden holds nothing");
is(q1(q{SELECT string_agg(topic || ' ' || quarantined, ', ' ORDER BY topic) FROM obx.status WHERE quarantined > 0}),
	"$forbidden 2, $limited 1", 'obx.status counts the quarantined events per topic');
like(q1(q{SELECT string_agg(last_error, ' | ') FROM obx.workers}),
	qr/MSG_SIZE_TOO_LARGE|TOPIC_AUTHORIZATION_FAILED/, 'obx.workers shows a broker error');

############################################################################
# The fix on the broker, then obx.retry_quarantined.
############################################################################
kafka_cluster($kafka, 'config', '--alter', '--entity-type', 'topics', '--entity-name', $limited,
	'--add-config', 'max.message.bytes=1000000');
kafka_cluster($kafka, 'acl', '--remove', '--force', '--deny-principal', 'User:obx',
	'--operation', 'Write', '--topic', $forbidden);

# The brokers apply both changes within moments, not at once: an event
# retried too early is refused and quarantined again, and is retried again.
my $retries = 0;
wait_until(sub {
	$retries += q1("SELECT obx.retry_quarantined('$_')") for ($limited, $forbidden);
	q1('SELECT count(*) = 0 FROM obx.outbox_events WHERE published_at IS NULL') eq 't';
}, 'every retried event to be published');
ok($retries >= 3, "obx.retry_quarantined made the three quarantined events publishable ($retries retries)");
is(q1('SELECT count(*) FROM obx.quarantine'), '0', 'the quarantine is empty');

for my $t ($limited, $forbidden, $open)
{
	my @ids = split /\n/, q1("SELECT id FROM obx.outbox_events WHERE topic = '$t'");
	broker_holds_exactly($kafka, $node, $t, \@ids, "topic = '$t'");
}
is(broker_order($limited, $ea->{P1}, $ea->{P2}), 'P1 P2', 'key big_1: the retried poison, then its later event');
is(broker_order($forbidden, $eb->{S1}, $eb->{S3}), 'S1 S3', 'key sec_1: the retried event, then its later one');

done_testing();
