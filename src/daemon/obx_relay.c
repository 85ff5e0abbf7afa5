/*-------------------------------------------------------------------------
 *
 * obx_relay.c
 *	  obx-relay: the relay as a standalone daemon, for a PostgreSQL that
 *	  cannot load obx's library (the SQL-only install, obx-sql-only.sql)
 *	  or where the relay should run on another host.  It runs the same
 *	  claim / produce / record protocol as the in-database relay, with the
 *	  same statements (src/protocol/protocol.h), over libpq, against one or
 *	  more databases, as a role that holds obx_worker's grants and nothing
 *	  more (docs/security.md, "The workers").  It also runs the
 *	  subscriptions its setting "subscriptions" names (consume.c), in a
 *	  second process (run_consumer, obx-relay --consumer).
 *
 *	  obx-relay [--config FILE] [--check]
 *
 * Settings come from the file, then from the environment (OBX_RELAY_<NAME>,
 * and OBX_RELAY_KAFKA_<NAME> for a librdkafka property, "_" standing for
 * "."); docs/operations.md, "Managed PostgreSQL", lists them.  SIGHUP
 * reads them again and SIGTERM and SIGINT stop it, each once the batches
 * out are recorded.
 *
 * Per database, up to PIPELINE batches out at once, as the in-database
 * relay: claim (a REPEATABLE READ transaction inside the claim lock,
 * committed synchronously, which flushes the WAL past every commit it saw:
 * the events it took are durable before any is produced), produce with
 * librdkafka (idempotent, acks=all), and while the delivery reports come
 * in, with no transaction open, claim the next batch when it is due
 * (renewing a lease in a statement of its own when a wait is long); a batch
 * whose reports are all in is recorded (one short transaction).  A daemon
 * that dies leaves its leases to expire after lease_timeout; their events
 * are then claimed again and re-sent with the same ids.
 *
 *-------------------------------------------------------------------------
 */
#include <arpa/inet.h>
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>

#include "daemon.h"
#include "kafka_errors.h"
#include "protocol.h"

/* A floor past every seq (claim.c's OBX_FLOOR_NONE). */
#define FLOOR_NONE      "9223372036854775807"
/* Seconds from the Unix epoch to PostgreSQL's (2000-01-01). */
#define PG_EPOCH_OFFSET 946684800LL

typedef enum Outcome
{
	UNSENT = 0,
	IN_FLIGHT,
	DELIVERED,
	FAILED
} Outcome;

typedef struct Event
{
	char id[37];
	const char *uuid; /* the id's 16 bytes, in the claim's rows */
	char *topic;
	char *key;
	const char *payload; /* NULL: a tombstone */
	size_t payload_len;
	char *event_type;
	int nheaders;
	char **header_names;
	char **header_values;
	Outcome outcome;
	int err;
	bool refused_locally;
	int partition;
	long long offset;
	long long acked_us; /* microseconds since the Unix epoch */
	struct Batch *batch;
} Event;

typedef struct Batch
{
	bool used;
	long long renew_at;
	long long lease_id;
	long long max_seq;
	long long min_seq;
	int nevents;
	Event *events;
	int in_flight;
	bool full;
	bool held;      /* an event of it came from obx.event_states (OBX_SQL_LEASE) */
	bool lost;      /* its lease ran out (renew) */
	PGresult *rows; /* the claim's rows, which the events point into */
} Batch;

/* Batches out at once per database, as the in-database relay (relay.c). */
#define PIPELINE 2

/* The longest an idle daemon goes without a claim (anything_new). */
#define IDLE_CLAIM_US 1000000

typedef struct Database
{
	const char *conninfo;
	PGconn *conn;
	time_t retry_at;
	time_t rotate_at;
	Batch flights[PIPELINE];
	int nflights;
	long long claim_at;   /* the next claim, in microseconds; 0: at once */
	long long claimed_at; /* the latest claim's start, in microseconds */
	char *idle_snap;      /* its snapshot (binary) if it took nothing, or NULL */
	int idle_snap_len;
	long long replica_check_at; /* obx._replica_problem's next reading; 0: at once */
	char *replica_problem;      /* its latest answer, or NULL */
	bool lease_seq_behind;      /* said (protocol.h's OBX_LEASE_SEQ_BEHIND) */
	long long complete_tick;    /* the latest claim's lease id if complete, else 0 */
} Database;

static const char *config_file = NULL;
static volatile sig_atomic_t stop_requested = 0;
static volatile sig_atomic_t reload_requested = 0;

static void
buf_str(Buf *b, const char *s)
{
	obx_buf_add(b, s, strlen(s));
}

/* An element of an array literal, double-quoted with " and \ escaped. */
static void
buf_quoted(Buf *b, const char *s)
{
	obx_buf_add(b, "\"", 1);
	for (; *s; s++)
	{
		if (*s == '"' || *s == '\\')
			obx_buf_add(b, "\\", 1);
		obx_buf_add(b, s, 1);
	}
	obx_buf_add(b, "\"", 1);
}

static void
buf_be64(Buf *b, uint64_t v)
{
	obx_buf_be32(b, (uint32_t) (v >> 32));
	obx_buf_be32(b, (uint32_t) v);
}

static void
array_item_be32(Buf *b, uint32_t v)
{
	obx_buf_be32(b, 4);
	obx_buf_be32(b, v);
}

static void
array_item_be64(Buf *b, uint64_t v)
{
	obx_buf_be32(b, 8);
	buf_be64(b, v);
}

/* ---------------------------------------------------------------------
 * Settings
 * --------------------------------------------------------------------- */

static void
config_defaults(Config *c)
{
	memset(c, 0, sizeof(*c));
	/* The in-database relay's defaults (docs/configuration.md). */
	c->batch_size = 2000;
	c->poll_interval_ms = 40;
	c->claim_gap_ms = 20;
	c->lease_timeout_s = 60;
	c->delivery_timeout_ms = 30000;
	c->max_attempts = 10;
	c->backoff_min_ms = 100;
	c->backoff_max_ms = 60000;
	c->quarantine_blocks_key = true;
	c->retention_s = 7 * 24 * 3600;
	c->relay_id = 1000;
}

static bool
parse_int(const char *name, const char *value, int min, int max, int *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(value, &end, 10);
	if (errno != 0 || end == value || *end != '\0' || v < min || v > max)
	{
		obx_say("ERROR", "setting %s must be a whole number from %d to %d, not \"%s\"",
				name, min, max, value);
		return false;
	}
	*out = (int) v;
	return true;
}

/* One setting; false (said why) if it is unknown or its value is bad. */
static bool
config_set(Config *c, const char *name, const char *value)
{
	if (strncmp(name, "kafka.", 6) == 0)
	{
		if (c->nkafka == MAX_KAFKA_PROPS)
		{
			obx_say("ERROR", "more than %d Kafka properties", MAX_KAFKA_PROPS);
			return false;
		}
		c->kafka_names[c->nkafka] = obx_xstrdup(name + 6);
		c->kafka_values[c->nkafka++] = obx_xstrdup(value);
		return true;
	}
	if (strcmp(name, "database") == 0)
	{
		if (c->ndatabases == MAX_DATABASES)
		{
			obx_say("ERROR", "more than %d databases", MAX_DATABASES);
			return false;
		}
		c->databases[c->ndatabases++] = obx_xstrdup(value);
		return true;
	}
	if (strcmp(name, "subscriptions") == 0)
	{
		free(c->subscriptions);
		c->subscriptions = *value == '\0' ? NULL : obx_xstrdup(value);
		return true;
	}
	if (strcmp(name, "brokers") == 0)
	{
		free(c->brokers);
		c->brokers = obx_xstrdup(value);
		return true;
	}
	if (strcmp(name, "quarantine_blocks_key") == 0)
	{
		if (strcmp(value, "on") == 0 || strcmp(value, "true") == 0)
			c->quarantine_blocks_key = true;
		else if (strcmp(value, "off") == 0 || strcmp(value, "false") == 0)
			c->quarantine_blocks_key = false;
		else
		{
			obx_say("ERROR", "setting quarantine_blocks_key must be on or off, not \"%s\"", value);
			return false;
		}
		return true;
	}
#define INT_SETTING(n, field, min, max) \
	if (strcmp(name, n) == 0)           \
		return parse_int(name, value, min, max, &c->field);
	INT_SETTING("batch_size", batch_size, 1, 100000);
	INT_SETTING("poll_interval", poll_interval_ms, 1, 3600000);
	INT_SETTING("claim_gap", claim_gap_ms, 0, 3600000);
	INT_SETTING("lease_timeout", lease_timeout_s, 1, 86400);
	INT_SETTING("delivery_timeout", delivery_timeout_ms, 1000, 3600000);
	INT_SETTING("max_attempts", max_attempts, 1, 1000000);
	INT_SETTING("backoff_min", backoff_min_ms, 1, 3600000);
	INT_SETTING("backoff_max", backoff_max_ms, 1, 86400000);
	INT_SETTING("retention", retention_s, 0, 365 * 24 * 3600);
	INT_SETTING("relay_id", relay_id, 0, 1000000);
#undef INT_SETTING
	obx_say("ERROR", "unknown setting \"%s\"", name);
	return false;
}

