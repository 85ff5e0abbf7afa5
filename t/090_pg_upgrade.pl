# PostgreSQL upgrades: obx on an older major with events in every state,
# pg_upgrade to each newer major (17 and 18), then nothing lost, nothing
# sent twice, nothing run while pg_upgrade worked:
#   - events pending at the upgrade (the brokers down) are published
#     afterwards, each with its old event_id, in enqueue order per key;
#   - events published before keep where they landed and are not sent
#     again;
#   - a quarantined event is still quarantined with its error, and
#     obx.retry publishes it with its old event_id;
#   - a dead letter is still there; dedupe history (obx.mark_processed,
#     and a message the consumer applied before) still refuses a duplicate;
#   - no obx worker started in either server pg_upgrade ran in
#     binary-upgrade mode.
#
# The majors come from scripts/deps.sh (obx_install_pg_majors) with obx
# installed into them, as test/run-all does; OBX_PG_ROOT says where.
# Without OBX_PG_ROOT the test is skipped; with it, a missing major fails.
#
# The old cluster is 14 (OBX_UPGRADE_FROM), not Debian's 15: why is in
# docs/operations.md, "Upgrading PostgreSQL (pg_upgrade)", step 1.
use strict;
use warnings;

use Cwd qw(abs_path);
use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use ObxConsumer;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

plan skip_all => 'OBX_PG_ROOT is not set: no other major to upgrade with (test/run-all sets it)'
  unless $ENV{OBX_PG_ROOT};
my $from = $ENV{OBX_UPGRADE_FROM} // 14;
my @targets = split ' ', ($ENV{OBX_UPGRADE_TO} // '17 18');
my $from_install = "$ENV{OBX_PG_ROOT}/$from";
# The version CREATE EXTENSION installs on the old server, and pg_upgrade keeps.
my ($extversion) = slurp_file("$FindBin::RealBin/../obx.control") =~ /^default_version = '([^']+)'/m;

my $mock = start_mock();

# ids($node, $sql): the first column of each row.
sub ids
{
	my ($node, $sql) = @_;
	return [ grep { length } split /\n/, $node->safe_psql('postgres', $sql) ];
}

sub in_list { return join(', ', map { "'$_'" } @_) }

