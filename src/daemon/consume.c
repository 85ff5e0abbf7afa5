/*-------------------------------------------------------------------------
 *
 * consume.c
 *	  obx-relay's consumer: the subscriptions of its databases that the
 *	  setting "subscriptions" names ("*": all), each read by a librdkafka
 *	  consumer in the group the consumer workers use (the subscription's
 *	  name) and applied one message per transaction by obx._consume
 *	  (obx--1.0--1.1.sql) over a connection of its own.
 *
 * The order of a message's steps is what the guarantees rest on:
 *
 *	  poll (no transaction open) -> SELECT obx._consume(...) (one implicit
 *	  transaction: mark, handler, dead letter, progress; committed with
 *	  synchronous_commit = on) -> only after it returned: store the offset
 *	  past the message (enable.auto.offset.store = false; auto-commit sends
 *	  it)
 *
 * A message whose call failed (the connection broke, obx's statements
 * failed), whose handler failed transiently ("retry") or whose
 * subscription cannot be served now ("refused") holds its partition: it
 * is paused and sought back to that message, and resumed after a backoff
 * (backoff_min doubling up to backoff_max), so no later message of the
 * partition overtakes it.  The rules are docs/consumers.md's, "Consuming
 * with obx-relay".
 *
 * One connection per subscription: a handler runs in the daemon's session
 * (as its owner, through SECURITY DEFINER), and a SET it makes lasts for
 * the session; only its own subscription can meet it there.
 *
 *-------------------------------------------------------------------------
 */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "consume.h"
#include "daemon.h"
#include "protocol.h"
#include "settings.h"

/* Messages applied per subscription before the next one gets a turn. */
#define TURN_MESSAGES 200
/* How often the subscriptions are read again, and the longest nap. */
#define REFRESH_US    1000000LL
#define POLL_US       10000LL
#define SEEK_TIMEOUT  5000

/* A partition held back on one message: paused until resume_at. */
typedef struct Held
{
	char *topic;
	int partition;
	long long offset;
	long long resume_at; /* 0: resumed, waiting for the message */
	int attempts;
	int handler_failures;
	struct Held *next;
} Held;

typedef struct Sub
{
	int db;
	char *name;
	char *signature; /* what the consumer was built from */
	int timeout_ms;  /* handler_timeout_ms: the session's statement_timeout */
	rd_kafka_t *rk;
	PGconn *conn;
	long long retry_at; /* when to try to connect or build again */
	Held *held;
	long long refused_logged_at; /* a refusal is logged once a minute */
	bool listed;
	struct Sub *next;
} Sub;

static Sub *subs = NULL;
static PGconn *control[MAX_DATABASES];
static long long control_retry_at[MAX_DATABASES];
static long long replica_check_at[MAX_DATABASES]; /* obx._replica_problem's next reading */
static char *replica_problem[MAX_DATABASES];      /* its latest answer, or NULL */
static long long refresh_at = 0;

static const char *list_sql =
	"SELECT s.consumer_name, pg_catalog.array_to_string(s.topics, ','),"
	"       coalesce(s.options OPERATOR(pg_catalog.->>) 'start', 'earliest'),"
	"       coalesce((SELECT pg_catalog.string_agg(k.key OPERATOR(pg_catalog.||) '='"
	"                                              OPERATOR(pg_catalog.||) k.value, E'\\n'"
	"                                              ORDER BY k.key)"
	"                   FROM pg_catalog.jsonb_each_text(s.options OPERATOR(pg_catalog.->) 'kafka') k"
	"                  WHERE k.key IN (SELECT obx.subscription_kafka_properties())), ''),"
	"       s.updated_at::pg_catalog.text, obx._subscription_problem(s),"
	"       coalesce(s.options OPERATOR(pg_catalog.->>) 'handler_timeout_ms', '30000')"
	"  FROM obx.subscriptions s ORDER BY 1";

static const char *consume_sql =
	"SELECT c.result, c.error FROM obx._consume($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) c";