static char *
trim(char *s)
{
	char *end;

	while (*s == ' ' || *s == '\t')
		s++;
	end = s + strlen(s);
	while (end > s && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\n' || end[-1] == '\r'))
		*--end = '\0';
	return s;
}

/*
 * Read the settings: the file (lines "name = value"; # starts a comment
 * line; a value may be in single quotes), then the environment.
 */
static bool
config_load(Config *c, const char *path)
{
	extern char **environ;
	char **env;
	bool ok = true;

	config_defaults(c);
	if (path != NULL)
	{
		FILE *f = fopen(path, "r");
		char line[8192];
		int lineno = 0;

		if (f == NULL)
		{
			obx_say("ERROR", "could not open settings file \"%s\": %s", path, strerror(errno));
			return false;
		}
		while (fgets(line, sizeof(line), f) != NULL)
		{
			char *name = trim(line);
			char *eq;
			char *value;
			size_t len;

			lineno++;
			if (*name == '\0' || *name == '#')
				continue;
			eq = strchr(name, '=');
			if (eq == NULL)
			{
				obx_say("ERROR", "%s line %d: expected name = value", path, lineno);
				ok = false;
				continue;
			}
			*eq = '\0';
			name = trim(name);
			value = trim(eq + 1);
			len = strlen(value);
			if (len >= 2 && value[0] == '\'' && value[len - 1] == '\'')
			{
				value[len - 1] = '\0';
				value++;
			}
			ok &= config_set(c, name, value);
		}
		fclose(f);
	}
	for (env = environ; *env != NULL; env++)
	{
		char name[256];
		const char *eq = strchr(*env, '=');
		size_t len;
		size_t i;

		if (strncmp(*env, "OBX_RELAY_", 10) != 0 || eq == NULL)
			continue;
		len = eq - (*env + 10);
		if (len == 0 || len >= sizeof(name))
			continue;
		for (i = 0; i < len; i++)
		{
			char ch = (*env)[10 + i];

			name[i] = (ch >= 'A' && ch <= 'Z') ? ch - 'A' + 'a' : ch;
		}
		name[len] = '\0';
		if (strncmp(name, "kafka_", 6) == 0)
		{
			name[5] = '.';
			for (i = 6; i < len; i++)
				if (name[i] == '_')
					name[i] = '.';
		}
		ok &= config_set(c, name, eq + 1);
	}
	if (c->ndatabases == 0)
	{
		obx_say("ERROR", "no database: set database (a libpq connection string)");
		ok = false;
	}
	if (c->brokers == NULL)
	{
		obx_say("ERROR", "no brokers: set brokers (Kafka's bootstrap servers)");
		ok = false;
	}
	return ok;
}

static void
config_free(Config *c)
{
	int i;

	for (i = 0; i < c->ndatabases; i++)
		free(c->databases[i]);
	for (i = 0; i < c->nkafka; i++)
	{
		free(c->kafka_names[i]);
		free(c->kafka_values[i]);
	}
	free(c->brokers);
	free(c->subscriptions);
	memset(c, 0, sizeof(*c));
}

/* ---------------------------------------------------------------------
 * Kafka
 * --------------------------------------------------------------------- */

static void
delivered(rd_kafka_t *rk, const rd_kafka_message_t *msg, void *opaque)
{
	Event *ev = (Event *) msg->_private;

	(void) rk;
	(void) opaque;
	if (ev == NULL)
		return;
	if (msg->err == RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		ev->outcome = DELIVERED;
		ev->partition = msg->partition;
		ev->offset = msg->offset;
		ev->acked_us = obx_now_us();
	}
	else
	{
		ev->outcome = FAILED;
		ev->err = msg->err;
	}
	ev->batch->in_flight--;
}

/*
 * The producer, set as the in-database relay's (src/relay/kafka.c): obx's
 * properties, then the user's, then what the guarantees need.
 */
static rd_kafka_t *
kafka_create(void)
{
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	char timeout[32];
	char err[512];
	rd_kafka_t *rk;
	int i;
	bool ok;

	snprintf(timeout, sizeof(timeout), "%d", obx_config.delivery_timeout_ms);
	ok = obx_kafka_set(conf, "bootstrap.servers", obx_config.brokers) &&
		 obx_kafka_set(conf, "client.id", "obx-relay") &&
		 obx_kafka_set(conf, "message.timeout.ms", timeout) &&
		 obx_kafka_set(conf, "partitioner", "murmur2_random") &&
		 obx_kafka_set(conf, "linger.ms", "5") &&
		 obx_kafka_set(conf, "socket.nagle.disable", "true") &&
		 obx_kafka_set(conf, "reconnect.backoff.ms", "50") &&
		 obx_kafka_set(conf, "reconnect.backoff.max.ms", "250");
	for (i = 0; ok && i < obx_config.nkafka; i++)
		ok = obx_kafka_set(conf, obx_config.kafka_names[i], obx_config.kafka_values[i]);
	ok = ok && obx_kafka_set(conf, "enable.idempotence", "true") && obx_kafka_set(conf, "acks", "all");
	if (!ok)
	{
		rd_kafka_conf_destroy(conf);
		return NULL;
	}
	rd_kafka_conf_set_dr_msg_cb(conf, delivered);
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
	if (rk == NULL)
	{
		obx_say("ERROR", "could not create the Kafka producer: %s", err);
		return NULL;
	}
	return rk;
}

/*
 * Ask the brokers at once for the metadata of each topic of the batch not
 * produced to before: librdkafka 2.0 would otherwise wait for its periodic
 * topic scan before sending the first batch of a topic (src/relay/kafka.c,
 * learn_topics).  At most half a second per new topic, no transaction open.
 */
#define MAX_KNOWN_TOPICS 1024
static char *known_topics[MAX_KNOWN_TOPICS];
static int nknown_topics = 0;

static void
learn_topics(rd_kafka_t *rk, Batch *batch)
{
	int i;
	int j;

	for (i = 0; i < batch->nevents; i++)
	{
		const char *topic = batch->events[i].topic;
		rd_kafka_topic_t *rkt;
		const struct rd_kafka_metadata *md;
		bool known = false;

		for (j = 0; j < nknown_topics && !known; j++)
			known = strcmp(known_topics[j], topic) == 0;
		if (known || nknown_topics == MAX_KNOWN_TOPICS)
			continue;
		known_topics[nknown_topics++] = obx_xstrdup(topic);
		rkt = rd_kafka_topic_new(rk, topic, NULL);
		if (rkt == NULL)
			continue;
		if (rd_kafka_metadata(rk, 0, rkt, &md, 500) == RD_KAFKA_RESP_ERR_NO_ERROR)
			rd_kafka_metadata_destroy(md);
		rd_kafka_topic_destroy(rkt);
	}
}

static bool
same_key(const Event *a, const Event *b)
{
	return strcmp(a->key, b->key) == 0 && strcmp(a->topic, b->topic) == 0;
}

/*
 * Hand the batch to librdkafka in seq order, the payloads not copied: they
 * stay in the claim's rows until the batch's every report is in.  An event it refuses at once
 * fails, and the later events of its key stay unsent so that they cannot
 * overtake it (src/relay/kafka.c does the same).
 */
static void
produce(rd_kafka_t *rk, Batch *batch)
{
	Event **refused = obx_xcalloc(batch->nevents, sizeof(Event *));
	int nrefused = 0;
	int i;

	learn_topics(rk, batch);
	batch->in_flight = 0;
	for (i = 0; i < batch->nevents; i++)
	{
		Event *ev = &batch->events[i];
		rd_kafka_headers_t *hdrs;
		rd_kafka_resp_err_t err;
		bool held = false;
		int j;

		for (j = 0; j < nrefused && !held; j++)
			held = same_key(refused[j], ev);
		if (held)
			continue;
		hdrs = rd_kafka_headers_new(2 + ev->nheaders);
		rd_kafka_header_add(hdrs, "event_id", -1, ev->id, -1);
		if (ev->event_type != NULL)
			rd_kafka_header_add(hdrs, "event_type", -1, ev->event_type, -1);
		for (j = 0; j < ev->nheaders; j++)
			rd_kafka_header_add(hdrs, ev->header_names[j], -1, ev->header_values[j], -1);
		for (;;)
		{
			err = rd_kafka_producev(rk,
									RD_KAFKA_V_TOPIC(ev->topic),
									RD_KAFKA_V_KEY(ev->key, strlen(ev->key)),
									RD_KAFKA_V_VALUE((void *) ev->payload, ev->payload_len),
									RD_KAFKA_V_MSGFLAGS(0),
									RD_KAFKA_V_HEADERS(hdrs),
									RD_KAFKA_V_OPAQUE(ev),
									RD_KAFKA_V_END);
			if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL)
				break;
			rd_kafka_poll(rk, 10);
		}
		if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
		{
			ev->outcome = IN_FLIGHT;
			batch->in_flight++;
		}
		else
		{
			rd_kafka_headers_destroy(hdrs);
			ev->outcome = FAILED;
			ev->err = err;
			ev->refused_locally = true;
			refused[nrefused++] = ev;
		}
	}
	free(refused);
}

