# Dead letters do not grow without bound, and neither does the log (issue
# 17, item 9; docs/consumers.md).
#
# 40 malformed messages are all dead-lettered, but the consumer logs the
# trouble once, not 40 times (the same error of the same subscription at
# most once a minute; the next line says how many were kept back).  With
# obx.dead_letter_retention set to one second, the housekeeping of the
# consumer worker (no relay here) purges them.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use ObxConsumer;
use PostgreSQL::Test::Utils;
use Test::More;

my $mock = start_mock();
my $topic = 'sec.dead.v1';

my $node = consumer_node('sec_dead', $mock, topics => { $topic => 1 });

sub q1 { $node->safe_psql('postgres', $_[0]) }

subscribe($node, 'dead-app', [$topic], 'shop.record(obx.inbound_event)');

my $n = 40;
produce($mock, $topic, map { { partition => 0, key => "k$_",
	headers => [ event_id => "evt-$_" ], payload => "not json $_" } } 1 .. $n);
ok($node->poll_query_until('postgres', "SELECT count(*) = $n FROM obx.dead_letters"),
	"all $n malformed messages are dead letters");

my @lines = grep { /obx consumer quarantined a malformed message/ }
  split /\n/, slurp_file($node->logfile);
cmp_ok(scalar(@lines), '>=', 1, 'the trouble is logged');
cmp_ok(scalar(@lines), '<=', 2, "but not once per message (" . scalar(@lines) . " lines for $n)");

q1(q{ALTER SYSTEM SET obx.dead_letter_retention = '1s'; SELECT pg_reload_conf()});
ok($node->poll_query_until('postgres', 'SELECT count(*) = 0 FROM obx.dead_letters'),
	'past obx.dead_letter_retention, the housekeeping purges them');
is(q1(q{SELECT processed FROM obx.consumers WHERE consumer_name = 'dead-app'}), '0',
	'(none was applied)');

done_testing();
