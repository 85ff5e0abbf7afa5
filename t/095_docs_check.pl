# Docs: what can drift from the code mechanically, checked against a
# running server with obx installed.
#   - every obx.* setting the server defines has a row in the summary of
#     docs/configuration.md with its default and context, and a section;
#   - every function and view of schema obx a user may call (not obx._*)
#     is named in docs/sql.md, and every obx.<name> the docs name exists;
#   - the exporter's role: docs/monitoring.md names one role throughout,
#     which, created as it says (security.md's reader of status under that
#     name), runs every query of monitoring/obx-queries.yaml and the checks
#     by hand; the docs name one queries file, which exists, and one path
#     the exporter reads it from;
#   - every source file of src/ is in docs/internals.md's file map;
#   - the versions the README, docs/*.md and CHANGELOG.md name (package
#     files, the PGXN zip, ALTER EXTENSION ... UPDATE TO, the latest
#     release) are obx.control's, debian/changelog's and META.json's;
#   - every relative link of the README, CHANGELOG.md and docs/*.md names
#     a file that exists, and a heading of it when it has an anchor.
use strict;
use warnings;

use FindBin;
use JSON::PP;
use lib "$FindBin::RealBin/lib";
use ObxMetrics qw(grant_monitoring);
use ObxTest;
use PostgreSQL::Test::Utils;
use Test::More;

my $root = "$FindBin::RealBin/..";

sub slurp
{
	my ($file) = @_;
	open(my $fh, '<', "$root/$file") or die "cannot read $file: $!";
	local $/;
	return <$fh>;
}

# No worker is needed: the settings exist once the library is preloaded.
my $node = obx_node('docs_check', { bootstrap => '127.0.0.1:9' },
	'obx.workers' => 0, 'obx.consumer_workers' => 0);