static const Oid consume_types[11] = {TEXTOID, TEXTOID, INT4OID, INT8OID, TEXTOID,
									  TEXTARRAYOID, TEXTARRAYOID, BYTEAOID, TIMESTAMPTZOID,
									  INT4OID, INT4OID};

bool
obx_consume_enabled(void)
{
	return obx_config.subscriptions != NULL;
}

/* Whether the setting "subscriptions" names this one. */
static bool
wanted(const char *name)
{
	const char *p = obx_config.subscriptions;
	size_t len = strlen(name);

	if (p == NULL)
		return false;
	while (*p)
	{
		const char *end;
		const char *last;

		while (*p == ' ' || *p == ',')
			p++;
		end = p;
		while (*end && *end != ',')
			end++;
		last = end;
		while (last > p && last[-1] == ' ')
			last--;
		if ((last - p == 1 && *p == '*') ||
			((size_t) (last - p) == len && strncmp(p, name, len) == 0))
			return true;
		p = end;
	}
	return false;
}

/*
 * obx_consume_check
 *		For --check: whether each subscription this daemon runs in the
 *		database of conn has a handler it may call
 *		(obx._daemon_handler_problem); one line each.
 */
bool
obx_consume_check(PGconn *conn)
{
	PGresult *res;
	bool ok = true;
	int i;

	if (!obx_consume_enabled())
		return true;
	res = PQexec(conn, "SELECT s.consumer_name,"
					   "       obx._daemon_handler_problem(s, obx._handler(s))"
					   "  FROM obx.subscriptions s ORDER BY 1");
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		printf("FAIL  the subscriptions cannot be read: %s", PQresultErrorMessage(res));
		PQclear(res);
		return false;
	}
	for (i = 0; i < PQntuples(res); i++)
	{
		const char *name = PQgetvalue(res, i, 0);

		if (!wanted(name))
			continue;
		if (PQgetisnull(res, i, 1))
			printf("ok    subscription \"%s\": its handler may be called\n", name);
		else
		{
			printf("FAIL  subscription \"%s\": %s\n", name, PQgetvalue(res, i, 1));
			ok = false;
		}
	}
	PQclear(res);
	return ok;
}

/* ---------------------------------------------------------------------
 * Held partitions (src/consumer/held.c)
 * --------------------------------------------------------------------- */

static Held *
held_find(Sub *s, const char *topic, int partition)
{
	Held *h;

	for (h = s->held; h != NULL; h = h->next)
		if (h->partition == partition && strcmp(h->topic, topic) == 0)
			return h;
	return NULL;
}

static void
held_release(Sub *s, Held *h)
{
	Held **p;

	for (p = &s->held; *p != NULL; p = &(*p)->next)
		if (*p == h)
		{
			*p = h->next;
			free(h->topic);
			free(h);
			return;
		}
}

static rd_kafka_topic_partition_list_t *
one_partition(const char *topic, int partition, long long offset)
{
	rd_kafka_topic_partition_list_t *list = rd_kafka_topic_partition_list_new(1);

	rd_kafka_topic_partition_list_add(list, topic, partition)->offset = offset;
	return list;
}

/* Stop fetching the partition; its next message is the held one. */
static void
hold_back(Sub *s, Held *h)
{
	rd_kafka_topic_partition_list_t *list = one_partition(h->topic, h->partition, h->offset);
	rd_kafka_error_t *error;

	rd_kafka_pause_partitions(s->rk, list);
	error = rd_kafka_seek_partitions(s->rk, list, SEEK_TIMEOUT);
	if (error != NULL)
	{
		/* No longer ours: whoever gets it starts at or before this message. */
		obx_say("LOG", "consumer group \"%s\": could not seek topic \"%s\" partition %d to offset %lld: %s",
				s->name, h->topic, h->partition, h->offset, rd_kafka_error_string(error));
		rd_kafka_error_destroy(error);
	}
	rd_kafka_topic_partition_list_destroy(list);
}

