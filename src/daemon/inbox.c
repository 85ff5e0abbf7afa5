/*-------------------------------------------------------------------------
 *
 * inbox.c
 *	  One message of a subscription obx-relay's consumer runs: applied by
 *	  obx._consume (obx--1.1--1.2.sql: mark, handler, dead letter,
 *	  progress, as the consumer workers' src/consumer/inbox.c does) in a
 *	  transaction of its own, over the subscription's session, prepared
 *	  here.
 *
 * The order of a message's steps is what the guarantees rest on:
 *
 *	  poll (no transaction open) -> SELECT obx._consume(...) (one implicit
 *	  transaction: mark, handler, dead letter, progress; committed with
 *	  synchronous_commit = on) -> only after it returned: store the offset
 *	  past the message (enable.auto.offset.store = false; auto-commit sends
 *	  it)
 *
 * A message that cannot be applied now holds its partition (held.c).
 *
 * One connection per subscription: a handler runs in the daemon's session
 * (as its owner, through SECURITY DEFINER), and a SET it makes lasts for
 * the session; only its own subscription can meet it there.
 *
 *-------------------------------------------------------------------------
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>

#include "daemon.h"
#include "held.h"
#include "inbox.h"
#include "settings.h"

static const char *consume_sql =
	"SELECT c.result, c.error FROM obx._consume($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) c";

static const Oid consume_types[11] = {TEXTOID, TEXTOID, INT4OID, INT8OID, TEXTOID,
									  TEXTARRAYOID, TEXTARRAYOID, BYTEAOID, TIMESTAMPTZOID,
									  INT4OID, INT4OID};

/*
 * The subscription's session, with obx._consume prepared and the
 * subscription's handler_timeout_ms as its statement_timeout; false if
 * not now (again in a second, or five when obx._consume cannot be
 * prepared).
 */
bool
obx_inbox_connect(Sub *s)
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
		/* Past handler_timeout_ms: dead-lettered without a call (src/consumer/handler.c). */
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
		obx_partition_list(rd_kafka_topic_name(m->rkt), m->partition, m->offset + 1);
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
bool
obx_inbox_serve(Sub *s, const rd_kafka_message_t *m)
{
	const char *topic = rd_kafka_topic_name(m->rkt);
	Held *h;
	char *error = NULL;
	char *result;

	if (!obx_held_take(s, m))
		return true;
	h = obx_held_find(s, topic, m->partition);
	result = apply(s, m, h != NULL && h->offset == m->offset ? h->handler_failures : 0, &error);
	if (result == NULL)
	{
		obx_hold(s, m, false);
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
		obx_hold(s, m, by_handler);
	}
	else
	{
		if (strcmp(result, "dead letter") == 0)
			obx_say("WARNING", "consumer group \"%s\", topic \"%s\", partition %d, offset %lld: message dead-lettered: %s",
					s->name, topic, (int) m->partition, (long long) m->offset,
					error ? error : "");
		store_offset(s, m);
		if (h != NULL && h->offset <= m->offset)
			obx_held_release(s, h);
	}
	free(result);
	free(error);
	return true;
}
