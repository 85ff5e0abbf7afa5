# Reliability: a relay worker's memory is bounded by the batch byte cap
# (16 MB of payloads), not by obx.batch_size times the payload size.  600
# events of about 890 kB (534 MB) wait in the outbox; the claim gets their
# payloads as stored (TOAST pointers) and reads and turns into text only
# those it takes into the batch, up to the cap.  So the worker's peak
# resident memory (VmHWM) grows by less than ten caps (two batches in
# flight and librdkafka's copy of each, about four caps, plus allocator
# slack) and the shared buffers it touches, while every event is
# published.  Reading the whole batch at once took a worker past half a
# gigabyte.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
use ObxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $topic = 'sec.memory.v1';
my $nevents = 600;
my $cap = 16 * 1024 * 1024;
my $shared_buffers = 16 * 1024 * 1024;

my $mock = start_mock();
my $node = obx_node('relay_memory', $mock,
	'obx.workers' => 1,
	'shared_buffers' => "'16MB'",
	'log_min_messages' => 'error');
relay_ready($node, 1);

sub hwm_kb
{
	my ($pid) = @_;
	open(my $fh, '<', "/proc/$pid/status") or die "cannot read /proc/$pid/status: $!";
	my ($kb) = map { /^VmHWM:\s+(\d+) kB/ ? $1 : () } <$fh>;
	close $fh;
	return $kb;
}

my ($pid) = @{ relay_pids($node) };
my $baseline = hwm_kb($pid);
note "relay $pid: VmHWM $baseline kB before the load";

# The brokers are down while the backlog builds, so the first claim sees
# all of it.
mock_cmd($mock, 'down all');
for my $chunk (0 .. $nevents / 50 - 1)
{
	$node->safe_psql('postgres', qq{
		SELECT obx.enqueue('$topic', 'k' || i,
			jsonb_build_object('n', i, 'blob', repeat(md5(i::text), 27800)))
		  FROM generate_series($chunk * 50 + 1, $chunk * 50 + 50) i});
}
is($node->safe_psql('postgres', qq{
	SELECT count(*) || ' ' || (min(octet_length(payload::text)) > 889000)
	  FROM obx.outbox_events WHERE topic = '$topic'}),
	"$nevents true", "$nevents events of more than 889 kB each are waiting");
mock_cmd($mock, 'up all');

ok(all_published($node), 'every event was published');
is($node->safe_psql('postgres', qq{
	SELECT count(DISTINCT (kafka_partition, kafka_offset)) FROM obx.outbox_events
	 WHERE topic = '$topic' AND published_at IS NOT NULL}),
	$nevents, 'each landed at a partition and offset of its own');
is(relay_pids($node)->[0], $pid, 'the same relay worker did it all');

my $peak = hwm_kb($pid);
my $grew = $peak - $baseline;
my $bound = (10 * $cap + $shared_buffers) / 1024;
note "relay $pid: VmHWM $peak kB after, grew by $grew kB; bound $bound kB";
cmp_ok($grew, '<', $bound,
	'the relay peak memory grew by less than ten batch caps plus the shared buffers');

done_testing();