/* Hold the message's partition back for a backoff. */
static void
hold(Sub *s, const rd_kafka_message_t *m, bool by_handler)
{
	const char *topic = rd_kafka_topic_name(m->rkt);
	Held *h = held_find(s, topic, m->partition);
	long long ms = obx_config.backoff_min_ms;
	int i;

	if (h == NULL)
	{
		h = obx_xcalloc(1, sizeof(Held));
		h->topic = obx_xstrdup(topic);
		h->partition = m->partition;
		h->next = s->held;
		s->held = h;
	}
	if (h->offset != m->offset)
		h->attempts = h->handler_failures = 0;
	h->offset = m->offset;
	h->attempts++;
	h->handler_failures += by_handler;
	for (i = 1; i < h->attempts && ms < obx_config.backoff_max_ms; i++)
		ms *= 2;
	if (ms > obx_config.backoff_max_ms)
		ms = obx_config.backoff_max_ms;
	hold_back(s, h);
	h->resume_at = obx_now_us() + ms * 1000;
}

static void
resume_due(Sub *s)
{
	long long now = obx_now_us();
	Held *h;

	for (h = s->held; h != NULL; h = h->next)
	{
		rd_kafka_topic_partition_list_t *list;

		if (h->resume_at == 0 || now < h->resume_at)
			continue;
		h->resume_at = 0;
		list = one_partition(h->topic, h->partition, h->offset);
		rd_kafka_resume_partitions(s->rk, list);
		rd_kafka_topic_partition_list_destroy(list);
	}
}

/*
 * Whether to apply a polled message: not while its partition waits, nor
 * one past the held message (fetched before the seek; every message before
 * the held one was applied, so dropping it loses nothing).
 */
static bool
take(Sub *s, const rd_kafka_message_t *m)
{
	Held *h = held_find(s, rd_kafka_topic_name(m->rkt), m->partition);

	if (h == NULL)
		return true;
	if (h->resume_at != 0 || m->offset > h->offset)
	{
		if (h->resume_at == 0)
		{
			hold_back(s, h);
			h->resume_at = obx_now_us();
		}
		return false;
	}
	return true;
}

/* ---------------------------------------------------------------------
 * One message
 * --------------------------------------------------------------------- */

/* Whether len bytes are valid UTF-8 without a zero byte (pg_verifymbstr). */
static bool
valid_utf8(const unsigned char *p, size_t len)
{
	size_t i = 0;

	while (i < len)
	{
		unsigned char c = p[i];
		int n;
		unsigned int cp;
		int k;

		if (c == 0)
			return false;
		if (c < 0x80)
		{
			i++;
			continue;
		}
		if ((c & 0xE0) == 0xC0)
			n = 1, cp = c & 0x1F;
		else if ((c & 0xF0) == 0xE0)
			n = 2, cp = c & 0x0F;
		else if ((c & 0xF8) == 0xF0)
			n = 3, cp = c & 0x07;
		else
			return false;
		if (i + n >= len)
			return false;
		for (k = 1; k <= n; k++)
		{
			if ((p[i + k] & 0xC0) != 0x80)
				return false;
			cp = (cp << 6) | (p[i + k] & 0x3F);
		}
		if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) ||
			cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
			return false;
		i += n + 1;
	}
	return true;
}

/*
 * A key or header value as the handler gets it (src/consumer/inbound.c,
 * as_text): itself when valid UTF-8, else "\x" and its bytes in hex.
 * Malloc'd.
 */
static char *
as_text(const void *data, size_t len)
{
	const unsigned char *p = data;
	char *out;
	size_t i;

	if (valid_utf8(p, len))
	{
		out = obx_xcalloc(len + 1, 1);
		memcpy(out, p, len);
		return out;
	}
	out = obx_xcalloc(2 * len + 3, 1);
	strcpy(out, "\\x");
	for (i = 0; i < len; i++)
		sprintf(out + 2 + 2 * i, "%02x", p[i]);
	return out;
}

