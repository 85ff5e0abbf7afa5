# ObxMetrics.pm: run Debian's prometheus-postgres-exporter against a test
# node with obx's queries file (monitoring/obx-queries.yaml), scrape its
# /metrics endpoint over plain HTTP and read the samples back.
#
# Nothing is installed here: the exporter comes from the Debian package
# prometheus-postgres-exporter (listed in scripts/deps.sh).  Every wait is
# on a condition, with the harness timeout as the limit.
package ObxMetrics;

use strict;
use warnings;

use Exporter 'import';
use File::Basename qw(dirname);
use File::Spec;
use HTTP::Tiny;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use ObxTest qw(wait_until);

our @EXPORT = qw(exporter_bin start_exporter stop_exporter scrape
  parse_metrics sample samples scrape_until grant_monitoring);

my @exporters;

# The queries file of this source tree.
my $queries_default = File::Spec->rel2abs(
	File::Spec->catfile(dirname(__FILE__), '..', '..', 'monitoring', 'obx-queries.yaml'));

# exporter_bin(): path of the exporter binary of the Debian package, or dies.
sub exporter_bin
{
	my $out = `dpkg -L prometheus-postgres-exporter 2>/dev/null`;
	for my $path (split /\n/, $out)
	{
		return $path if $path =~ m{/bin/prometheus-postgres-exporter$} && -x $path;
	}
	for my $dir (split /:/, $ENV{PATH} // '')
	{
		my $path = "$dir/prometheus-postgres-exporter";
		return $path if -x $path;
	}
	die 'prometheus-postgres-exporter is not installed '
	  . "(Debian package prometheus-postgres-exporter, see scripts/deps.sh)\n";
}

# grant_monitoring($node, $role): create the exporter's role as
# docs/monitoring.md says: the SQL with which docs/security.md creates its
# reader of status, `dashboards`, under the name $role and without
# pg_monitor (which only shows error texts).  Dies when security.md has no
# such SQL.
sub grant_monitoring
{
	my ($node, $role) = @_;
	my $doc = File::Spec->catfile(dirname(__FILE__), '..', '..', 'docs', 'security.md');
	my ($sql) = slurp_file($doc) =~ /^(CREATE ROLE dashboards .*?)^```/ms
	  or die "$doc creates no role dashboards in SQL\n";
	$sql =~ s/ IN ROLE pg_monitor//;
	$sql =~ s/\bdashboards\b/$role/g;
	$node->safe_psql('postgres', $sql);
	return $role;
}

# start_exporter($node, %opts): start the exporter on a free loopback port,
# connected to $node through its Unix socket, with only the obx queries
# (built-in metrics off); wait until /metrics answers and shows obx
# metrics.  Options: user (default: the OS user), dbname (postgres),
# queries (the tree's monitoring/obx-queries.yaml).  Returns a hash: url,
# port, pid, log, handle.
sub start_exporter
{
	my ($node, %opts) = @_;
	my $bin = exporter_bin();
	my $queries = $opts{queries} // $queries_default;
	my $port = PostgreSQL::Test::Cluster::get_free_port();
	my $dir = PostgreSQL::Test::Utils::tempdir('exporter');
	my $log = "$dir/exporter.log";

	my $dsn = sprintf('host=%s port=%d dbname=%s sslmode=disable',
		$node->host, $node->port, $opts{dbname} // 'postgres');
	$dsn .= " user=$opts{user}" if $opts{user};

	my @cmd = ($bin,
		"--web.listen-address=127.0.0.1:$port",
		"--extend.query-path=$queries",
		'--disable-default-metrics',
		'--disable-settings-metrics',
		'--no-collector.database',
		'--no-collector.bgwriter',
		'--log.level=info');
	my $h;
	{
		# Only DATA_SOURCE_NAME and the command line above steer it.
		my @strip = grep { /^(PG_EXPORTER_|DATA_SOURCE_)/ } keys %ENV;
		local @ENV{@strip};
		delete @ENV{@strip};
		local $ENV{DATA_SOURCE_NAME} = $dsn;
		$h = IPC::Run::start(\@cmd, '<', \undef, '>', $log, '2>&1');
	}
	my %exp = (handle => $h, port => $port, log => $log,
		url => "http://127.0.0.1:$port/metrics", pid => $h->{KIDS}[0]{PID});
	push @exporters, \%exp;

	# A test killed by a signal would skip the END blocks and leave the
	# exporter (and the nodes) running: turn TERM and INT into an exit.
	for my $sig (qw(TERM INT))
	{
		$SIG{$sig} = sub { diag("caught SIG$sig, cleaning up"); exit 1; }
		  if !$SIG{$sig} || $SIG{$sig} eq 'DEFAULT';
	}
	note("exporter pid $exp{pid} on $exp{url}, DATA_SOURCE_NAME='$dsn'");

	my $ok = wait_until(sub {
		die "the exporter exited; log:\n" . slurp_file($log) . "\n" unless alive($exp{pid});
		my $r = HTTP::Tiny->new(timeout => 5)->get($exp{url});
		$r->{success} && $r->{content} =~ /^obx_worker_up\{/m }, 'the exporter to serve obx metrics',
		every => 0.1, quiet => 1);
	die "the exporter never served obx metrics; log:\n" . slurp_file($log) . "\n" unless $ok;
	return \%exp;
}

# stop_exporter($exp): stop it (TERM, then KILL) and reap it; returns true
# when the process is gone.
sub stop_exporter
{
	my ($exp) = @_;
	return 1 unless $exp->{handle};
	eval { $exp->{handle}->kill_kill(grace => 5); };
	delete $exp->{handle};
	return !alive($exp->{pid});
}

# alive($pid): the process exists and is not a zombie.
sub alive
{
	my ($pid) = @_;
	open(my $fh, '<', "/proc/$pid/stat") or return 0;
	my $stat = <$fh> // '';
	close $fh;
	return $stat !~ /^\d+ \(.*\) Z /;
}

# scrape($exp): one plain HTTP GET of /metrics; returns the body, dies on
# anything but 200.
sub scrape
{
	my ($exp) = @_;
	my $r = HTTP::Tiny->new(timeout => 30)->get($exp->{url});
	die "GET $exp->{url}: $r->{status} $r->{reason}\n" unless $r->{success};
	return $r->{content};
}

# parse_metrics($text): the Prometheus text format read into a hash:
#   samples => { name => [ { labels => {...}, value => '...' }, ... ] },
#   type => { name => 'gauge' | 'counter' | ... }, help => { name => '...' }
sub parse_metrics
{
	my ($text) = @_;
	my %m = (samples => {}, type => {}, help => {});
	for my $line (split /\n/, $text)
	{
		if ($line =~ /^# (HELP|TYPE) (\S+) (.*)$/)
		{
			$m{ lc $1 }{$2} = $3;
			next;
		}
		next if $line =~ /^\s*(#|$)/;
		$line =~ /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)(?: \S+)?$/
		  or die "unparsable metrics line: $line\n";
		my ($name, $lab, $value) = ($1, $2 // '', $3);
		my %labels;
		while ($lab =~ /\G\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?/gc)
		{
			my ($k, $v) = ($1, $2);
			$v =~ s/\\n/\n/g;
			$v =~ s/\\(["\\])/$1/g;
			$labels{$k} = $v;
		}
		push @{ $m{samples}{$name} }, { labels => \%labels, value => $value };
	}
	return \%m;
}

# samples($m, $name, %labels): the samples of $name whose labels include
# the given ones.
sub samples
{
	my ($m, $name, %want) = @_;
	return grep {
		my $l = $_->{labels};
		!grep { !defined $l->{$_} || $l->{$_} ne $want{$_} } keys %want
	} @{ $m->{samples}{$name} // [] };
}

# sample($m, $name, %labels): the value of the one sample matching, or
# undef when there is none; dies when several match.
sub sample
{
	my ($m, $name, %want) = @_;
	my @s = samples($m, $name, %want);
	die "several samples of $name match {" . join(',', map { "$_=$want{$_}" } sort keys %want) . "}\n"
	  if @s > 1;
	return @s ? $s[0]{value} : undef;
}

# scrape_until($exp, sub { my $m = shift; ... }, 'what', $timeout): scrape
# and parse until the condition holds on the metrics; returns them, or
# undef after $timeout seconds (default: the harness timeout).  Does not
# fail by itself, so callers can use it inside a TODO block.
sub scrape_until
{
	my ($exp, $cond, $what, $timeout) = @_;
	my $m;
	my $ok = wait_until(sub { $m = parse_metrics(scrape($exp)); $cond->($m) }, $what,
		timeout => $timeout, every => 0.1, quiet => 1);
	return $ok ? $m : undef;
}

END
{
	stop_exporter($_) for @exporters;
}

1;