# --- configuration.md ---------------------------------------------------
my $config = slurp('docs/configuration.md');
my %row;
for my $line (split /\n/, $config)
{
	next unless $line =~ /^\| `(obx\.[a-z_]+)` \|/;
	my @cells = map { s/^\s+|\s+$//gr } split /\|/, $line;
	$row{$1} = { default => $cells[3], context => $cells[5] };
}

# A documented default ('`60s`', '`7d`', 'empty', '`0` (forever)') in the
# setting's own unit, to compare with pg_settings.boot_val.
my %in_ms = (ms => 1, s => 1000, min => 60_000, h => 3_600_000, d => 86_400_000);
sub documented_value
{
	my ($text, $unit) = @_;
	return '' if $text =~ /^empty\b/;
	my ($v) = $text =~ /^`([^`]*)`/ or return undef;
	return $v eq 'on' ? 'on' : $v eq 'off' ? 'off' : $v
	  unless defined $unit && $v =~ /^(\d+)\s*(ms|s|min|h|d)?$/;
	my ($n, $u) = ($1, $2 // $unit);
	return $n * $in_ms{$u} / $in_ms{$unit};
}

my @settings = map { [ split /\|/ ] } split /\n/, $node->safe_psql('postgres', q{
	SELECT name, boot_val, coalesce(unit, ''), context FROM pg_settings
	 WHERE name LIKE 'obx.%' ORDER BY name});
cmp_ok(scalar(@settings), '>=', 30, 'the server defines the obx settings');
for my $s (@settings)
{
	my ($name, $boot, $unit, $context) = @$s;
	$unit = undef if $unit eq '' || $unit eq 'B';
	my $r = $row{$name};
	if (!ok($r, "$name has a row in configuration.md's summary"))
	{
		next;
	}
	is(documented_value($r->{default}, $unit), $boot, "$name: documented default is the code's");
	like($r->{context}, qr/^\Q$context\E\b/, "$name: documented context is $context");
	like($config, qr/^### .*`\Q$name\E`/m, "$name has a section in configuration.md");
}
# pg_settings leaves out the GUC_NO_SHOW_ALL ones (the Kafka secrets);
# current_setting names them, at their default here.
my %defined = map { $_->[0] => 1 } @settings;
for my $name (grep { !$defined{$_} } sort keys %row)
{
	my $value = $node->safe_psql('postgres', "SELECT current_setting('$name', true)");
	my ($exists) = $node->safe_psql('postgres',
		"SELECT current_setting('$name', true) IS NOT NULL");
	is($exists, 't', "configuration.md's $name is a setting of the server");
	is(documented_value($row{$name}{default}, undef), $value, "$name: documented default is the code's");
}

# --- sql.md -------------------------------------------------------------
my $sql_doc = slurp('docs/sql.md');
for my $object (split /\n/, $node->safe_psql('postgres', q{
	SELECT p.proname FROM pg_proc p
	 WHERE p.pronamespace = 'obx'::regnamespace AND p.proname NOT LIKE '\_%'
	UNION
	SELECT c.relname FROM pg_class c
	 WHERE c.relnamespace = 'obx'::regnamespace AND c.relkind = 'v'
	   AND c.relname NOT LIKE '\_%'
	 ORDER BY 1}))
{
	like($sql_doc, qr/\bobx\.\Q$object\E\b/, "sql.md names obx.$object");
}

# And the other way: every obx.<name> the README, CHANGELOG.md and docs/*.md
# name is an object of schema obx (function, table, view, sequence, index,
# type) or a setting, but for the few files and Laravel keys of that shape.
my %not_objects = map { $_ => 1 } qw(obx.c obx.h obx.so obx.control obx.php obx.connection);
my %named;
for my $file ('README.md', 'CHANGELOG.md', map { "docs/$_" } grep { /\.md$/ }
	do { opendir(my $d, "$root/docs") or die; readdir $d })
{
	my $text = slurp($file);
	$named{$1} //= $file while $text =~ /\b(obx\._?[A-Za-z]\w*)/g;
}
my @names = grep { !$not_objects{$_} } sort keys %named;
my %known = map { $_ => 1 } split /\n/, $node->safe_psql('postgres', q{
	SELECT 'obx.' || n.name
	  FROM (SELECT proname FROM pg_proc WHERE pronamespace = 'obx'::regnamespace
			UNION SELECT relname FROM pg_class WHERE relnamespace = 'obx'::regnamespace
			UNION SELECT typname FROM pg_type WHERE typnamespace = 'obx'::regnamespace) AS n(name)});
my @unknown = grep {
	!$known{$_} && $node->safe_psql('postgres', "SELECT current_setting('$_', true) IS NULL") eq 't'
} @names;
cmp_ok(scalar(@names), '>', 80, 'the docs name obx\'s objects and settings (' . scalar(@names) . ')');
is(join(', ', map { "$_ ($named{$_})" } @unknown), '',
	'every obx.<name> the docs name is an object of schema obx or a setting');

# --- the exporter's role and queries file (monitoring.md) ----------------
my $monitoring = slurp('docs/monitoring.md');
my ($exporter) = $monitoring =~ /Create the exporter's role `(\w+)` as \[security\.md\]/;
ok($exporter, "monitoring.md says how to create the exporter's role");
$exporter //= 'obx_exporter';
my @named = ($monitoring =~ /\buser=(\w+)/g, $monitoring =~ /^GRANT .* TO (\w+);/mg);
cmp_ok(scalar(@named), '>=', 2, "monitoring.md's connection strings and grants name a role");
is($_, $exporter, "monitoring.md names the exporter's role $exporter") for @named;
# The SQL of security.md's reader of status, under the exporter's name
# (ObxMetrics' grant_monitoring, which t/030 and t/031 use too).
grant_monitoring($node, $exporter);
my @queries = slurp('monitoring/obx-queries.yaml') =~ /^  query: \|\n((?:    .*\n|\s*\n)+)/mg;
cmp_ok(scalar(@queries), '>=', 5, 'the queries file has its queries');
for my $q (@queries)
{
	my ($ret, $out, $err) = $node->psql('postgres', "SET ROLE $exporter;\n$q");
	my ($first) = $q =~ /(\S.*)/;
	is($err, '', "the documented exporter role runs: $first");
}
# Checks by hand: the status queries, as the exporter's role.
my ($by_hand) = $monitoring =~ /^## Checks by hand\n(.*?)^## /ms;
my @blocks = ($by_hand // '') =~ /^```sql\n(.*?)^```/msg;
is(scalar(@blocks), 1, 'monitoring.md checks by hand in one SQL block');
my ($ret, $out, $err) = $node->psql('postgres', "SET ROLE $exporter;\n" . ($blocks[0] // ''));
is($err, '', "the exporter's role runs the checks by hand");

# One queries file, the one t/030 serves, copied to one place the
# exporter is pointed at.
my @docs = ('README.md', 'CHANGELOG.md', map { "docs/$_" } grep { /\.md$/ }
	  do { opendir(my $d, "$root/docs") or die; readdir $d });
my ($source, $installed) = $monitoring =~ /^\d\. `cp (\S+) (\S+)`/m;
is($source, 'monitoring/obx-queries.yaml', 'monitoring.md copies the queries file of the tree');
ok(-f "$root/$source", "$source exists") if $source;
my $query_paths = 0;
for my $file (@docs, glob("$root/monitoring/*.yaml"))
{
	(my $name = $file) =~ s{^\Q$root\E/}{};
	for my $path (slurp($name) =~ /--extend\.query-path=([^\s"']+)/g)
	{
		$query_paths++;
		is($path, $installed, "$name points the exporter at the copy monitoring.md makes");
	}
}
cmp_ok($query_paths, '>=', 2, 'the docs point the exporter at the queries file');

# --- internals.md's file map ---------------------------------------------
my $internals = slurp('docs/internals.md');
my @sources = sort map { s{^\Q$root\E/src/}{}r } glob("$root/src/*/*.c");
cmp_ok(scalar(@sources), '>=', 20, 'the sources are in the folders of src/');
for my $c (@sources)
{
	like($internals, qr/^\| `\Q$c\E` \|/m, "internals.md's file map has src/$c");
}

# --- versions ------------------------------------------------------------
# The extension's version (1.2), the Debian package's (1.2, a native
# package: no revision) and PGXN's (1.2.0) agree (as test/meta-check also
# checks), and every version the docs name where they mean the current one
# is one of them.
my ($ext) = slurp('obx.control') =~ /^default_version = '([^']+)'/m;
my $changelog = slurp('debian/changelog');
my @deb_releases = $changelog =~ /^obx \(([^)]+)\) /mg;
my @deb_dates = $changelog =~ /^ -- .*>  \w+, (\d+ \w+ \d+) /mg;
my $deb = $deb_releases[0];
my $pgxn = decode_json(slurp('META.json'))->{version};
ok($ext, "obx.control's default_version is $ext");
is($deb, $ext, "debian/changelog's latest version is obx.control's");
is($pgxn, join('.', (split /\./, "$ext.0.0")[0 .. 2]), "META.json's version is obx.control's");

my %meant = (
	'a package file (postgresql-NN-obx_V_arch.deb)' => [ qr/\bpostgresql-\d+-obx_([^_\s]+)_/, $deb ],
	'a package file (obx-relay_V_arch.deb)' => [ qr/\bobx-relay_([^_\s]+)_/, $deb ],
	'the PGXN zip (obx-V.zip)' => [ qr/\bobx-(\d[\w.]*)\.zip\b/, $pgxn ],
	'ALTER EXTENSION ... UPDATE TO' => [ qr/UPDATE\s+TO\s+'?([\d.]+)/, $ext ],
	'extension and distribution versions' => [ qr/Extension `([\d.]+)` is distribution/, $ext ],
	'the distribution of the extension' => [ qr/is distribution\s+`([\d.]+)`/, $pgxn ],
	"the Laravel package's version" => [ qr/`([\d.]+)` for the extension's `/, $pgxn ],
	"the Laravel package's extension version" => [ qr/for the extension's `([\d.]+)`/, $ext ]);
my $versions = 0;
for my $doc (sort @docs)
{
	my $text = slurp($doc);
	for my $what (sort keys %meant)
	{
		my ($re, $want) = @{ $meant{$what} };
		for my $v ($text =~ /$re/g)
		{
			$versions++;
			is($v, $want, "$doc: $what names version $want");
		}
	}
}
cmp_ok($versions, '>=', 6, "the docs' versions were read ($versions)");

# CHANGELOG.md: "## Unreleased" first, then the releases of
# debian/changelog, newest first, with its dates.
my @sections = slurp('CHANGELOG.md') =~ /^## (.*?)\s*$/mg;
is(shift(@sections), 'Unreleased', 'CHANGELOG.md begins with what is unreleased');
my %month = (Jan => 1, Feb => 2, Mar => 3, Apr => 4, May => 5, Jun => 6, Jul => 7,
	Aug => 8, Sep => 9, Oct => 10, Nov => 11, Dec => 12);
my @released = map {
	my ($d, $m, $y) = split / /, $deb_dates[$_];
	sprintf('%s (%04d-%02d-%02d)', $deb_releases[$_], $y, $month{$m}, $d)
} 0 .. $#deb_releases;
is_deeply(\@sections, \@released,
	"CHANGELOG.md's releases are debian/changelog's, the latest $ext");

# --- links ---------------------------------------------------------------
# GitHub's anchor of a heading: lower case, punctuation but - and _ dropped,
# spaces to hyphens; a repeated heading gets -1, -2.
sub anchors
{
	my ($text) = @_;
	my (%seen, %anchors);
	$text =~ s/^```.*?^```//msg;
	for my $h ($text =~ /^#+ +(.*?)\s*$/mg)
	{
		my $a = lc $h;
		$a =~ s/[^\w\- ]//g;
		$a =~ s/ /-/g;
		my $n = $seen{$a}++;
		$anchors{ $n ? "$a-$n" : $a } = 1;
	}
	return \%anchors;
}

my $links = 0;
for my $doc (sort @docs)
{
	my $text = slurp($doc);
	my $dir = $doc =~ m{^(.*)/} ? "$1/" : '';
	(my $prose = $text) =~ s/^```.*?^```//msg;
	for my $target ($prose =~ /\]\(([^)\s]+)\)/g)
	{
		next if $target =~ m{^[a-z]+:};    # http:, mailto:
		my ($file, $anchor) = $target =~ /^([^#]*)(?:#(.*))?$/;
		my $path = $file eq '' ? $doc : "$dir$file";
		1 while $path =~ s{[^/]+/\.\./}{};
		$links++;
		if (!-e "$root/$path")
		{
			fail("$doc: link $target: no file $path");
			next;
		}
		next unless defined $anchor && $path =~ /\.md$/;
		ok(anchors(slurp($path))->{$anchor}, "$doc: link $target finds its heading")
		  or diag("no heading with anchor #$anchor in $path");
	}
}
cmp_ok($links, '>', 100, "the docs' links were read ($links)");

done_testing();