/* The message's headers as two text[] parameters, in binary. */
static void
header_arrays(const rd_kafka_message_t *m, Buf *names, Buf *values)
{
	rd_kafka_headers_t *hdrs = NULL;
	size_t n = 0;
	size_t i;

	if (rd_kafka_message_headers(m, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR)
		n = rd_kafka_header_cnt(hdrs);
	obx_array_start(names, TEXTOID, (int) n);
	obx_array_start(values, TEXTOID, (int) n);
	for (i = 0; i < n; i++)
	{
		const char *name;
		const void *val;
		size_t size;
		char *text;

		rd_kafka_header_get_all(hdrs, i, &name, &val, &size);
		text = as_text(name, strlen(name));
		obx_array_item(names, text, strlen(text));
		free(text);
		if (val == NULL)
			obx_buf_be32(values, (uint32_t) -1); /* a null element */
		else
		{
			text = as_text(val, size);
			obx_array_item(values, text, strlen(text));
			free(text);
		}
	}
}

/*
 * Whether a call failed by the session's statement_timeout, the
 * subscription's handler_timeout_ms: cancelled (57014) once that long had
 * passed.  A cancel before it (pg_cancel_backend) is transient.
 */
static bool
timed_out_call(Sub *s, const PGresult *res, long long started)
{
	const char *code = PQresultErrorField(res, PG_DIAG_SQLSTATE);

	return s->timeout_ms > 0 && PQresultStatus(res) == PGRES_FATAL_ERROR && code != NULL &&
		   strcmp(code, "57014") == 0 && PQstatus(s->conn) == CONNECTION_OK &&
		   obx_now_us() - started >= (long long) s->timeout_ms * 1000;
}

/*
 * Apply the message in a transaction of its own: obx._consume's result
 * ("processed", "duplicate", "dead letter", "retry", "refused"), or NULL
 * when the call failed (said why).  *error gets its error (malloc'd).
 */
static char *
apply(Sub *s, const rd_kafka_message_t *m, int handler_failures, char **error)
{
	char partition[16], offset[24], failures[16], timed_out[16], stamp[48];
	char *key = m->key != NULL ? as_text(m->key, m->key_len) : NULL;
	Buf names = {0}, values = {0};
	const char *params[11];
	int lengths[11] = {0};
	int formats[11] = {0};
	long long started;
	rd_kafka_timestamp_type_t tstype;
	long long ts = rd_kafka_message_timestamp(m, &tstype);
	PGresult *res;
	char *result = NULL;

	header_arrays(m, &names, &values);
	snprintf(partition, sizeof(partition), "%d", (int) m->partition);
	snprintf(offset, sizeof(offset), "%lld", (long long) m->offset);
	snprintf(failures, sizeof(failures), "%d", handler_failures);
	if (ts >= 0)
	{
		time_t secs = (time_t) (ts / 1000);
		struct tm tm;

		gmtime_r(&secs, &tm);
		strftime(stamp, sizeof(stamp), "%Y-%m-%d %H:%M:%S", &tm);
		snprintf(stamp + strlen(stamp), sizeof(stamp) - strlen(stamp), ".%03d+00",
				 (int) (ts % 1000));
	}
	params[0] = s->name;
	params[1] = rd_kafka_topic_name(m->rkt);
	params[2] = partition;
	params[3] = offset;
	params[4] = key;
	params[5] = names.data;
	lengths[5] = (int) names.len;
	formats[5] = 1;
	params[6] = values.data;
	lengths[6] = (int) values.len;
	formats[6] = 1;
	params[7] = m->payload;
	lengths[7] = (int) m->len;
	formats[7] = 1;
	params[8] = ts >= 0 ? stamp : NULL;
	params[9] = failures;
	params[10] = "0";
	started = obx_now_us();
	res = PQexecPrepared(s->conn, "obx_consume", 11, params, lengths, formats, 0);
	if (timed_out_call(s, res, started))
	{
		/* Past handler_timeout_ms: dead-lettered without a call (handler.c). */
		PQclear(res);
		snprintf(timed_out, sizeof(timed_out), "%d", s->timeout_ms);
		params[10] = timed_out;
		res = PQexecPrepared(s->conn, "obx_consume", 11, params, lengths, formats, 0);
	}
	*error = NULL;
	if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
	{
		result = obx_xstrdup(PQgetvalue(res, 0, 0));
		if (!PQgetisnull(res, 0, 1))
			*error = obx_xstrdup(PQgetvalue(res, 0, 1));
	}
	else
		obx_say("WARNING", "consumer group \"%s\", topic \"%s\", partition %d, offset %lld: obx._consume failed: %s",
				s->name, params[1], (int) m->partition, (long long) m->offset,
				PQresultErrorMessage(res));
	PQclear(res);
	free(key);
	free(names.data);
	free(values.data);
	return result;
}

/* The offset past the message, for auto-commit: only after its commit. */
static void
store_offset(Sub *s, const rd_kafka_message_t *m)
{
	rd_kafka_topic_partition_list_t *list =
		one_partition(rd_kafka_topic_name(m->rkt), m->partition, m->offset + 1);
	rd_kafka_resp_err_t err = rd_kafka_offsets_store(s->rk, list);

	if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
		obx_say("LOG", "consumer group \"%s\": offset of topic \"%s\" partition %d not stored: %s",
				s->name, rd_kafka_topic_name(m->rkt), (int) m->partition, rd_kafka_err2str(err));
	rd_kafka_topic_partition_list_destroy(list);
}

/*
 * One polled message: applied and its offset stored, or its partition
 * held.  False when the subscription's session broke (dropped: a new one
 * is made in a second).
 */
static bool
serve_message(Sub *s, const rd_kafka_message_t *m)
{
	const char *topic = rd_kafka_topic_name(m->rkt);
	Held *h;
	char *error = NULL;
	char *result;

	if (!take(s, m))
		return true;
	h = held_find(s, topic, m->partition);
	result = apply(s, m, h != NULL && h->offset == m->offset ? h->handler_failures : 0, &error);
	if (result == NULL)
	{
		hold(s, m, false);
		if (PQstatus(s->conn) != CONNECTION_OK)
			return false;
	}
	else if (strcmp(result, "retry") == 0 || strcmp(result, "refused") == 0)
	{
		bool by_handler = strcmp(result, "retry") == 0;

		if (by_handler || obx_now_us() - s->refused_logged_at >= 60000000LL)
			obx_say(by_handler ? "LOG" : "ERROR",
					"consumer group \"%s\", topic \"%s\", partition %d, offset %lld: %s (the partition waits, then tries again)",
					s->name, topic, (int) m->partition, (long long) m->offset,
					error ? error : result);
		if (!by_handler && obx_now_us() - s->refused_logged_at >= 60000000LL)
			s->refused_logged_at = obx_now_us();
		hold(s, m, by_handler);
	}
	else
	{
		if (strcmp(result, "dead letter") == 0)
			obx_say("WARNING", "consumer group \"%s\", topic \"%s\", partition %d, offset %lld: message dead-lettered: %s",
					s->name, topic, (int) m->partition, (long long) m->offset,
					error ? error : "");
		store_offset(s, m);
		if (h != NULL && h->offset <= m->offset)
			held_release(s, h);
	}
	free(result);
	free(error);
	return true;
}

/* ---------------------------------------------------------------------
 * Subscriptions and their consumers
 * --------------------------------------------------------------------- */

static void
sub_close(Sub *s)
{
	while (s->held != NULL)
		held_release(s, s->held);
	if (s->rk != NULL)
	{
		/* Leaves the group, committing the offsets stored. */
		rd_kafka_consumer_close(s->rk);
		rd_kafka_destroy(s->rk);
		s->rk = NULL;
	}
	if (s->conn != NULL)
		PQfinish(s->conn);
	s->conn = NULL;
}

static void
sub_free(Sub *s)
{
	sub_close(s);
	free(s->name);
	free(s->signature);
	free(s);
}

/*
 * Build the subscription's consumer as the consumer workers do
 * (src/consumer/consumer_group.c): obx's defaults, the daemon's Kafka
 * properties, the subscription's own (only those it may set: the listing
 * keeps no other), then what the guarantees rest on.
 */
static bool
sub_build(Sub *s, const char *topics, const char *start, const char *kafka)
{
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	rd_kafka_topic_partition_list_t *list;
	char *copy;
	char *line;
	char *save = NULL;
	char err[512];
	bool ok;
	int i;

	ok = obx_kafka_set(conf, "bootstrap.servers", obx_config.brokers) &&
		 obx_kafka_set(conf, "client.id", "obx-relay-consumer") &&
		 obx_kafka_set(conf, "auto.offset.reset", start) &&
		 obx_kafka_set(conf, "auto.commit.interval.ms", "1000") &&
		 obx_kafka_set(conf, "session.timeout.ms", "10000") &&
		 obx_kafka_set(conf, "topic.metadata.refresh.interval.ms", "10000");
	for (i = 0; ok && i < obx_config.nkafka; i++)
		ok = obx_kafka_set(conf, obx_config.kafka_names[i], obx_config.kafka_values[i]);
	copy = obx_xstrdup(kafka);
	for (line = strtok_r(copy, "\n", &save); ok && line != NULL;
		 line = strtok_r(NULL, "\n", &save))
	{
		char *eq = strchr(line, '=');

		if (eq == NULL)
			continue;
		*eq = '\0';
		ok = obx_kafka_set(conf, line, eq + 1);
	}
	free(copy);
	ok = ok && obx_kafka_set(conf, "group.id", s->name) &&
		 obx_kafka_set(conf, "enable.auto.offset.store", "false") &&
		 obx_kafka_set(conf, "enable.partition.eof", "false");
	if (!ok)
	{
		rd_kafka_conf_destroy(conf);
		return false;
	}
	s->rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof(err));
	if (s->rk == NULL)
	{
		obx_say("ERROR", "consumer group \"%s\": could not create the Kafka consumer: %s",
				s->name, err);
		return false;
	}
	rd_kafka_poll_set_consumer(s->rk);
	list = rd_kafka_topic_partition_list_new(4);
	copy = obx_xstrdup(topics);
	for (line = strtok_r(copy, ",", &save); line != NULL; line = strtok_r(NULL, ",", &save))
		rd_kafka_topic_partition_list_add(list, line, RD_KAFKA_PARTITION_UA);
	free(copy);
	if (rd_kafka_subscribe(s->rk, list) != RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		obx_say("ERROR", "consumer group \"%s\": could not subscribe", s->name);
		rd_kafka_topic_partition_list_destroy(list);
		return false;
	}
	rd_kafka_topic_partition_list_destroy(list);
	return true;
}

