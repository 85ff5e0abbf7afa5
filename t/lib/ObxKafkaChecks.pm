# ObxKafkaChecks.pm: checks the real-Kafka window tests (t/06x) share, on
# top of ObxTest.pm.
package ObxKafkaChecks;

use strict;
use warnings;

use Exporter 'import';
use IPC::Run;
use PostgreSQL::Test::Utils;
use Test::More;

our @EXPORT = qw(copies_agree topic_writable in_list create_enqueue_load);

# copies_agree($msgs, $what): every message at the broker carries an
# event_id header, and every copy of one event id has the same key and
# payload: a duplicate is a re-send of the same event, never another event
# under its id.  Returns the number of duplicate copies.
sub copies_agree
{
	my ($msgs, $what) = @_;
	my (%first, @bad);
	for my $m (@$msgs)
	{
		if (!defined $m->{event_id} || $m->{event_id} eq '')
		{
			push @bad, "a message at partition $m->{partition} offset $m->{offset} has no event_id";
			next;
		}
		my $f = $first{ $m->{event_id} } //= $m;
		push @bad, "event $m->{event_id} has copies that differ"
		  if $f->{key} ne $m->{key} || $f->{payload} ne $m->{payload};
	}
	is(join('; ', @bad[0 .. ($#bad < 4 ? $#bad : 4)]), '',
		"$what: every message has an event_id, and the copies of an event are the same message");
	return scalar(@$msgs) - scalar(keys %first);
}

# topic_writable($kafka, $topic, $parts, $isr): whether the topic's
# metadata, as kcat gets it, shows every one of its $parts partitions with
# a leader and at least $isr replicas in sync (default 2, the
# min.insync.replicas of the test clusters: an acks=all write to any
# partition can then succeed; 3 means fully replicated again).
sub topic_writable
{
	my ($kafka, $topic, $parts, $isr) = @_;
	$isr //= 2;
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'kcat', '-L', '-b', $kafka->{bootstrap}, '-t', $topic, '-m', '2' ],
		'<', \undef, '>', \$out, '2>', \$err,
		IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default));
	my $ok = 0;
	while ($out =~ /partition \d+, leader (-?\d+), replicas: [\d,]+, isrs: ([\d,]+)/g)
	{
		my @in_sync = split /,/, $2;
		$ok++ if $1 > 0 && @in_sync >= $isr;
	}
	return $ok == $parts;
}

# create_enqueue_load($node): the load of the failover tests, in database
# postgres: CALL enqueue_load(topic, max_n, nkeys) commits one event per
# transaction on nkeys keys, a few ms apart, until load_ctl.stop is set or
# max_n events are committed.
sub create_enqueue_load
{
	my ($node) = @_;
	$node->safe_psql('postgres', q{
	CREATE TABLE load_ctl (stop boolean NOT NULL);
	INSERT INTO load_ctl VALUES (false);
	CREATE PROCEDURE enqueue_load(topic text, max_n int, nkeys int)
	LANGUAGE plpgsql AS $$
	DECLARE
		i int := 0;
	BEGIN
		WHILE i < max_n AND NOT (SELECT stop FROM load_ctl) LOOP
			i := i + 1;
			PERFORM obx.enqueue(topic, 'ord_' || (i % nkeys), jsonb_build_object('n', i));
			COMMIT;
			PERFORM pg_sleep(0.003);    -- the load's pace (about 300 events/s), not a wait
		END LOOP;
	END $$;});
}

# in_list(@ids): the ids as an SQL list of literals.
sub in_list
{
	return join(',', map { "'$_'" } @_);
}

1;