/* ---------------------------------------------------------------------
 * The database: the protocol's statements
 * --------------------------------------------------------------------- */

typedef struct Statement
{
	const char *name;
	const char *sql;
	int nparams;
	Oid types[10];
} Statement;

static const Statement statements[] = {
	{"obx_tick", OBX_SQL_TICK, 0, {0}},
	{"obx_claim", OBX_SQL_CLAIM, 6, {BOOLOID, INT4OID, INT8OID, PGSNAPSHOTOID, INT8OID, INT8OID}},
	{"obx_claim_since", OBX_SQL_CLAIM_SINCE, 6, {BOOLOID, INT4OID, INT8OID, PGSNAPSHOTOID, INT8OID, INT8OID}},
	{"obx_lease", OBX_SQL_LEASE, 10, {INT8OID, INT4OID, FLOAT8OID, PGSNAPSHOTOID, INT8OID, INT8OID, UUIDARRAYOID, TEXTARRAYOID, TEXTARRAYOID, BOOLOID}},
	{"obx_record", OBX_SQL_RECORD, 7, {UUIDARRAYOID, INT4ARRAYOID, INT8ARRAYOID, TSTZARRAYOID, INT8OID, INT8OID, INT8OID}},
	{"obx_held_published", OBX_SQL_HELD_PUBLISHED, 2, {UUIDARRAYOID, TSTZARRAYOID}},
	{"obx_claim_lock", OBX_SQL_CLAIM_LOCK, 2, {INT4OID, INT4OID}},
	{"obx_live", OBX_SQL_LIVE, 1, {INT8OID}},
	{"obx_hold", OBX_SQL_HOLD, 1, {UUIDARRAYOID}},
	{"obx_failed", OBX_SQL_FAILED, 7, {UUIDARRAYOID, INT4OID, FLOAT8OID, FLOAT8OID, TEXTARRAYOID, TEXTARRAYOID, BOOLARRAYOID}},
	{"obx_renew", OBX_SQL_RENEW, 2, {INT8OID, FLOAT8OID}},
	{"obx_rotate", OBX_SQL_ROTATE, 1, {FLOAT8OID}},
	{"obx_replica_problem", OBX_SQL_REPLICA_PROBLEM, 0, {0}},
	/* The daemon's own: its look for commits between claims (anything_new). */
	{"obx_snapshot", "SELECT pg_catalog.pg_current_snapshot()", 0, {0}},
};

static const Statement *
statement(const char *name)
{
	size_t i;

	for (i = 0; i < sizeof(statements) / sizeof(statements[0]); i++)
		if (strcmp(statements[i].name, name) == 0)
			return &statements[i];
	obx_say("FATAL", "no statement %s", name);
	exit(1);
}

/*
 * A statement's result, or NULL (said why) when it failed.  Parameters are
 * text but where formats (when given) says 1: then binary, of lengths.
 */
static PGresult *
run_binary(Database *db, const char *name, const char *const *params, const int *lengths,
		   const int *formats, int binary)
{
	const Statement *st = statement(name);
	PGresult *res = PQexecPrepared(db->conn, st->name, st->nparams, params, lengths, formats,
								   binary);
	ExecStatusType status = PQresultStatus(res);

	if (status != PGRES_TUPLES_OK && status != PGRES_COMMAND_OK)
	{
		obx_say("ERROR", "%s failed: %s", name, PQresultErrorMessage(res));
		PQclear(res);
		return NULL;
	}
	return res;
}

static PGresult *
run(Database *db, const char *name, const char *const *params, int binary)
{
	return run_binary(db, name, params, NULL, NULL, binary);
}

/* A plain statement (no parameters, no rows wanted); false if it failed. */
static bool
exec(Database *db, const char *sql)
{
	PGresult *res = PQexec(db->conn, sql);
	ExecStatusType status = PQresultStatus(res);
	bool ok = status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK;

	if (!ok)
		obx_say("ERROR", "%s: %s", sql, PQresultErrorMessage(res));
	PQclear(res);
	return ok;
}

static void
disconnect(Database *db, const char *why)
{
	if (db->conn == NULL)
		return;
	if (why != NULL)
		obx_say("LOG", "disconnecting from the database (%s); connecting again in 1 s", why);
	PQfinish(db->conn);
	db->conn = NULL;
	db->retry_at = time(NULL) + 1;
	free(db->idle_snap);
	db->idle_snap = NULL;
	db->complete_tick = 0;
}

/*
 * One allocation of 8 MB in the new backend, freed at once.  A backend
 * whose every statement frees all it allocated gives the memory back to
 * the kernel after each claim (glibc's malloc trims the top of its heap
 * once more than M_TRIM_THRESHOLD, 128 kB, is free), and the next claim
 * faults it in again: in a drain, a page fault per 2 events, an eighth
 * of the backend's CPU (docs/benchmarks.md).  glibc raises its thresholds
 * when a block it mmapped is freed (mallopt(3), the dynamic mmap
 * threshold): to 8 MB for mmap and 16 MB for the trim, past what a claim
 * frees, so that the backend keeps its memory between claims.  The string
 * is built by kilobytes and not scanned (octet_length): about 12 ms, once
 * per connection.  On another allocator it changes nothing.
 */
#define BACKEND_MALLOC_WARMUP \
	"SELECT pg_catalog.octet_length(pg_catalog.repeat(pg_catalog.repeat('x', 1024), 8 * 1024))"

/* Connect and prepare the statements; false (said why) if not now. */
static bool
connect_db(Database *db)
{
	size_t i;

	if (db->conn != NULL)
		return true;
	if (time(NULL) < db->retry_at)
		return false;
	db->conn = obx_session_open(db->conninfo, "obx-relay", NULL);
	if (db->conn == NULL)
	{
		db->retry_at = time(NULL) + 1;
		return false;
	}
	for (i = 0; i < sizeof(statements) / sizeof(statements[0]); i++)
	{
		PGresult *res = PQprepare(db->conn, statements[i].name, statements[i].sql,
								  statements[i].nparams, statements[i].types);

		if (PQresultStatus(res) != PGRES_COMMAND_OK)
		{
			obx_say("ERROR", "could not prepare %s: %s", statements[i].name,
					PQresultErrorMessage(res));
			PQclear(res);
			disconnect(db, "obx is not installed there, or this role lacks its grants");
			db->retry_at = time(NULL) + 5;
			return false;
		}
		PQclear(res);
	}
	(void) exec(db, BACKEND_MALLOC_WARMUP);
	obx_say("LOG", "connected to database \"%s\" as role \"%s\"", PQdb(db->conn), PQuser(db->conn));
	db->replica_check_at = 0;
	return true;
}

static uint32_t
be32(const char *p)
{
	uint32_t v;

	memcpy(&v, p, 4);
	return ntohl(v);
}

static long long
be64(const char *p)
{
	return ((long long) be32(p) << 32) | be32(p + 4);
}