/* The subscription's session, with obx._consume prepared. */
static bool
sub_connect(Sub *s)
{
	PGresult *res;

	if (s->conn != NULL)
		return true;
	if (obx_now_us() < s->retry_at)
		return false;
	s->retry_at = obx_now_us() + 1000000;
	s->conn = obx_session_open(obx_config.databases[s->db], "obx-relay consumer", s->name);
	if (s->conn == NULL)
		return false;
	res = PQprepare(s->conn, "obx_consume", consume_sql, 11, consume_types);
	if (PQresultStatus(res) != PGRES_COMMAND_OK)
	{
		obx_say("ERROR", "consumer group \"%s\": could not prepare obx._consume: %s",
				s->name, PQresultErrorMessage(res));
		PQclear(res);
		PQfinish(s->conn);
		s->conn = NULL;
		s->retry_at = obx_now_us() + 5000000;
		return false;
	}
	PQclear(res);
	{
		char ms[16];
		const char *params[1] = {ms};

		snprintf(ms, sizeof(ms), "%d", s->timeout_ms);
		res = PQexecParams(s->conn, "SELECT pg_catalog.set_config('statement_timeout', $1, false)",
						   1, NULL, params, NULL, NULL, 0);
		if (PQresultStatus(res) != PGRES_TUPLES_OK)
			obx_say("ERROR", "consumer group \"%s\": could not set its handler timeout: %s",
					s->name, PQresultErrorMessage(res));
		PQclear(res);
	}
	return true;
}