# Everything the old server holds before the upgrade, in every state.
sub fill_old
{
	my ($to) = @_;
	my %t = (pub => "up$to.published", pend => "up$to.pending", big => "up$to.quarantined",
		in => "up$to.stock");
	create_topic($mock, $_, 2) for values %t;
	my $old = obx_node_at("old_$to", $mock, $from_install,
		'obx.workers' => 2,
		'obx.consumer_workers' => 1,
		'obx.kafka_properties' => "'message.max.bytes=20000'");
	relay_ready($old, 2);
	wait_consumer_pids($old, 1);
	create_effects($old);

	# Published before the upgrade.
	for my $i (1 .. 6)
	{
		$old->safe_psql('postgres',
			"SELECT obx.enqueue('$t{pub}', 'ord_" . ($i % 2) . "', '{\"n\": $i}')");
	}
	ok(all_published($old), "$from -> $to: events published before the upgrade");

	# Quarantined: larger than the producer's message.max.bytes.
	my $big = $old->safe_psql('postgres',
		"SELECT obx.enqueue('$t{big}', 'q', jsonb_build_object('pad', repeat('x', 30000)))");
	$old->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM obx.quarantine WHERE id = '$big'")
	  or die "the large event was not quarantined";

	# Consumer side: one message applied, one dead-lettered, one manual mark.
	subscribe($old, "up$to", [ $t{in} ], handler($old, 'shop.reserve', q{
		IF e.payload->>'sku' IS NULL THEN
			RAISE EXCEPTION 'missing required field sku';
		END IF;
		PERFORM shop.record(e);}));
	produce($mock, $t{in},
		{ partition => 0, key => 'a', headers => [ event_id => "evt-ok-$to" ],
		  payload => '{"sku": "a", "qty": 1}' },
		{ partition => 0, key => 'b', headers => [ event_id => "evt-bad-$to" ],
		  payload => '{"qty": 1}' });
	$old->poll_query_until('postgres', qq{
		SELECT (SELECT count(*) FROM shop.effects WHERE event_id = 'evt-ok-$to') = 1
		   AND (SELECT count(*) FROM obx.dead_letters WHERE event_id = 'evt-bad-$to') = 1})
	  or die "the consumer did not apply and dead-letter its two messages";
	is($old->safe_psql('postgres', "SELECT obx.mark_processed('manual', 'evt-m-$to')"), 't',
		"$from -> $to: a manual mark before the upgrade is new");

	# Pending at the upgrade: the brokers are down while they are enqueued.
	mock_cmd($mock, 'down all');
	for my $i (1 .. 30)
	{
		my $key = 'k' . ($i % 3);
		$old->safe_psql('postgres', "SELECT obx.enqueue('$t{pend}', '$key', '{\"n\": $i}')");
	}
	my %before = (
		topics => \%t,
		big => $big,
		pending => ids($old, "SELECT id FROM obx.outbox_events WHERE topic = '$t{pend}' AND published_at IS NULL ORDER BY id"),
		order => committed_ids($old, "topic = '$t{pend}'"),
		published => $old->safe_psql('postgres',
			"SELECT id, kafka_partition, kafka_offset, published_at FROM obx.outbox_events WHERE topic = '$t{pub}' ORDER BY id"),
		quarantine => $old->safe_psql('postgres',
			"SELECT id, last_error_class, last_error FROM obx.quarantine WHERE id = '$big'"),
		dead => $old->safe_psql('postgres',
			"SELECT consumer_name, topic, kafka_partition, kafka_offset, event_id, error_class, error_message FROM obx.dead_letters ORDER BY id"));
	is(scalar(@{ $before{pending} }), 30, "$from -> $to: 30 events pending at the upgrade");
	$old->stop;
	return ($old, \%before);
}