/* The claim's headers column: a text[n][2] in binary form, or NULL. */
static void
read_headers(Event *ev, const char *p, int len)
{
	int ndim;
	int n = 1;
	int i;
	const char *end = p + len;

	ev->nheaders = 0;
	if (len < 12)
		return;
	ndim = (int) be32(p);
	p += 12;
	for (i = 0; i < ndim; i++, p += 8)
		n *= (int) be32(p);
	ev->nheaders = n / 2;
	ev->header_names = obx_xcalloc(ev->nheaders, sizeof(char *));
	ev->header_values = obx_xcalloc(ev->nheaders, sizeof(char *));
	for (i = 0; i < n && p + 4 <= end; i++)
	{
		int elen = (int) be32(p);
		char *s;

		p += 4;
		s = obx_xcalloc(elen > 0 ? elen + 1 : 1, 1);
		if (elen > 0)
			memcpy(s, p, elen);
		p += elen > 0 ? elen : 0;
		if (i % 2 == 0)
			ev->header_names[i / 2] = s;
		else
			ev->header_values[i / 2] = s;
	}
}

/* The uuid's 16 bytes as its text, without printf: one per event. */
static void
format_uuid(char *out, const unsigned char *u)
{
	static const char hex[] = "0123456789abcdef";
	int i;

	for (i = 0; i < 16; i++)
	{
		if (i == 4 || i == 6 || i == 8 || i == 10)
			*out++ = '-';
		*out++ = hex[u[i] >> 4];
		*out++ = hex[u[i] & 0xf];
	}
	*out = '\0';
}

/*
 * The claim's rows (binary) into the batch, in seq order, until their
 * payloads pass OBX_BATCH_BYTES.  The last row, with no seq, is the new
 * tick; false (said) if there is none.
 */
static bool
take_batch(Batch *batch, PGresult *rows)
{
	int nrows = PQntuples(rows) - 1;
	long long bytes = 0;
	int n = 0;

	if (nrows < 0 || !PQgetisnull(rows, nrows, 0))
	{
		obx_say("ERROR", "the claim gave no tick row");
		return false;
	}
	batch->rows = rows;
	batch->events = obx_xcalloc(nrows, sizeof(Event));
	batch->max_seq = 0;
	batch->held = false;
	while (n < nrows && bytes < OBX_BATCH_BYTES)
	{
		Event *ev = &batch->events[n];

		ev->batch = batch;
		batch->max_seq = be64(PQgetvalue(rows, n, 0));
		if (n == 0)
			batch->min_seq = batch->max_seq;
		ev->uuid = PQgetvalue(rows, n, 1);
		format_uuid(ev->id, (const unsigned char *) ev->uuid);
		ev->topic = PQgetvalue(rows, n, 2);
		ev->key = PQgetvalue(rows, n, 3);
		if (PQgetisnull(rows, n, 4))
			ev->payload = NULL;
		else
		{
			/* jsonb in binary: a version byte, then the text. */
			ev->payload = PQgetvalue(rows, n, 4) + 1;
			ev->payload_len = PQgetlength(rows, n, 4) - 1;
		}
		ev->event_type = PQgetisnull(rows, n, 5) ? NULL : PQgetvalue(rows, n, 5);
		if (!PQgetisnull(rows, n, 7))
			read_headers(ev, PQgetvalue(rows, n, 7), PQgetlength(rows, n, 7));
		/* A bool in binary: one byte, 1 for true. */
		if (PQgetvalue(rows, n, OBX_CLAIM_HELD_COL - 1)[0] == 1)
			batch->held = true;
		bytes += ev->payload_len;
		n++;
	}
	batch->nevents = n;
	batch->full = nrows >= obx_config.batch_size || n < nrows;
	return true;
}

/* The lease's arrays of the batch's ids, topics and keys (binary). */
static void
lease_arrays(Batch *batch, Buf *ids, Buf *topics, Buf *keys)
{
	int i;

	obx_array_start(ids, UUIDOID, batch->nevents);
	obx_array_start(topics, TEXTOID, batch->nevents);
	obx_array_start(keys, TEXTOID, batch->nevents);
	for (i = 0; i < batch->nevents; i++)
	{
		obx_array_item(ids, batch->events[i].uuid, 16);
		obx_array_item(topics, batch->events[i].topic, strlen(batch->events[i].topic));
		obx_array_item(keys, batch->events[i].key, strlen(batch->events[i].key));
	}
}

static void
batch_free(Batch *batch)
{
	int i;
	int j;

	for (i = 0; i < batch->nevents; i++)
	{
		for (j = 0; j < batch->events[i].nheaders; j++)
		{
			free(batch->events[i].header_names[j]);
			free(batch->events[i].header_values[j]);
		}
		free(batch->events[i].header_names);
		free(batch->events[i].header_values);
	}
	free(batch->events);
	PQclear(batch->rows);
	memset(batch, 0, sizeof(*batch));
}

/* The claim lock's key as the statements' two text parameters. */
static const char *const *
claim_lock_key(void)
{
	static char cls[16];
	static char obj[16];
	static const char *const key[2] = {cls, obj};

	if (cls[0] == '\0')
	{
		snprintf(cls, sizeof(cls), "%d", OBX_CLAIM_LOCK_CLASS);
		snprintf(obj, sizeof(obj), "%d", OBX_CLAIM_LOCK_OBJECT);
	}
	return key;
}

static bool
claim_lock_session(Database *db, bool lock)
{
	PGresult *res = PQexecParams(db->conn,
								 lock ? OBX_SQL_CLAIM_LOCK_SESSION : OBX_SQL_CLAIM_UNLOCK_SESSION,
								 2, NULL, claim_lock_key(), NULL, NULL, 0);
	bool ok = PQresultStatus(res) == PGRES_TUPLES_OK;

	if (!ok)
		obx_say("ERROR", "could not %s the claim lock: %s", lock ? "take" : "release",
				PQresultErrorMessage(res));
	PQclear(res);
	return ok;
}

/*
 * Whether the lease id drawn is above the latest claim's (protocol.h's
 * OBX_SQL_TICK).  If not, the claim takes nothing; said once, until a
 * claim goes through.
 */
static bool
lease_seq_ok(Database *db, const char *lease_id, const char *tick)
{
	if (atoll(lease_id) > atoll(tick))
	{
		db->lease_seq_behind = false;
		return true;
	}
	if (!db->lease_seq_behind)
		obx_say("WARNING", "claims nothing in database \"%s\": " OBX_LEASE_SEQ_BEHIND ". %s",
				PQdb(db->conn), atoll(lease_id), atoll(tick), OBX_LEASE_SEQ_BEHIND_HINT);
	db->lease_seq_behind = true;
	return false;
}

/*
 * The claim's row (protocol.h's OBX_SQL_LEASE): the new tick, as the
 * claim gave it in binary, and the lease of the events taken, if any.
 */
static bool
write_lease(Database *db, Batch *batch, const char *lease_id)
{
	int tick_row = PQntuples(batch->rows) - 1;
	bool leased = batch->nevents > 0;
	Buf ids = {0};
	Buf topics = {0};
	Buf keys = {0};
	char lease_s[16];
	char max_seq[32];
	char relay_id[16];
	const char *params[10];
	int lengths[10] = {0};
	int formats[10] = {0, 0, 0, 1, 1, 0, 1, 1, 1, 0};
	PGresult *res;
	bool ok;

	lease_arrays(batch, &ids, &topics, &keys);
	snprintf(lease_s, sizeof(lease_s), "%d", leased ? obx_config.lease_timeout_s : 0);
	snprintf(max_seq, sizeof(max_seq), "%lld", batch->max_seq);
	snprintf(relay_id, sizeof(relay_id), "%d", obx_config.relay_id);
	params[0] = lease_id;
	params[1] = relay_id;
	params[2] = lease_s;
	params[3] = PQgetvalue(batch->rows, tick_row, OBX_CLAIM_SNAP_COL - 1);
	lengths[3] = PQgetlength(batch->rows, tick_row, OBX_CLAIM_SNAP_COL - 1);
	params[4] = PQgetvalue(batch->rows, tick_row, OBX_CLAIM_FLOOR_COL - 1);
	lengths[4] = 8;
	params[5] = leased ? max_seq : NULL;
	params[6] = leased ? ids.data : NULL;
	lengths[6] = (int) ids.len;
	params[7] = leased ? topics.data : NULL;
	lengths[7] = (int) topics.len;
	params[8] = leased ? keys.data : NULL;
	lengths[8] = (int) keys.len;
	params[9] = batch->held ? "t" : "f";
	res = run_binary(db, "obx_lease", params, lengths, formats, 0);
	ok = res != NULL;
	PQclear(res);
	free(ids.data);
	free(topics.data);
	free(keys.data);
	return ok;
}