static Sub *
sub_find(int db, const char *name)
{
	Sub *s;

	for (s = subs; s != NULL; s = s->next)
		if (s->db == db && strcmp(s->name, name) == 0)
			return s;
	return NULL;
}

/* One row of the listing: a consumer for it, new or rebuilt if changed. */
static void
sub_listed(int db, PGresult *res, int row)
{
	const char *name = PQgetvalue(res, row, 0);
	const char *topics = PQgetvalue(res, row, 1);
	const char *start = PQgetvalue(res, row, 2);
	const char *kafka = PQgetvalue(res, row, 3);
	const char *timeout = PQgetvalue(res, row, 6);
	char *signature = obx_xcalloc(strlen(topics) + strlen(start) + strlen(kafka) +
									  strlen(PQgetvalue(res, row, 4)) + strlen(timeout) + 5,
								  1);
	Sub *s = sub_find(db, name);

	sprintf(signature, "%s|%s|%s|%s|%s", topics, start, kafka, PQgetvalue(res, row, 4),
			timeout);
	if (s != NULL && strcmp(s->signature, signature) == 0)
	{
		s->listed = true;
		free(signature);
		return;
	}
	if (s == NULL)
	{
		s = obx_xcalloc(1, sizeof(Sub));
		s->db = db;
		s->name = obx_xstrdup(name);
		s->next = subs;
		subs = s;
		obx_say("LOG", "consuming subscription \"%s\" (topics %s)", name, topics);
	}
	else
	{
		sub_close(s);
		free(s->signature);
		obx_say("LOG", "subscription \"%s\" changed: its consumer rejoins the group", name);
	}
	s->signature = signature;
	s->timeout_ms = atoi(timeout);
	s->listed = true;
	if (!sub_build(s, topics, start, kafka))
		sub_close(s);
}

