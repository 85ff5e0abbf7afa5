# The Laravel example (examples/laravel), end to end: orders placed in
# database shop by Eloquent inside DB::transaction, their OrderPlaced event
# dispatched with event(...) and enqueued by the obx/laravel package
# (clients/laravel), relayed to Kafka by obx's relay, consumed in database
# inventory by obx's consumer, which runs inventory.reserve_stock once per
# event id; the package's migration helpers create the extension and the
# subscription, and its obx:status and obx:quarantine commands report.
#
# One cluster: two relay and two consumer workers, restart_after_crash = on;
# the subscription commits offsets only every hour
# (auto.commit.interval.ms=3600000), so what was handled before the crash
# is delivered again after it.
#
# Once a first order is reserved (the consumer group has its partitions),
# six PHP processes place 50 orders each at the same time, two emitting
# OrderPlaced schemaVersion 1 and four schemaVersion 2; every seventh order
# of each is rolled back on purpose after its event was enqueued (payment
# declined).  Each holds after 25 orders until the consumer has reserved
# stock for some of them; as they resume, an 'obx consumer' backend is
# killed with SIGKILL and the whole instance goes through crash recovery (the PHP
# processes lose their connections and look up whether their last order
# committed).  Afterwards one already-processed message is produced to the
# topic a second time, with the same event_id header, key and payload.
#
# Then the PHP consumer: stock moves (topic stock.moves.v1, 4 skus x 30
# moves, keyed by sku, one of them sent twice, one with a negative quantity)
# produced through the Kafka stand-in are landed in obx.landed by obx's
# consumer (handler obx.land) and applied by three `obx:work` processes
# running App\Listeners\ApplyStockMove; one of them is killed (SIGKILL)
# inside the listener, after its write and before its commit.
#
# Proves: the shop holds exactly the orders PHP saw commit, and the outbox
# exactly their events, all published with their keys and headers;
# rolled-back orders leave no order, no event and no reservation; every
# committed order's lines are reserved exactly once, in the warehouse its
# schema version says, and the stock counters equal the sum of committed
# quantities; the dedupe history holds exactly the committed event ids; the
# forced re-delivery is counted as a duplicate and reserves nothing; nothing
# is dead-lettered, lag is 0; obx:status, obx:status --consumers and
# obx:quarantine agree. In PHP: every move but the poison is applied exactly
# once (the killed worker's write rolled back, the duplicate never landed),
# each sku's moves one after another in order (each saw the previous one
# committed), balances = sums; the poison is dead-lettered after its tries,
# its sku goes on, and a replay after fixing it lands it again and obx:work
# applies it once. Each check compares sets or counts; deleting
# obx.processed_events right after the crash (a dedupe that forgets) makes
# five of them fail.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $topic = 'orders.placed.v1';
my $consumer = 'inventory-reservation';
my $artisan = "$FindBin::RealBin/../examples/laravel/artisan-like";
my $producers = 6;
my $orders_each = 50;
my $rollback_every = 7;
my %version_of_producer = map { $_ => ($_ < 2 ? 1 : 2) } 0 .. $producers - 1;

my $t0 = time();
my $mock = start_mock();
# Consumers do not create topics; the relay's producer would, on its first
# event.  Create it now so the subscription finds it whenever it starts.
mock_cmd($mock, "topic-create $topic 4");
my $moves_topic = 'stock.moves.v1';
my $moves_consumer = 'inventory-moves';
mock_cmd($mock, "topic-create $moves_topic 3");

my $node = obx_node('laravel', $mock,
	'obx.database' => "'shop'",
	'obx.consumer_database' => "'inventory'",
	'obx.workers' => 2,
	'obx.consumer_workers' => 2,
	'restart_after_crash' => 'on',
	'max_connections' => 40);
# The workers wait (and restart) until these exist and hold the extension.
$node->safe_psql('postgres', 'CREATE DATABASE shop');
$node->safe_psql('postgres', 'CREATE DATABASE inventory');

# The PHP application connects over the node's Unix socket.
$ENV{DB_HOST} = $node->host;
$ENV{DB_PORT} = $node->port;
$ENV{DB_USERNAME} = (getpwuid($>))[0];
$ENV{DB_PASSWORD} = '';
$ENV{SHOP_DATABASE} = 'shop';
$ENV{INVENTORY_DATABASE} = 'inventory';
$ENV{ORDERS_TOPIC} = $topic;
$ENV{INVENTORY_CONSUMER} = $consumer;
$ENV{MOVES_TOPIC} = $moves_topic;
$ENV{MOVES_CONSUMER} = $moves_consumer;
# Offsets reach Kafka only on a rebalance, never on a timer: whatever the
# consumer handled before the crash comes again after it, and must be
# recognized as already processed.  A short session timeout lets the group
# drop the killed members sooner.
$ENV{INVENTORY_KAFKA_PROPERTIES} = 'auto.commit.interval.ms=3600000;session.timeout.ms=6000';