/*
 * claim
 *		Lease up to batch_size publishable events; returns how many, or -1
 *		if the database failed.
 *
 * Inside the claim lock (held by the session around the transaction, so
 * that the transaction's snapshot, taken by its first statement, sees
 * every claim before it), in one REPEATABLE READ transaction: the tick
 * and the lease id, the claim with the new tick, the claim's row.  Its
 * commit is synchronous: it flushes the WAL past every commit it saw, and
 * waits for the synchronous standbys, before anything of it is produced.
 * With no batch of the database's out (each recorded with every event
 * delivered, else record forgets), a claim from the daemon's own complete
 * tick reads only what that tick did not see (OBX_SQL_CLAIM_SINCE), as
 * the in-database relay's does.
 */
static int
claim(Database *db, Batch *batch)
{
	PGresult *res;
	PGresult *rows = NULL;
	char lease_id[32];
	char floor[32];
	long long next_floor;
	int tick_row;
	char *snap = NULL;
	char tick[32];
	char batch_size[16];
	bool since;
	bool complete;
	bool wrote;
	bool ok = false;

	memset(batch, 0, sizeof(*batch));
	if (!claim_lock_session(db, true))
		return -1;
	if (!exec(db, "BEGIN ISOLATION LEVEL REPEATABLE READ; SET LOCAL synchronous_commit = on;"
				  " SET LOCAL enable_seqscan = off; SET LOCAL plan_cache_mode = force_generic_plan"))
		goto done;
	if ((res = run(db, "obx_tick", NULL, 0)) == NULL)
		goto done;
	snprintf(floor, sizeof(floor), "%s", PQgetvalue(res, 0, 0));
	snap = obx_xstrdup(PQgetvalue(res, 0, 1));
	snprintf(tick, sizeof(tick), "%s", PQgetvalue(res, 0, 2));
	snprintf(lease_id, sizeof(lease_id), "%s", PQgetvalue(res, 0, 3));
	PQclear(res);
	if (!lease_seq_ok(db, lease_id, tick))
		goto done;
	since = db->nflights == 0 && db->complete_tick != 0 && atoll(tick) == db->complete_tick;
	snprintf(batch_size, sizeof(batch_size), "%d", obx_config.batch_size);
	{
		const char *params[6] = {obx_config.quarantine_blocks_key ? "t" : "f", batch_size, floor,
								 snap, tick, FLOOR_NONE};

		if ((rows = run(db, since ? "obx_claim_since" : "obx_claim", params, 1)) == NULL)
			goto done;
	}
	batch->lease_id = atoll(lease_id);
	if (!take_batch(batch, rows))
		goto done;
	rows = NULL;
	tick_row = PQntuples(batch->rows) - 1;
	/* A claim that took nothing leaves a tick only when its floor moved. */
	next_floor = be64(PQgetvalue(batch->rows, tick_row, OBX_CLAIM_FLOOR_COL - 1));
	complete = !PQgetisnull(batch->rows, tick_row, OBX_CLAIM_COMPLETE_COL - 1) &&
			   PQgetvalue(batch->rows, tick_row, OBX_CLAIM_COMPLETE_COL - 1)[0] == 1;
	wrote = batch->nevents > 0 || next_floor != atoll(floor);
	if (wrote && !write_lease(db, batch, lease_id))
		goto done;
	ok = exec(db, "COMMIT");
	if (ok && wrote)
		db->complete_tick = complete && !batch->full ? atoll(lease_id) : 0;
done:
	if (!ok && PQstatus(db->conn) == CONNECTION_OK)
		(void) exec(db, "ROLLBACK");
	if (PQstatus(db->conn) == CONNECTION_OK)
		ok &= claim_lock_session(db, false);
	/* A batch dropped here is not sent: its lease runs out. */
	if (!ok)
		db->complete_tick = 0;
	PQclear(rows);
	free(snap);
	if (!ok)
	{
		batch_free(batch);
		return -1;
	}
	return batch->nevents;
}

/* The array literal of a field of the events picked, as text. */
static char *
uuid_literal(Event **events, int n)
{
	Buf b = {0};
	int i;

	buf_str(&b, "{");
	for (i = 0; i < n; i++)
	{
		if (i > 0)
			buf_str(&b, ",");
		buf_str(&b, events[i]->id);
	}
	buf_str(&b, "}");
	return b.data;
}

/*
 * The failed events: held in obx.event_states with their error, a backoff
 * or a quarantine, but only while the batch's lease is live (checked under
 * the claim lock, as outbox.c does), or another relay may have them
 * already.  In the record's transaction; false if the database failed.
 */
static bool
record_failed(Database *db, Event **failed, int nfailed, const char *lease_id)
{
	const char *live_params[1] = {lease_id};
	Buf classes = {0};
	Buf messages = {0};
	Buf timed_out = {0};
	char attempts[16];
	char bmin[16];
	char bmax[16];
	char *fids;
	const char *params[7];
	PGresult *res;
	bool live;
	bool ok;
	int i;

	if ((res = run(db, "obx_claim_lock", claim_lock_key(), 0)) == NULL)
		return false;
	PQclear(res);
	if ((res = run(db, "obx_live", live_params, 0)) == NULL)
		return false;
	live = PQntuples(res) == 1;
	PQclear(res);
	if (!live)
	{
		obx_say("LOG", "lost the lease of %d failed events before recording them", nfailed);
		return true;
	}

	buf_str(&classes, "{");
	buf_str(&messages, "{");
	buf_str(&timed_out, "{");
	for (i = 0; i < nfailed; i++)
	{
		char msg[1024];

		if (i > 0)
		{
			buf_str(&classes, ",");
			buf_str(&messages, ",");
			buf_str(&timed_out, ",");
		}
		buf_str(&classes, obx_error_class_name(obx_kafka_classify(failed[i]->err)));
		snprintf(msg, sizeof(msg), "%s: %s%s", obx_kafka_error_name(failed[i]->err),
				 obx_kafka_error_text(failed[i]->err),
				 failed[i]->refused_locally ? " (refused by librdkafka, not sent)" : "");
		buf_quoted(&messages, msg);
		buf_str(&timed_out, obx_kafka_timed_out(failed[i]->err) ? "t" : "f");
		if (i < 10)
			obx_say("WARNING", "could not publish event %s to topic %s: %s", failed[i]->id,
					failed[i]->topic, msg);
	}
	buf_str(&classes, "}");
	buf_str(&messages, "}");
	buf_str(&timed_out, "}");
	fids = uuid_literal(failed, nfailed);
	snprintf(attempts, sizeof(attempts), "%d", obx_config.max_attempts);
	snprintf(bmin, sizeof(bmin), "%d", obx_config.backoff_min_ms);
	snprintf(bmax, sizeof(bmax), "%d", obx_config.backoff_max_ms);
	params[0] = fids;
	params[1] = attempts;
	params[2] = bmin;
	params[3] = bmax;
	params[4] = classes.data;
	params[5] = messages.data;
	params[6] = timed_out.data;
	ok = (res = run(db, "obx_hold", (const char *const[]){fids}, 0)) != NULL;
	PQclear(res);
	ok = ok && (res = run(db, "obx_failed", params, 0)) != NULL;
	if (ok)
		PQclear(res);
	free(fids);
	free(classes.data);
	free(messages.data);
	free(timed_out.data);
	return ok;
}

/*
 * The batch's record: the delivered events, where they landed and when
 * Kafka acknowledged each (none for a release), which ends the lease; those
 * held in obx.event_states are marked published there.  In the record's
 * transaction; false if the database failed.
 */
static bool
record_delivered(Database *db, Event **done, int ndone, const char *lease_id,
				 const char *max_seq, const char *min_seq)
{
	Buf ids = {0};
	Buf parts = {0};
	Buf offsets = {0};
	Buf acked = {0};
	const char *params[7];
	int lengths[7];
	int formats[7] = {1, 1, 1, 1, 0, 0, 0};
	PGresult *res;
	bool ok;
	int i;

	obx_array_start(&ids, UUIDOID, ndone);
	obx_array_start(&parts, INT4OID, ndone);
	obx_array_start(&offsets, INT8OID, ndone);
	obx_array_start(&acked, TIMESTAMPTZOID, ndone);
	for (i = 0; i < ndone; i++)
	{
		obx_array_item(&ids, done[i]->uuid, 16);
		array_item_be32(&parts, (uint32_t) done[i]->partition);
		array_item_be64(&offsets, (uint64_t) done[i]->offset);
		/* timestamptz: microseconds since 2000-01-01 UTC */
		array_item_be64(&acked, (uint64_t) (done[i]->acked_us - PG_EPOCH_OFFSET * 1000000));
	}
	params[0] = ids.data;
	params[1] = parts.data;
	params[2] = offsets.data;
	params[3] = acked.data;
	params[4] = lease_id;
	params[5] = max_seq;
	params[6] = min_seq;
	lengths[0] = (int) ids.len;
	lengths[1] = (int) parts.len;
	lengths[2] = (int) offsets.len;
	lengths[3] = (int) acked.len;
	lengths[4] = lengths[5] = lengths[6] = 0;
	ok = (res = run_binary(db, "obx_record", params, lengths, formats, 0)) != NULL;
	PQclear(res);
	if (ok && ndone > 0)
	{
		const char *held_params[2] = {ids.data, acked.data};
		int held_lengths[2] = {(int) ids.len, (int) acked.len};
		int held_formats[2] = {1, 1};

		ok = (res = run_binary(db, "obx_held_published", held_params, held_lengths,
							   held_formats, 0)) != NULL;
		PQclear(res);
	}
	free(ids.data);
	free(parts.data);
	free(offsets.data);
	free(acked.data);
	return ok;
}