/*
 * Whether the database's subscriptions may be consumed: not while a
 * logical replication subscription writes into obx's tables there
 * (obx._replica_problem, read every OBX_REPLICA_CHECK_MS, as the consumer
 * workers do: src/consumer/consumer.c says why).  Says why once, when the
 * reason appears or changes, and when it goes.
 */
static bool
replica_free(int db)
{
	PGresult *res;
	bool free_of_it;

	if (obx_now_us() < replica_check_at[db])
		return replica_problem[db] == NULL;
	res = PQexec(control[db], OBX_SQL_REPLICA_PROBLEM);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		obx_say("ERROR", "could not check for a logical subscription: %s",
				PQresultErrorMessage(res));
		PQclear(res);
		return false;
	}
	replica_check_at[db] = obx_now_us() + (long long) OBX_REPLICA_CHECK_MS * 1000;
	free_of_it = obx_replica_note(&replica_problem[db], res, PQdb(control[db]), "consumes nothing",
								  "its subscriptions are copies; the consumers of the database "
								  "they come from apply their messages",
								  "consumes again");
	PQclear(res);
	return free_of_it;
}

/* Close and forget the consumers of a database's subscriptions. */
static void
drop_subs(int db)
{
	Sub **p;
	Sub *s;

	for (p = &subs; (s = *p) != NULL;)
	{
		if (s->db == db)
		{
			*p = s->next;
			sub_free(s);
		}
		else
			p = &s->next;
	}
}

/*
 * Read the database's subscriptions; false if it cannot be read now.  On
 * a logical replica of obx's tables none is consumed (replica_free).
 */