for my $to (@targets)
{
	my $install = "$ENV{OBX_PG_ROOT}/$to";
	ok(-x "$install/bin/pg_upgrade" && -f "$install/lib/obx.so"
		  && -f "$from_install/lib/obx.so",
		"PostgreSQL $from and $to with obx are installed in $ENV{OBX_PG_ROOT}")
	  or next;
	my ($old, $before) = fill_old($to);
	my %t = %{ $before->{topics} };

	# The new cluster, configured as the old one with a larger message limit.
	my $new = PostgreSQL::Test::Cluster->new("new_$to", install_path => $install);
	$new->init(extra => $to >= 18 ? ['--no-data-checksums'] : []);
	$new->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'obx'
obx.brokers = '$mock->{bootstrap}'
obx.database = 'postgres'
obx.workers = 2
obx.consumer_workers = 1
obx.poll_interval = '200ms'
obx.backoff_min = '50ms'
obx.backoff_max = '1s'
obx.kafka_properties = 'message.max.bytes=1000000'
});

	my $work = abs_path(PostgreSQL::Test::Utils::tempdir("upgrade_$to"));
	my $old_bin = "$from_install/bin";
	my $ok = IPC::Run::run([ "$install/bin/pg_upgrade", '--no-sync', '--retain',
			'-b', $old_bin, '-B', "$install/bin",
			'-d', abs_path($old->data_dir), '-D', abs_path($new->data_dir),
			'-p', $old->port, '-P', $new->port, '-s', $new->host ],
		'>', "$work/stdout", '2>', "$work/stderr", init => sub { chdir $work });
	ok($ok, "pg_upgrade $from -> $to succeeds")
	  or diag(slurp_file("$work/stdout") . slurp_file("$work/stderr"));

	# pg_upgrade's own server logs: both servers ran, no obx worker did.
	my $server_log = join('', map { slurp_file($_) }
		  grep { -f } glob(abs_path($new->data_dir) . '/pg_upgrade_output.d/*/log/pg_upgrade_server.log'));
	ok($server_log =~ /database system is ready to accept connections/,
		"$from -> $to: pg_upgrade's server log shows the servers it started");
	unlike($server_log, qr/obx launcher started|obx (?:relay|consumer) \d/,
		"$from -> $to: no obx worker started during the binary upgrade");

	$new->start;
	is($new->safe_psql('postgres', "SELECT extversion FROM pg_extension WHERE extname = 'obx'"),
		$extversion, "$from -> $to: the extension came over, at $extversion");
	like($new->safe_psql('postgres', 'SHOW server_version'), qr/^$to\./,
		"$from -> $to: the new server runs PostgreSQL $to");
	mock_cmd($mock, 'up all');

	# Pending events: published now, with their old ids, in order per key.
	my $msgs = wait_for_broker($mock, $t{pend}, sub {
		my $seen = event_ids_at_broker(shift);
		!grep { !$seen->{$_} } @{ $before->{pending} } }, "the pending events of $t{pend}");
	is_deeply([ sort keys %{ event_ids_at_broker($msgs) } ], $before->{pending},
		"$from -> $to: the broker holds exactly the events pending at the upgrade, by their old ids");
	is_deeply(first_occurrences($msgs), $before->{order},
		"$from -> $to: per key, broker order is enqueue order");

	# Published before: where they landed is kept, and none went again.
	is($new->safe_psql('postgres',
		"SELECT id, kafka_partition, kafka_offset, published_at FROM obx.outbox_events WHERE topic = '$t{pub}' ORDER BY id"),
		$before->{published}, "$from -> $to: published events keep partition, offset and time");
	my $pub = event_ids_at_broker(read_topic($mock, $t{pub}));
	is_deeply([ grep { $pub->{$_} != 1 } sort keys %$pub ], [],
		"$from -> $to: no event published before the upgrade was sent again");

	# Quarantined: still, with its error; obx.retry sends it with its id.
	is($new->safe_psql('postgres',
		"SELECT id, last_error_class, last_error FROM obx.quarantine WHERE id = '$before->{big}'"),
		$before->{quarantine}, "$from -> $to: the quarantined event keeps its error");
	is($new->safe_psql('postgres', "SELECT obx.retry('$before->{big}')"), 't',
		"$from -> $to: obx.retry takes the quarantined event");
	wait_for_broker($mock, $t{big}, sub { event_ids_at_broker(shift)->{ $before->{big} } },
		"the retried event at the broker");
	pass("$from -> $to: the retried event reached the broker with its old event_id");

	# Consumer side.
	is($new->safe_psql('postgres',
		"SELECT consumer_name, topic, kafka_partition, kafka_offset, event_id, error_class, error_message FROM obx.dead_letters ORDER BY id"),
		$before->{dead}, "$from -> $to: the dead letter is kept");
	is($new->safe_psql('postgres', "SELECT obx.mark_processed('manual', 'evt-m-$to')"), 'f',
		"$from -> $to: dedupe history refuses a mark made before the upgrade");
	produce($mock, $t{in},
		{ partition => 0, key => 'a', headers => [ event_id => "evt-ok-$to" ],
		  payload => '{"sku": "a", "qty": 1}' },
		{ partition => 0, key => 'c', headers => [ event_id => "evt-new-$to" ],
		  payload => '{"sku": "c", "qty": 1}' });
	$new->poll_query_until('postgres',
		"SELECT count(*) = 1 FROM shop.effects WHERE event_id = 'evt-new-$to'")
	  or die "the consumer on $to did not apply a new message";
	is($new->safe_psql('postgres',
		"SELECT count(*) FROM shop.effects WHERE event_id = 'evt-ok-$to'"), '1',
		"$from -> $to: a message applied before the upgrade, delivered again, is a duplicate");
	$new->stop;
}

done_testing();