/*
 * record
 *		Write what Kafka said about the batch, in one short transaction
 *		(asynchronously committed: a lost record means a re-send with the
 *		same ids): failures first, since the record ends the lease they are
 *		written under.  False if the database failed.
 */
static bool
record(Database *db, Batch *batch)
{
	Event **done = obx_xcalloc(batch->nevents, sizeof(Event *));
	Event **failed = obx_xcalloc(batch->nevents, sizeof(Event *));
	int ndone = 0;
	int nfailed = 0;
	char lease_id[32];
	char max_seq[32];
	char min_seq[32];
	bool ok;
	int i;

	for (i = 0; i < batch->nevents; i++)
	{
		if (batch->events[i].outcome == DELIVERED)
			done[ndone++] = &batch->events[i];
		else if (batch->events[i].outcome == FAILED)
			failed[nfailed++] = &batch->events[i];
	}
	snprintf(lease_id, sizeof(lease_id), "%lld", batch->lease_id);
	snprintf(max_seq, sizeof(max_seq), "%lld", batch->max_seq);
	snprintf(min_seq, sizeof(min_seq), "%lld", batch->min_seq);
	ok = exec(db, "BEGIN; SET LOCAL synchronous_commit = off") &&
		 (nfailed == 0 || record_failed(db, failed, nfailed, lease_id)) &&
		 record_delivered(db, done, ndone, lease_id, max_seq, min_seq) &&
		 exec(db, "COMMIT");
	if (!ok && PQstatus(db->conn) == CONNECTION_OK)
		(void) exec(db, "ROLLBACK");
	/* The next claim reads from the floor (claim). */
	if (!ok || ndone < batch->nevents)
		db->complete_tick = 0;
	free(done);
	free(failed);
	return ok;
}

/*
 * Extend the batch's lease while its deliveries take long, if it is still
 * live: checked under the claim lock against the clock, as the in-database
 * relay does, so that a lease a claim saw run out is never live again
 * (docs/internals.md, the claim since a complete tick).  A lease lost so
 * (the daemon was stalled past lease_timeout) is said once; what is still
 * in the producer may reach the broker as copies, and is recorded.
 */
static void
renew(Database *db, Batch *batch)
{
	char lease_id[32];
	char secs[16];
	const char *params[2] = {lease_id, secs};
	PGresult *res;
	bool checked = false;
	bool live = false;

	snprintf(lease_id, sizeof(lease_id), "%lld", batch->lease_id);
	snprintf(secs, sizeof(secs), "%d", obx_config.lease_timeout_s);
	if (!exec(db, "BEGIN"))
		return;
	if ((res = run(db, "obx_claim_lock", claim_lock_key(), 0)) != NULL)
	{
		PQclear(res);
		if ((res = run(db, "obx_live", params, 0)) != NULL)
		{
			checked = true;
			live = PQntuples(res) == 1;
			PQclear(res);
		}
	}
	if (live && (res = run(db, "obx_renew", params, 0)) != NULL)
		PQclear(res);
	if (!exec(db, live ? "COMMIT" : "ROLLBACK") || !checked || live || batch->lost)
		return;
	batch->lost = true;
	obx_say("WARNING", "lost the lease on %d events in database \"%s\": the daemon was stalled past lease_timeout, and a claim may have taken them over",
			batch->nevents, PQdb(db->conn));
}

/*
 * Whether the daemon may claim and rotate in the connected database: not
 * while a logical subscription writes into obx's tables there
 * (obx._replica_problem, read at each new connection and then every
 * OBX_REPLICA_CHECK_MS, as the in-database relay does).  Says why once,
 * when the reason appears or changes, and when it goes.  The batches
 * already out are recorded all the same.
 */
static bool
replica_free(Database *db)
{
	PGresult *res;
	bool free_of_it;

	if (db->conn == NULL || obx_now_us() < db->replica_check_at)
		return db->replica_problem == NULL;
	db->replica_check_at = obx_now_us() + (long long) OBX_REPLICA_CHECK_MS * 1000;
	if ((res = run(db, "obx_replica_problem", NULL, 0)) == NULL)
	{
		if (PQstatus(db->conn) != CONNECTION_OK)
			disconnect(db, "the connection broke");
		return false;
	}
	free_of_it = obx_replica_note(&db->replica_problem, res, PQdb(db->conn), "claims nothing",
								  "its events are copies, published by the relay of the "
								  "database they come from",
								  "resumes");
	PQclear(res);
	return free_of_it;
}

/* One step of the outbox's rotation (obx._rotate), as housekeeping.c takes it. */
static void
rotate(Database *db)
{
	char secs[16];
	const char *params[1] = {secs};
	PGresult *res;

	if (obx_config.retention_s == 0 || db->conn == NULL || time(NULL) < db->rotate_at ||
		!replica_free(db))
		return;
	db->rotate_at = time(NULL) + 10;
	snprintf(secs, sizeof(secs), "%d", obx_config.retention_s);
	if ((res = run(db, "obx_rotate", params, 0)) != NULL)
		PQclear(res);
}

/* ---------------------------------------------------------------------
 * The loop
 * --------------------------------------------------------------------- */

/*
 * The consumer process (see run_consumer), in the relay's process: its pid
 * while it runs, and when a new one may be started after one died.
 */
static volatile pid_t consumer_pid = 0;
static long long consumer_start_at = 0;
static long long consumer_started = 0;
static int consumer_deaths = 0; /* in a row, each within a minute of its start */

/* Both signals go on to the consumer process, which stops or reloads too. */
static void
on_stop(int sig)
{
	(void) sig;
	stop_requested = 1;
	if (consumer_pid > 0)
		kill(consumer_pid, SIGTERM);
}

static void
on_reload(int sig)
{
	(void) sig;
	reload_requested = 1;
	if (consumer_pid > 0)
		kill(consumer_pid, SIGHUP);
}

/*
 * Record the database's batches whose every report is in, and renew the
 * leases of those still waiting.  A batch is recorded even when its
 * connection broke meanwhile (on a new one: its lease is still the
 * daemon's); when that fails too, its lease runs out and it is sent again.
 */
static void
land(Database *db)
{
	int i;

	for (i = 0; i < PIPELINE; i++)
	{
		Batch *batch = &db->flights[i];

		if (!batch->used)
			continue;
		if (batch->in_flight > 0)
		{
			if (obx_now_us() >= batch->renew_at && db->conn != NULL)
			{
				renew(db, batch);
				batch->renew_at = obx_now_us() + (long long) obx_config.lease_timeout_s * 1000000 / 3;
			}
			continue;
		}
		/* Not connected (disconnect forgot the complete claim): its lease runs out. */
		if (connect_db(db) && !record(db, batch) && PQstatus(db->conn) != CONNECTION_OK)
			disconnect(db, "the connection broke; the batch's lease runs out and it is sent again");
		batch_free(batch);
		db->nflights--;
	}
}

/*
 * Whether a claim may find something: not when the latest claim took
 * nothing, less than IDLE_CLAIM_US ago, and the current snapshot is still
 * its snapshot.  Every transaction that ends moves the snapshot (it leaves
 * the running ones, or moves xmax), so no event, record, release or
 * operator's retry was committed since, in any database; what becomes
 * claimable with no commit (a lease or a backoff running out) waits for
 * the claim every IDLE_CLAIM_US (in-database workers claim every
 * obx.poll_interval for it).  An idle daemon reads a snapshot per poll_interval
 * instead of claiming.
 */
