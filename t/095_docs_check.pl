# Docs: what can drift from the code mechanically, checked against a
# running server with obx installed.
#   - every obx.* setting the server defines has a row in the summary of
#     docs/configuration.md with its default and context, and a section;
#   - every function and view of schema obx a user may call (not obx._*)
#     is named in docs/sql.md;
#   - the reader of status of docs/security.md, the role
#     docs/monitoring.md gives the exporter, created with the SQL the doc
#     gives, runs every query of monitoring/obx-queries.yaml;
#   - every source file of src/ is in docs/internals.md's file map;
#   - every relative link of the README and docs/*.md names a file that
#     exists, and a heading of it when it has an anchor.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/lib";
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

# --- the exporter's role (security.md's reader of status) against the
# queries file (monitoring.md gives that role to the exporter) -----------
my ($grant) = slurp('docs/security.md') =~ /^(CREATE ROLE dashboards .*?)^```/ms;
ok($grant, "security.md gives the reader of status's role in SQL");
$grant =~ s/ IN ROLE pg_monitor//;    # pg_monitor only shows error texts
$node->safe_psql('postgres', $grant);
my @queries = slurp('monitoring/obx-queries.yaml') =~ /^  query: \|\n((?:    .*\n|\s*\n)+)/mg;
cmp_ok(scalar(@queries), '>=', 5, 'the queries file has its queries');
for my $q (@queries)
{
	my ($ret, $out, $err) = $node->psql('postgres', "SET ROLE dashboards;\n$q");
	my ($first) = $q =~ /(\S.*)/;
	is($err, '', "the documented exporter role runs: $first");
}

# --- internals.md's file map ---------------------------------------------
my $internals = slurp('docs/internals.md');
my @sources = sort map { s{^\Q$root\E/src/}{}r } glob("$root/src/*/*.c");
cmp_ok(scalar(@sources), '>=', 20, 'the sources are in the folders of src/');
for my $c (@sources)
{
	like($internals, qr/^\| `\Q$c\E` \|/m, "internals.md's file map has src/$c");
}

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

my @docs = ('README.md', map { "docs/$_" } grep { /\.md$/ }
	  do { opendir(my $d, "$root/docs") or die; readdir $d });
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