# artisan(@args): run the example's console; returns its stdout.
sub artisan
{
	my @args = @_;
	my ($out, $err) = ('', '');
	my $ok = IPC::Run::run([ 'php', $artisan, @args ], '<', \undef, '>', \$out, '2>', \$err,
		IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
	ok($ok, "artisan-like @args") or diag("stdout:\n$out\nstderr:\n$err");
	return $out;
}

# rows($db, $sql): the rows of a query as lists of columns.
sub rows
{
	my ($db, $sql) = @_;
	return [ map { [ split /\|/, $_, -1 ] } grep { length } split /\n/, $node->safe_psql($db, $sql) ];
}

# Migrations: shop (obx, orders), inventory (obx, stock, the handler, the
# subscription); then the initial stock.
my $migrated = artisan('migrate');
like($migrated, qr/Migrated:\s+2026_01_05_000001_create_orders_tables/, 'shop migrated');
like($migrated, qr/Migrated:\s+2026_01_05_000003_subscribe_inventory_reservation/,
	'inventory migrated, handler subscribed');
artisan('db:seed');
is($node->safe_psql('inventory',
	"SELECT topics::text, handler::text, options->'kafka'->>'auto.commit.interval.ms'
	   FROM obx.subscriptions WHERE consumer_name = '$consumer'"),
	"{$topic}|inventory.reserve_stock(obx.inbound_event)|3600000",
	'the subscription names the topic, the handler and the consumer properties');
is($node->safe_psql('inventory', 'SELECT count(*), min(reserved), max(reserved) FROM inventory.stock'),
	'12|0|0', 'six skus in two warehouses on hand, nothing reserved');

ok($node->poll_query_until('postgres',
	"SELECT count(*) = 2 FROM pg_stat_activity WHERE backend_type = 'obx consumer'"),
	'two consumer workers run');

# A first order, once the consumer group has its partitions: reserved.
my $first = artisan('place-orders', '--count=1', '--schema-version=1');
ok($node->poll_query_until('inventory',
	'SELECT count(DISTINCT event_id) = 1 FROM inventory.reservations'),
	'a first order is reserved: the consumer is at work');

# The producers, all at once.  Each holds after half its orders until the
# resume file exists, so the consumer's pace cannot let them finish before
# it is killed; a short pause between orders keeps them placing orders
# while it dies.
my $dir = PostgreSQL::Test::Utils::tempdir('producers');
my $resume = "$dir/resume";
my @handles;
for my $i (0 .. $producers - 1)
{
	push @handles, IPC::Run::start(
		[ 'php', $artisan, 'place-orders', "--count=$orders_each",
		  "--rollback-every=$rollback_every", "--schema-version=$version_of_producer{$i}",
		  '--pause-ms=60', '--hold-after=' . int($orders_each / 2), "--resume-file=$resume" ],
		'<', \undef, '>', "$dir/p$i.out", '2>', "$dir/p$i.err");
}

# Kill a consumer once it has reserved stock for some orders, just as the
# producers resume.
ok($node->poll_query_until('inventory',
	'SELECT count(DISTINCT event_id) >= 21 FROM inventory.reservations'),
	'the consumer reserves stock while orders are placed');
PostgreSQL::Test::Utils::append_to_file($resume, '');
my ($victim) = split /\n/, $node->safe_psql('postgres',
	"SELECT pid FROM pg_stat_activity WHERE backend_type = 'obx consumer' ORDER BY pid");
my $orders_at_kill = $node->safe_psql('shop', 'SELECT count(*) FROM orders');
my $reserved_at_kill = $node->safe_psql('inventory',
	'SELECT count(DISTINCT event_id) FROM inventory.reservations');
my $log_offset = -s $node->logfile;
ok(kill('KILL', $victim),
	"SIGKILL sent to obx consumer $victim ($orders_at_kill orders placed, $reserved_at_kill reserved so far)");

wait_for_crash_restart($node, $log_offset, 'a consumer killed');
ok($node->poll_query_until('postgres',
	"SELECT count(*) = 2 FROM pg_stat_activity WHERE backend_type = 'obx consumer' AND pid <> $victim"),
	'the consumer workers are back after crash recovery');
my $log = slurp_file($node->logfile, $log_offset);
like($log, qr/\(PID $victim\) was terminated by signal 9/,
	'the postmaster saw the consumer die of SIGKILL');
like($log, qr/all server processes terminated; reinitializing/,
	'the instance went through crash recovery');

my $all_ok = 1;
for my $h (@handles)
{
	$all_ok = 0 unless $h->finish;
}
ok($all_ok, 'every PHP producer finished with exit status 0')
  or diag(join('', map { slurp_file("$dir/p$_.err") } 0 .. $producers - 1));

# What PHP saw: per order committed or rolled back, with its event id.
my (%committed, %rolled_back, %version_of_order);
my $reconnects = 0;
for my $out ([ $first, 1 ],
	map { [ slurp_file("$dir/p$_.out"), $version_of_producer{$_} ] } 0 .. $producers - 1)
{
	for my $line (split /\n/, $out->[0])
	{
		my ($outcome, $order, $event) = split /\t/, $line;
		next unless defined $event && $outcome =~ /^(committed|rolled_back)$/;
		($outcome eq 'committed' ? \%committed : \%rolled_back)->{$order} = $event;
		$version_of_order{$order} = $out->[1];
	}
}
$reconnects += () = slurp_file("$dir/p$_.err") =~ /connection lost/g for 0 .. $producers - 1;
my $n_rolled_back = $producers * int($orders_each / $rollback_every);
my $n_committed = 1 + $producers * $orders_each - $n_rolled_back;
is(scalar(keys %committed), $n_committed, "PHP saw $n_committed orders commit");
is(scalar(keys %rolled_back), $n_rolled_back, "PHP rolled $n_rolled_back orders back after enqueue");
cmp_ok($orders_at_kill, '<', $n_committed, 'orders were still being placed when the consumer died');
cmp_ok($reconnects, '>', 0,
	"the crash cut PHP connections mid-flow ($reconnects lost, each order looked up)");
my @committed_events = sort values %committed;

# The shop: exactly the committed orders and their events, all published.
is_deeply([ map { $_->[0] } @{ rows('shop', 'SELECT id FROM orders ORDER BY id') } ],
	[ sort keys %committed ], 'the shop holds exactly the orders PHP saw commit');
is_deeply([ map { $_->[0] } @{ rows('shop', 'SELECT id FROM obx.outbox_events ORDER BY id') } ],
	\@committed_events, 'the outbox holds exactly the events of committed orders');
is($node->safe_psql('shop', q{
	SELECT count(*) FROM obx.outbox_events e LEFT JOIN orders o ON o.id = e.event_key
	 WHERE e.payload->>'eventId' IS DISTINCT FROM e.id::text
	    OR e.payload->>'orderId' IS DISTINCT FROM o.id
	    OR e.event_type IS DISTINCT FROM 'OrderPlaced'
	    OR e.payload ? 'created_at' OR e.payload ? 'updated_at'}),
	'0', 'each event: eventId = outbox id, keyed by its order, explicit contract, no model dump');
ok($node->poll_query_until('shop',
	'SELECT count(*) = 0 FROM obx.outbox_events WHERE published_at IS NULL'),
	'nothing is left pending in the outbox');
is($node->safe_psql('shop', 'SELECT count(*) FROM obx.quarantine'), '0', 'nothing is quarantined');

# The inventory: wait until every committed event is reserved.
ok($node->poll_query_until('inventory',
	"SELECT count(DISTINCT event_id) >= $n_committed FROM inventory.reservations"),
	'the consumer reserved stock for every committed order');
ok($node->poll_query_until('inventory',
	"SELECT coalesce(sum(lag), -1) = 0 FROM obx.consumer_status WHERE consumer_name = '$consumer'"),
	'the consumer has no lag left');

# The broker holds each committed event once or more (a re-send after the
# crash keeps its id), keyed by order, header event_id = payload eventId.
my $json = JSON::PP->new;
my $msgs = read_topic($mock, $topic);
my $seen = event_ids_at_broker($msgs);
is_deeply([ sort keys %$seen ], \@committed_events,
	'the broker holds exactly the committed events');
is(scalar(grep {
	my $p = $json->decode($_->{payload});
	$p->{eventId} ne $_->{event_id} || $p->{orderId} ne $_->{key}
	  || ($_->{headers}{event_type} // '') ne 'OrderPlaced'
	  || ($_->{headers}{schema_version} // '') ne $p->{schemaVersion} } @$msgs),
	0, 'on the wire: header event_id = eventId, key = orderId, event_type and schema_version headers (obx/laravel)');

# The forced duplicate: a processed message produced again, to the partition
# it is in, with the same key, payload and event_id header.
my ($dup) = grep { $_->{event_id} eq $committed{ (sort keys %committed)[0] } } @$msgs;
ok(defined $dup, 'the message to duplicate is at the broker') or BAIL_OUT('no message to duplicate');
my $duplicates_before = $node->safe_psql('inventory',
	"SELECT coalesce(sum(duplicates), 0) FROM obx.consumer_status WHERE consumer_name = '$consumer'");
cmp_ok($duplicates_before, '>=', 1,
	"messages handled before the crash came again and were skipped as duplicates ($duplicates_before)");
my $payload = "$dup->{payload}\n";
my $kerr = '';
ok(IPC::Run::run(
	[ 'kcat', '-P', '-b', $mock->{bootstrap}, '-t', $topic, '-p', $dup->{partition},
	  '-k', $dup->{key}, '-H', "event_id=$dup->{event_id}", '-H', 'event_type=OrderPlaced' ],
	'<', \$payload, '>', \my $kout, '2>', \$kerr,
	IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default)),
	"event $dup->{event_id} of $dup->{key} produced again") or diag($kerr);
ok($node->poll_query_until('inventory', qq{
	SELECT coalesce(sum(duplicates), 0) > $duplicates_before AND coalesce(sum(lag), -1) = 0
	  FROM obx.consumer_status WHERE consumer_name = '$consumer'}),
	'the consumer counted the re-delivered message as a duplicate');
cmp_ok($node->safe_psql('inventory',
	"SELECT sum(duplicates) FROM obx.consumer_status WHERE consumer_name = '$consumer'"),
	'>=', 1, 'obx.consumer_status shows duplicates');

# Exactly once: each committed order's lines, reserved once, in the
# warehouse of its schema version, recorded with its event and version.
my %expected = map { $_->[0] => $_->[1] } @{ rows('shop', q{
	SELECT order_id, string_agg(format('%s:%s:%s', wh, sku, qty), ',' ORDER BY sku)
	  FROM (SELECT o.id AS order_id, coalesce(o.warehouse, 'main') AS wh, l.sku, sum(l.qty) AS qty
			  FROM orders o JOIN order_lines l ON l.order_id = o.id
			 GROUP BY 1, 2, 3) x
	 GROUP BY order_id}) };
my %reserved = map { $_->[0] => $_->[1] } @{ rows('inventory', q{
	SELECT order_id, string_agg(format('%s:%s:%s', warehouse, sku, qty), ',' ORDER BY sku, id)
	  FROM inventory.reservations GROUP BY order_id}) };
is(scalar(keys %expected), $n_committed, 'every committed order has lines');
is_deeply(\%reserved, \%expected,
	"every committed order's lines are reserved exactly once, nothing else is");
is($node->safe_psql('inventory', q{
	SELECT count(*) FROM (SELECT event_id, sku FROM inventory.reservations
						   GROUP BY 1, 2 HAVING count(*) > 1) twice}),
	'0', 'no event reserved a sku twice');
my %event_order = map { $_->[0] => "$_->[1]/v$_->[2]" } @{ rows('inventory', q{
	SELECT event_id, min(order_id), min(schema_version) FROM inventory.reservations GROUP BY 1}) };
is_deeply(\%event_order,
	{ map { $committed{$_} => "$_/v$version_of_order{$_}" } keys %committed },
	'reservations carry the event id and schema version of their order');
my %versions = map { $_->[0] => $_->[1] } @{ rows('inventory',
	'SELECT schema_version, count(DISTINCT event_id) FROM inventory.reservations GROUP BY 1') };
ok($versions{1} && $versions{2},
	sprintf('schemaVersion 1 (%d) and 2 (%d) events both reserved', $versions{1} // 0, $versions{2} // 0));
is($node->safe_psql('inventory',
	"SELECT count(*) FROM inventory.reservations WHERE status <> 'reserved'"),
	'0', 'stock sufficed: every line reserved, none backordered');

# The stock counters: reserved = committed quantities, per warehouse and sku.
my %demand = map { $_->[0] => $_->[1] } @{ rows('shop', q{
	SELECT coalesce(o.warehouse, 'main') || ':' || l.sku, sum(l.qty)
	  FROM orders o JOIN order_lines l ON l.order_id = o.id GROUP BY 1}) };
my %stock = map { $_->[0] => $_->[1] } @{ rows('inventory',
	q{SELECT warehouse || ':' || sku, reserved FROM inventory.stock}) };
is_deeply(\%stock, { map { $_ => $demand{$_} // 0 } keys %stock },
	'stock reserved per warehouse and sku = sum of committed order quantities');

# Rolled back: no trace anywhere.
my $rb_orders = join(',', map { "'$_'" } keys %rolled_back);
my $rb_events = join(',', map { "'$_'" } values %rolled_back);
is($node->safe_psql('shop', "SELECT count(*) FROM orders WHERE id IN ($rb_orders)")
	  . '/' . $node->safe_psql('shop',
		"SELECT count(*) FROM obx.outbox_events WHERE id::text IN ($rb_events)")
	  . '/' . $node->safe_psql('inventory',
		"SELECT count(*) FROM inventory.reservations WHERE order_id IN ($rb_orders) OR event_id IN ($rb_events)"),
	'0/0/0', 'rolled-back orders: no order, no event, no reservation');
ok(!grep({ $seen->{$_} } values %rolled_back), 'no rolled-back event reached the broker');

# The package's artisan commands see the same: obx:status on the shop,
# obx:status --consumers on the inventory, an empty obx:quarantine.
like(artisan('obx:status'), qr/\|\s*\Q$topic\E\s*\|\s*0\s*\|\s*0\s*\|\s*$n_committed\s*\|\s*0\s*\|/,
	"obx:status: $n_committed published, nothing pending, leased or quarantined");
like(artisan('obx:status', '--connection=inventory', '--consumers'),
	qr/\|\s*\Q$consumer\E\s*\|\s*$n_committed\s*\|/, "obx:status --consumers: $n_committed processed");
unlike(artisan('obx:quarantine'), qr/\|\s*[0-9a-f]{8}-/, 'obx:quarantine lists no event');

# The consumer's bookkeeping.
is_deeply([ map { $_->[0] } @{ rows('inventory',
	"SELECT event_id FROM obx.processed_events WHERE consumer_name = '$consumer' ORDER BY 1") } ],
	\@committed_events, 'the dedupe history holds exactly the committed event ids');
is($node->safe_psql('inventory',
	"SELECT sum(processed) FROM obx.consumer_status WHERE consumer_name = '$consumer'"),
	$n_committed, 'the handler ran and committed once per committed order');
is($node->safe_psql('inventory', 'SELECT count(*) FROM obx.dead_letters'), '0', 'no dead letters');
note('consumer: ' . $node->safe_psql('inventory',
	"SELECT format('processed %s, duplicates %s, dead lettered %s, retries %s, lag %s', processed, duplicates, dead_lettered, retries, lag)
	   FROM obx.consumers WHERE consumer_name = '$consumer'"));
note(sprintf('messages at the broker: %d for %d events; wall time %.1f s',
	scalar(@$msgs), scalar(keys %$seen), time() - $t0));

# --- The PHP consumer: obx:work ----------------------------------------

# The moves, interleaved by sku, through the stand-in with the sku as key
# (the event id and type from the payload, as for any producer).  mv-sku_1-3
# is sent twice; mv-sku_3-12 carries a negative quantity (the poison).
my (@lines, %qty_of);
for my $seq (1 .. 30)
{
	for my $k (1 .. 4)
	{
		my $id = "mv-sku_$k-$seq";
		my $qty = $id eq 'mv-sku_3-12' ? -1 : 1 + ($seq * $k) % 7;
		$qty_of{$id} = $qty;
		push @lines, "sku_$k|" . encode_json({ eventId => $id, eventType => 'StockMoved',
			sku => "sku_$k", seq => $seq, qty => $qty });
		push @lines, $lines[-1] if $id eq 'mv-sku_1-3';
	}
}
my $moves = join("\n", @lines) . "\n";
my ($mout, $merr) = ('', '');
ok(IPC::Run::run([ 'kcat', '-P', '-b', $mock->{bootstrap}, '-t', $moves_topic, '-K', '|' ],
	'<', \$moves, '>', \$mout, '2>', \$merr,
	IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default)),
	scalar(@lines) . " stock moves produced to $moves_topic") or diag($merr);
my @applied = sort grep { $qty_of{$_} > 0 } keys %qty_of;

# Three workers; the one that runs mv-sku_2-7 first dies inside the listener.
my $marker = "$dir/died";
local $ENV{OBX_EXAMPLE_DIE_AT} = 'mv-sku_2-7';
local $ENV{OBX_EXAMPLE_DIE_MARKER} = $marker;
my @workers = map {
	IPC::Run::start(
		[ 'php', $artisan, 'obx:work', '--connection=inventory', '--sleep=0.05', '--tries=2',
		  '--backoff=0' ],
		'<', \undef, '>', "$dir/w$_.out", '2>', "$dir/w$_.err")
} 0 .. 2;
ok($node->poll_query_until('inventory', qq{
	SELECT (SELECT count(*) FROM inventory.stock_moves) = ${\ scalar(@applied)}
	   AND (SELECT count(*) FROM obx.landed) = 0
	   AND (SELECT count(*) FROM obx.dead_letters WHERE consumer_name = '$moves_consumer') = 1}),
	'obx:work applied every move but the poison, which is dead-lettered; nothing is left landed')
  or diag(join('', map { slurp_file("$dir/w$_.err") } 0 .. 2));
$_->signal('TERM') for @workers;
my @ends;
for my $w (@workers)
{
	$w->finish;
	my $r = $w->full_result(0);
	push @ends, ($r & 127) ? 'signal ' . ($r & 127) : 'exit ' . ($r >> 8);
}
is_deeply([ sort @ends ], [ 'exit 0', 'exit 0', 'signal 9' ],
	'one obx:work process died of SIGKILL in its listener; the others stopped on SIGTERM with status 0');
ok(-d $marker, 'the listener of mv-sku_2-7 was where the worker died');

# Exactly once and in order, per sku.
is_deeply([ map { $_->[0] } @{ rows('inventory',
	'SELECT event_id FROM inventory.stock_moves ORDER BY event_id COLLATE "C"') } ],
	[ sort { $a cmp $b } @applied ],
	'every move but the poison applied exactly once: no loss, the duplicate and the killed attempt left nothing');
is($node->safe_psql('inventory', q{
	SELECT count(*) FROM (
		SELECT seq, prev_seq, lag(seq) OVER (PARTITION BY sku ORDER BY id) AS before
		  FROM inventory.stock_moves) m
	 WHERE prev_seq IS DISTINCT FROM before OR seq <= coalesce(before, 0)}),
	'0', 'per sku, each move ran after the previous one had committed, in Kafka order');
my %balance;
$balance{ ($_ =~ /^mv-(sku_\d+)-/)[0] } += $qty_of{$_} for @applied;
is_deeply({ map { $_->[0] => $_->[1] } @{ rows('inventory', q{
	SELECT DISTINCT ON (sku) sku, balance FROM inventory.stock_moves ORDER BY sku, id DESC}) } },
	\%balance, 'each sku\'s balance is the sum of its applied moves');
cmp_ok($node->safe_psql('inventory',
	"SELECT sum(duplicates) FROM obx.consumer_status WHERE consumer_name = '$moves_consumer'"),
	'>=', 1, 'the move sent twice was a duplicate for obx\'s consumer: it landed once');
is($node->safe_psql('inventory', qq{
	SELECT event_id || ' ' || error_class || ' ' || (error_message LIKE '%qty must be a positive integer%attempt 2 of max_attempts 2%')
	  FROM obx.dead_letters WHERE consumer_name = '$moves_consumer'}),
	'mv-sku_3-12 handler true', 'the poison is a dead letter with the listener\'s error after 2 tries');
is($node->safe_psql('inventory',
	q{SELECT max(seq) FROM inventory.stock_moves WHERE sku = 'sku_3'}), '30',
	'the poison\'s sku went on past it');

# Fixed and replayed: obx.land lands it again, obx:work applies it once.
$node->safe_psql('inventory', qq{
	UPDATE obx.dead_letters SET payload = jsonb_set(payload, '{qty}', '5')
	 WHERE consumer_name = '$moves_consumer'});
is($node->safe_psql('inventory', "SELECT obx.replay_dead_letter('$moves_consumer')"), '1',
	'the fixed dead letter is replayed');
like(artisan('obx:work', '--connection=inventory', '--stop-when-empty'),
	qr/mv-sku_3-12 attempt 1: DONE/, 'obx:work applies the replayed move');
is($node->safe_psql('inventory',
	q{SELECT count(*) || ' ' || max(qty) FROM inventory.stock_moves WHERE event_id = 'mv-sku_3-12'}),
	'1 5', 'the replayed move applied once, with its fixed quantity');

done_testing();