static bool
anything_new(Database *db, long long now)
{
	PGresult *res;
	bool same;

	if (db->idle_snap == NULL || now - db->claimed_at >= IDLE_CLAIM_US)
		return true;
	if ((res = run(db, "obx_snapshot", NULL, 1)) == NULL)
		return true;
	same = PQgetlength(res, 0, 0) == db->idle_snap_len &&
		   memcmp(PQgetvalue(res, 0, 0), db->idle_snap, db->idle_snap_len) == 0;
	PQclear(res);
	return !same;
}

/*
 * Keep the snapshot of a committed claim that took nothing (its tick row,
 * the last of its rows) for anything_new; forget it after any other.
 */
static void
remember_idle(Database *db, Batch *batch, int taken)
{
	int tick_row;

	free(db->idle_snap);
	db->idle_snap = NULL;
	if (taken != 0)
		return;
	tick_row = PQntuples(batch->rows) - 1;
	db->idle_snap_len = PQgetlength(batch->rows, tick_row, OBX_CLAIM_SNAP_COL - 1);
	db->idle_snap = obx_xcalloc(1, db->idle_snap_len);
	memcpy(db->idle_snap, PQgetvalue(batch->rows, tick_row, OBX_CLAIM_SNAP_COL - 1),
		   db->idle_snap_len);
}

/*
 * Claim and produce the database's next batch when one is due and the
 * pipeline has room: at once after a full claim, claim_gap after the start
 * of one that took events (as the in-database relay's obx.claim_gap), and
 * poll_interval after one that took nothing or found nothing new (the time
 * a claim takes counts).  A batch is claimed while the leases of the
 * batches already out are live, so it holds no event of their keys:
 * per-key order does not depend on which batch is acknowledged first.
 */
static void
launch(Database *db, rd_kafka_t *rk)
{
	Batch *batch = NULL;
	long long started = obx_now_us();
	int taken;
	int i;

	if (db->nflights >= PIPELINE || started < db->claim_at)
		return;
	db->claim_at = started + (long long) obx_config.poll_interval_ms * 1000;
	if (!connect_db(db) || !replica_free(db) || !anything_new(db, started))
		return;
	db->claimed_at = started;
	for (i = 0; i < PIPELINE && batch == NULL; i++)
		if (!db->flights[i].used)
			batch = &db->flights[i];
	taken = claim(db, batch);
	remember_idle(db, batch, taken);
	if (taken <= 0)
	{
		if (PQstatus(db->conn) != CONNECTION_OK)
			disconnect(db, "the connection broke");
		batch_free(batch);
		return;
	}
	batch->used = true;
	db->nflights++;
	db->claim_at = batch->full ? 0 : started + (long long) obx_config.claim_gap_ms * 1000;
	produce(rk, batch);
	batch->renew_at = obx_now_us() + (long long) obx_config.lease_timeout_s * 1000000 / 3;
}

/* Microseconds until the first database's next claim is due, at most max. */
static long long
until_next_claim(Database *dbs, long long max)
{
	long long now = obx_now_us();
	long long wait = max;
	int i;

	for (i = 0; i < obx_config.ndatabases; i++)
	{
		if (dbs[i].nflights >= PIPELINE)
			continue;
		if (dbs[i].claim_at - now < wait)
			wait = dbs[i].claim_at > now ? dbs[i].claim_at - now : 0;
	}
	return wait;
}

static int
in_flight(Database *dbs)
{
	int n = 0;
	int i;

	for (i = 0; i < obx_config.ndatabases; i++)
		n += dbs[i].nflights;
	return n;
}

/* Read the settings file again; a file that does not load changes nothing. */
static void
reload_config(void)
{
	Config next;

	if (config_load(&next, config_file))
	{
		config_free(&obx_config);
		obx_config = next;
		obx_say("LOG", "settings reloaded");
	}
	else
	{
		config_free(&next);
		obx_say("ERROR", "settings not reloaded: the old ones stay");
	}
}

/*
 * run_consumer
 *		The consumer process: the subscriptions (consume.c) until SIGTERM,
 *		or until a SIGHUP's settings name none.  Its own process, so that
 *		a handler that takes long (up to its handler_timeout_ms) holds back
 *		neither the relay's claims nor the renewal of its leases.
 */
static int
run_consumer(void)
{
	while (obx_consume_enabled())
	{
		while (!stop_requested && !reload_requested)
			usleep((useconds_t) obx_consume_serve());
		obx_consume_stop();
		if (stop_requested)
			return 0;
		reload_requested = 0;
		reload_config();
	}
	obx_say("LOG", "no subscription to run: the consumer process stops");
	return 0;
}

/*
 * Start the consumer process when the settings name subscriptions and none
 * runs (or is waiting to be started again): obx-relay itself again, with
 * --consumer.  The exec makes it a process of its own from the start (a
 * fork alone would copy one thread of a process whose librdkafka threads
 * may hold locks).  It dies with the relay, kill -9 included: a daemon is
 * its two processes or none.
 */
static void
consumer_start(void)
{
	pid_t parent = getpid();
	pid_t pid;
	char *const args[] = {"obx-relay", "--consumer", config_file ? "--config" : NULL,
						  (char *) config_file, NULL};

	if (!obx_consume_enabled() || consumer_pid > 0 || stop_requested ||
		obx_now_us() < consumer_start_at)
		return;
	fflush(stderr);
	pid = fork();
	if (pid < 0)
	{
		obx_say("ERROR", "cannot start the consumer process: %s; again in 1 s", strerror(errno));
		consumer_start_at = obx_now_us() + 1000000;
		return;
	}
	if (pid == 0)
	{
		/* Only async-signal-safe calls until the exec. */
		if (prctl(PR_SET_PDEATHSIG, SIGKILL) == 0 && getppid() == parent)
			execv("/proc/self/exe", args);
		_exit(127);
	}
	consumer_pid = pid;
	consumer_started = obx_now_us();
}

/*
 * Whether the consumer process exited (without blocking).  One that died
 * while its subscriptions are still wanted is started again by
 * consumer_start: after a second, doubling up to a minute while each new
 * one dies within a minute.
 */
static void
consumer_reap(void)
{
	int status;
	int delay_s;

	if (consumer_pid <= 0 || waitpid(consumer_pid, &status, WNOHANG) != consumer_pid)
		return;
	consumer_pid = 0;
	if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
		return;
	consumer_deaths = obx_now_us() - consumer_started < 60000000LL ? consumer_deaths + 1 : 1;
	delay_s = consumer_deaths > 6 ? 60 : 1 << (consumer_deaths - 1);
	if (WIFSIGNALED(status))
		obx_say("WARNING", "the consumer process was killed by signal %d; a new one in %d s",
				WTERMSIG(status), delay_s);
	else
		obx_say("WARNING", "the consumer process exited with status %d; a new one in %d s",
				WEXITSTATUS(status), delay_s);
	consumer_start_at = obx_now_us() + delay_s * 1000000LL;
}

/* Stop the consumer process and wait for it; false if it did not stop cleanly. */
static bool
consumer_stop(void)
{
	int status = 0;

	if (consumer_pid <= 0)
		return true;
	kill(consumer_pid, SIGTERM);
	while (waitpid(consumer_pid, &status, 0) < 0 && errno == EINTR)
		;
	consumer_pid = 0;
	if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
		return true;
	obx_say("WARNING", "the consumer process did not stop cleanly");
	return false;
}

/*
 * Serve every database until SIGTERM or SIGHUP, then land the batches
 * still out (their reports come within delivery_timeout) and stop, or
 * read the settings again and go on.  The subscriptions run in a process
 * of their own (run_consumer), started and watched from here.
 */
static int
run_relay(void)
{
	Database dbs[MAX_DATABASES];
	rd_kafka_t *rk;
	int i;

	for (;;)
	{
		memset(dbs, 0, sizeof(dbs));
		for (i = 0; i < obx_config.ndatabases; i++)
			dbs[i].conninfo = obx_config.databases[i];
		rk = kafka_create();
		if (rk == NULL)
			return 1;
		obx_say("LOG", "started: %d database(s), brokers %s", obx_config.ndatabases, obx_config.brokers);
		while ((!stop_requested && !reload_requested) || in_flight(dbs) > 0)
		{
			bool winding_down = stop_requested || reload_requested;
			long long wait;

			for (i = 0; i < obx_config.ndatabases; i++)
			{
				land(&dbs[i]);
				if (!winding_down)
					launch(&dbs[i], rk);
				rotate(&dbs[i]);
			}
			consumer_reap();
			consumer_start();
			/* Sleep in librdkafka until a report comes or a claim is due. */
			wait = winding_down ? 100000 : until_next_claim(dbs, 100000);
			rd_kafka_poll(rk, (int) ((wait + 999) / 1000));
		}
		rd_kafka_flush(rk, obx_config.delivery_timeout_ms);
		rd_kafka_destroy(rk);
		while (nknown_topics > 0)
			free(known_topics[--nknown_topics]);
		for (i = 0; i < obx_config.ndatabases; i++)
		{
			disconnect(&dbs[i], NULL);
			free(dbs[i].replica_problem);
		}
		if (stop_requested)
		{
			bool clean = consumer_stop();

			obx_say("LOG", "stopped");
			return clean ? 0 : 1;
		}
		reload_requested = 0;
		reload_config();
	}
}