static bool
refresh_db(int db)
{
	PGresult *res;
	int i;

	if (control[db] == NULL)
	{
		if (obx_now_us() < control_retry_at[db])
			return false;
		control_retry_at[db] = obx_now_us() + 1000000;
		control[db] = obx_session_open(obx_config.databases[db], "obx-relay consumer",
									   "subscriptions");
		if (control[db] == NULL)
			return false;
	}
	if (!replica_free(db))
	{
		/* Not when the check failed: a broken session is no replica. */
		if (replica_problem[db] != NULL)
			drop_subs(db);
		if (PQstatus(control[db]) != CONNECTION_OK)
		{
			PQfinish(control[db]);
			control[db] = NULL;
		}
		return false;
	}
	res = PQexec(control[db], list_sql);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		obx_say("ERROR", "could not read obx.subscriptions: %s", PQresultErrorMessage(res));
		PQclear(res);
		if (PQstatus(control[db]) != CONNECTION_OK)
		{
			PQfinish(control[db]);
			control[db] = NULL;
		}
		return false;
	}
	for (i = 0; i < PQntuples(res); i++)
	{
		if (!wanted(PQgetvalue(res, i, 0)))
			continue;
		if (!PQgetisnull(res, i, 5))
		{
			Sub *s = sub_find(db, PQgetvalue(res, i, 0));

			if (s == NULL || s->rk != NULL)
				obx_say("ERROR", "subscription \"%s\" cannot be consumed: %s",
						PQgetvalue(res, i, 0), PQgetvalue(res, i, 5));
			if (s != NULL)
			{
				sub_close(s);
				s->listed = true;
			}
			else
			{
				/* Kept, without a consumer, so that it is said once. */
				s = obx_xcalloc(1, sizeof(Sub));
				s->db = db;
				s->name = obx_xstrdup(PQgetvalue(res, i, 0));
				s->signature = obx_xstrdup("");
				s->listed = true;
				s->next = subs;
				subs = s;
			}
			continue;
		}
		sub_listed(db, res, i);
	}
	PQclear(res);
	return true;
}

/* Read every database's subscriptions: new consumers, gone ones closed. */
static void
refresh(void)
{
	bool read[MAX_DATABASES];
	Sub **p;
	Sub *s;
	int db;

	for (s = subs; s != NULL; s = s->next)
		s->listed = false;
	for (db = 0; db < obx_config.ndatabases; db++)
		read[db] = refresh_db(db);
	for (p = &subs; (s = *p) != NULL;)
	{
		if (!s->listed && read[s->db])
		{
			obx_say("LOG", "subscription \"%s\" is gone: its consumer leaves the group", s->name);
			*p = s->next;
			sub_free(s);
		}
		else
			p = &s->next;
	}
}

/* A turn of one subscription: up to TURN_MESSAGES messages. */
static void
serve_sub(Sub *s)
{
	int n;

	if (s->rk == NULL || !sub_connect(s))
		return;
	resume_due(s);
	for (n = 0; n < TURN_MESSAGES; n++)
	{
		rd_kafka_message_t *m = rd_kafka_consumer_poll(s->rk, 0);
		bool ok;

		if (m == NULL)
			break;
		if (m->err != RD_KAFKA_RESP_ERR_NO_ERROR)
		{
			obx_say("WARNING", "consumer group \"%s\": %s", s->name, rd_kafka_message_errstr(m));
			rd_kafka_message_destroy(m);
			continue;
		}
		ok = serve_message(s, m);
		rd_kafka_message_destroy(m);
		if (!ok)
		{
			obx_say("LOG", "consumer group \"%s\": the session broke; a new one in 1 s", s->name);
			PQfinish(s->conn);
			s->conn = NULL;
			break;
		}
	}
}

/*
 * obx_consume_serve
 *		One pass over the subscriptions: read them again every second,
 *		then give each consumer a turn.  Returns how long the consumer
 *		process may sleep before the next pass, in microseconds.
 */
long long
obx_consume_serve(void)
{
	Sub *s;

	if (obx_now_us() >= refresh_at)
	{
		refresh();
		refresh_at = obx_now_us() + REFRESH_US;
	}
	for (s = subs; s != NULL; s = s->next)
		serve_sub(s);
	return POLL_US;
}

/*
 * obx_consume_stop
 *		Close every consumer (leaving their groups, committing the offsets
 *		stored) and session: on SIGTERM and before a reload.
 */
void
obx_consume_stop(void)
{
	int db;

	while (subs != NULL)
	{
		Sub *s = subs;

		subs = s->next;
		sub_free(s);
	}
	for (db = 0; db < MAX_DATABASES; db++)
	{
		if (control[db] != NULL)
		{
			PQfinish(control[db]);
			control[db] = NULL;
		}
		free(replica_problem[db]);
		replica_problem[db] = NULL;
		replica_check_at[db] = 0;
	}
	refresh_at = 0;
}
