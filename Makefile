# obx: PGXS build of the extension, plus the Kafka stand-in in tools/.
#
#   make && make install          build and install the extension
#   make installcheck             pg_regress against a temporary instance
#   make sql-only-check           the same tests against the SQL-only install
#   make prove                    end-to-end TAP tests (Kafka stand-in, crashes)
#   test/run-all                  everything CI runs: packages, build, all tests
#   make dist                     the PGXN distribution, obx-<version>.zip

MODULE_big = obx
OBJS = src/base/obx.o src/base/compat.o src/base/worker.o src/base/launcher.o src/base/status.o \
	src/base/latency.o src/base/log_repeat.o src/base/drop_guard.o src/base/kafka_conf.o \
	src/base/housekeeping.o src/base/call_inner.o src/api/enqueue.o src/api/enqueue_many.o src/api/event_id.o \
	src/api/consumer_sql.o src/api/trace.o src/relay/relay.o src/relay/claim.o src/relay/outbox.o \
	src/relay/turns.o src/relay/kafka.o src/relay/cloudevents.o src/consumer/consumer.o \
	src/consumer/consumer_group.o src/consumer/held.o src/consumer/inbox.o \
	src/consumer/inbox_group.o src/consumer/progress.o src/consumer/inbound.o \
	src/consumer/handler.o src/consumer/land.o src/protocol/kafka_errors.o
EXTENSION = obx
DATA = obx--1.0.sql obx--1.0--1.1.sql obx--1.1--1.2.sql
PGFILEDESC = "obx - transactional outbox for Kafka"

SHLIB_LINK = -lrdkafka
PG_CPPFLAGS = $(addprefix -I$(srcdir)/src/,base api relay consumer protocol)
PG_CFLAGS = -Wall -Wmissing-prototypes -Werror

REGRESS = enqueue enqueue_many mark_processed operations privileges consumer security relay_served \
	trace tombstone landed
REGRESS_OPTS = --inputdir=test --outputdir=test/results \
	--temp-instance=test/tmp_check --temp-config=test/regress.conf

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

all: tools/obx-kafka-mock obx-sql-only.sql obx-relay

# obx-relay, the relay as a daemon (src/daemon/): libpq and librdkafka, the
# protocol's statements and Kafka error classes shared with the extension.
OBX_RELAY_SRCS = $(addprefix src/daemon/,obx_relay.c settings.c process.c relay.c database.c claim.c outbox.c \
	producer.c check.c consume.c inbox.c held.c daemon.c) src/protocol/kafka_errors.c
obx-relay: $(OBX_RELAY_SRCS) $(wildcard src/protocol/*.h src/daemon/*.h)
	$(CC) -std=gnu99 -O2 -g -Wall -Wextra -Wmissing-prototypes -Werror \
		-I$(srcdir)/src/protocol -I$(shell $(PG_CONFIG) --includedir) \
		-o $@ $(OBX_RELAY_SRCS) -L$(shell $(PG_CONFIG) --libdir) \
		-Wl,-rpath,$(shell $(PG_CONFIG) --libdir) -lpq -lrdkafka

# The SQL-only install (docs/operations.md, "Managed PostgreSQL"): the
# extension's scripts with its C functions in SQL (tools/gen-sql-only).
obx-sql-only.sql: obx.control $(DATA) src/sql_only/functions.sql src/base/kafka_conf.c tools/gen-sql-only
	$(srcdir)/tools/gen-sql-only $(srcdir) > $@.tmp && mv $@.tmp $@

sql-only-check: obx-sql-only.sql
	BINDIR="$(bindir)" PGXS_DIR="$(dir $(PGXS))../.." $(srcdir)/test/sql-only-check

# PGXS tracks no header dependencies: rebuild everything when one changes.
$(OBJS): $(wildcard src/*/*.h)

tools/obx-kafka-mock: tools/obx_kafka_mock.c
	$(MAKE) -C tools

# Runs against the installed extension (make install first), like installcheck.
# PostgreSQL::Test::Cluster comes with the server's pgxs where it ships it
# (Debian's), else from Debian's PostgreSQL 15, which drives any major.
PROVE_TESTS ?= t/*.pl
PROVE := $(or $(PROVE),prove)
TAP_PERL_LIB ?= $(or $(wildcard $(top_srcdir)/src/test/perl),/usr/lib/postgresql/15/lib/pgxs/src/test/perl)
prove:
	PATH="$(bindir):$$PATH" PG_REGRESS="$(top_builddir)/src/test/regress/pg_regress" \
		OBX_MOCK="$(CURDIR)/tools/obx-kafka-mock" OBX_RELAY="$(CURDIR)/obx-relay" \
		OBX_SQL_ONLY="$(CURDIR)/obx-sql-only.sql" \
		$(PROVE) $(PROVE_FLAGS) -I $(TAP_PERL_LIB) -I t/lib $(PROVE_TESTS)

clean: clean-local
clean-local:
	$(MAKE) -C tools clean
	rm -rf test/results test/tmp_check tmp_check test/sql_only obx-sql-only.sql obx-relay

.PHONY: prove sql-only-check clean-local

# PGXN: the distribution is the committed tree (git archive HEAD) under one
# directory, named after META.json's version (test/meta-check keeps that
# equal to obx.control's and debian/changelog's).  Upload the zip to PGXN.
DISTVERSION = $(shell perl -MJSON::PP -e 'local $$/; print decode_json(<STDIN>)->{version}' <$(srcdir)/META.json)
dist:
	git archive --format zip --prefix=$(EXTENSION)-$(DISTVERSION)/ \
		-o $(EXTENSION)-$(DISTVERSION).zip HEAD
	@echo "$(EXTENSION)-$(DISTVERSION).zip"

.PHONY: dist