/* ---------------------------------------------------------------------
 * --check
 * --------------------------------------------------------------------- */

/*
 * The grants the relay's statements need (docs/security.md, "The
 * workers"), as has_*_privilege checks.
 */
static const char *const grant_checks[][2] = {
	{"USAGE on schema obx", "has_schema_privilege('obx', 'USAGE')"},
	{"SELECT, INSERT on obx.claims", "has_table_privilege('obx.claims', 'SELECT, INSERT')"},
	{"SELECT, INSERT on obx.records", "has_table_privilege('obx.records', 'SELECT, INSERT')"},
	{"SELECT, INSERT on obx.renewals", "has_table_privilege('obx.renewals', 'SELECT, INSERT')"},
	{"SELECT on obx.events", "has_table_privilege('obx.events', 'SELECT')"},
	{"SELECT, INSERT, UPDATE on obx.event_states", "has_table_privilege('obx.event_states', 'SELECT, INSERT, UPDATE')"},
	{"USAGE on obx.lease_seq", "has_sequence_privilege('obx.lease_seq', 'USAGE')"},
	{"EXECUTE on obx._tick()", "has_function_privilege('obx._tick()', 'EXECUTE')"},
	{"EXECUTE on obx._hold(uuid[])", "has_function_privilege('obx._hold(uuid[])', 'EXECUTE')"},
	{"EXECUTE on obx._rotate(float8)", "has_function_privilege('obx._rotate(float8)', 'EXECUTE')"},
	{"EXECUTE on obx._replica_problem()", "has_function_privilege('obx._replica_problem()', 'EXECUTE')"},
	{"EXECUTE on obx._consume(...)", "has_function_privilege('obx._consume(text, text, integer, bigint, text, text[], text[], bytea, timestamptz, integer, integer)', 'EXECUTE')"},
	{"EXECUTE on obx._call_handler(...)", "has_function_privilege('obx._call_handler(regprocedure, obx.inbound_event)', 'EXECUTE')"},
};

/* Whether no logical subscription writes into obx's tables here. */
static bool
check_replica(PGconn *conn)
{
	PGresult *res = PQexec(conn, OBX_SQL_REPLICA_PROBLEM);
	bool ok = PQresultStatus(res) == PGRES_TUPLES_OK && PQgetisnull(res, 0, 0);

	if (PQresultStatus(res) != PGRES_TUPLES_OK)
		printf("FAIL  %s: %s", OBX_SQL_REPLICA_PROBLEM, PQresultErrorMessage(res));
	else if (!ok)
		printf("FAIL  %s: obx-relay claims nothing here while it does (drop the subscription, "
			   "or publish only your own schemas)\n",
			   PQgetvalue(res, 0, 0));
	PQclear(res);
	return ok;
}

static bool
check_database(const char *conninfo)
{
	const char *keys[] = {"application_name", "dbname", NULL};
	const char *values[] = {"obx-relay --check", conninfo, NULL};
	PGconn *conn = PQconnectdbParams(keys, values, 1);
	PGresult *res;
	bool ok = true;
	size_t i;

	if (PQstatus(conn) != CONNECTION_OK)
	{
		printf("FAIL  connect: %s", PQerrorMessage(conn));
		PQfinish(conn);
		return false;
	}
	printf("ok    connected to database \"%s\" on %s as role \"%s\"%s\n", PQdb(conn),
		   PQhost(conn), PQuser(conn), PQsslInUse(conn) ? " over TLS" : "");
	res = PQexec(conn, "SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user");
	if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1 &&
		strcmp(PQgetvalue(res, 0, 0), "t") == 0)
		printf("WARN  role \"%s\" is a superuser: give obx-relay a role with obx_worker's grants only\n",
			   PQuser(conn));
	PQclear(res);
	res = PQexec(conn, "SELECT pg_catalog.obj_description('obx'::pg_catalog.regnamespace, 'pg_namespace'),"
					   " (SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'obx')");
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		printf("FAIL  obx is not installed in this database (no schema obx)\n");
		PQclear(res);
		PQfinish(conn);
		return false;
	}
	if (!PQgetisnull(res, 0, 1))
		printf("ok    obx %s is installed as an extension\n", PQgetvalue(res, 0, 1));
	else
		printf("ok    %s\n", PQgetvalue(res, 0, 0));
	PQclear(res);
	for (i = 0; i < sizeof(grant_checks) / sizeof(grant_checks[0]); i++)
	{
		char sql[256];

		snprintf(sql, sizeof(sql), "SELECT pg_catalog.%s", grant_checks[i][1]);
		res = PQexec(conn, sql);
		if (PQresultStatus(res) != PGRES_TUPLES_OK || strcmp(PQgetvalue(res, 0, 0), "t") != 0)
		{
			printf("FAIL  role \"%s\" lacks %s (GRANT obx_worker TO %s)\n", PQuser(conn),
				   grant_checks[i][0], PQuser(conn));
			ok = false;
		}
		PQclear(res);
	}
	if (ok)
		printf("ok    role \"%s\" holds every grant the relay needs\n", PQuser(conn));
	ok &= check_replica(conn);
	ok &= obx_consume_check(conn);
	PQfinish(conn);
	return ok;
}

static bool
check_brokers(void)
{
	rd_kafka_t *rk;
	const struct rd_kafka_metadata *md;
	rd_kafka_resp_err_t err;

	rk = kafka_create();
	if (rk == NULL)
	{
		printf("FAIL  the Kafka settings are refused (above)\n");
		return false;
	}
	err = rd_kafka_metadata(rk, 0, NULL, &md, 10000);
	if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		printf("FAIL  brokers %s: %s\n", obx_config.brokers, rd_kafka_err2str(err));
		rd_kafka_destroy(rk);
		return false;
	}
	printf("ok    brokers %s answer: %d broker(s) in the cluster\n", obx_config.brokers, md->broker_cnt);
	rd_kafka_metadata_destroy(md);
	rd_kafka_destroy(rk);
	return true;
}

static int
check(void)
{
	bool ok = true;
	int i;

	for (i = 0; i < obx_config.ndatabases; i++)
		ok &= check_database(obx_config.databases[i]);
	ok &= check_brokers();
	printf("%s\n", ok ? "obx-relay --check: ok" : "obx-relay --check: FAILED");
	return ok ? 0 : 1;
}

static void
usage(void)
{
	fprintf(stderr,
			"obx-relay publishes obx's outbox to Kafka from outside the database,\n"
			"and runs the subscriptions its settings name.\n\n"
			"Usage: obx-relay [--config FILE] [--check]\n\n"
			"  --config FILE  settings, one \"name = value\" per line; OBX_RELAY_<NAME>\n"
			"                 in the environment overrides them\n"
			"  --check        check the databases, the role's grants and the brokers, then exit\n\n"
			"Settings: docs/operations.md, \"Managed PostgreSQL\".\n");
}

int
main(int argc, char **argv)
{
	bool check_only = false;
	bool consumer_only = false;
	struct sigaction sa;
	int i;

	for (i = 1; i < argc; i++)
	{
		if (strcmp(argv[i], "--config") == 0 && i + 1 < argc)
			config_file = argv[++i];
		else if (strcmp(argv[i], "--check") == 0)
			check_only = true;
		else if (strcmp(argv[i], "--consumer") == 0)
			consumer_only = true; /* the consumer process (consumer_start) */
		else
		{
			usage();
			return strcmp(argv[i], "--help") == 0 ? 0 : 2;
		}
	}
	if (!config_load(&obx_config, config_file))
		return 2;
	if (check_only)
		return check();

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_stop;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sa.sa_handler = on_reload;
	sigaction(SIGHUP, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	if (consumer_only)
	{
		obx_say("LOG", "consumer process started");
		return run_consumer();
	}
	return run_relay();
}
