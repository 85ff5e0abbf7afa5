/*-------------------------------------------------------------------------
 *
 * daemon.c
 *	  What every file of obx-relay stands on (daemon.h): its log, memory
 *	  and clock helpers, the binary arrays of statement parameters, a
 *	  Kafka property set with its error logged, the opening of a session
 *	  with the pinned settings, and the logical replica check's answer
 *	  kept.  The relay's files and the consumer's call into it, never it
 *	  into them.
 *
 *-------------------------------------------------------------------------
 */
#include <arpa/inet.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include "daemon.h"
#include "protocol.h"

void
obx_say(const char *level, const char *fmt, ...)
{
	char stamp[32];
	struct timeval tv;
	struct tm tm;
	va_list ap;

	gettimeofday(&tv, NULL);
	gmtime_r(&tv.tv_sec, &tm);
	strftime(stamp, sizeof(stamp), "%Y-%m-%d %H:%M:%S", &tm);
	fprintf(stderr, "%s.%03d UTC obx-relay %s: ", stamp, (int) (tv.tv_usec / 1000), level);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

char *
obx_xstrdup(const char *s)
{
	char *copy = strdup(s);

	if (copy == NULL)
	{
		obx_say("FATAL", "out of memory");
		exit(1);
	}
	return copy;
}

void *
obx_xcalloc(size_t n, size_t size)
{
	void *p = calloc(n > 0 ? n : 1, size);

	if (p == NULL)
	{
		obx_say("FATAL", "out of memory");
		exit(1);
	}
	return p;
}

void
obx_buf_add(Buf *b, const char *s, size_t n)
{
	if (b->len + n + 1 > b->cap)
	{
		b->cap = (b->len + n + 1) * 2;
		b->data = realloc(b->data, b->cap);
		if (b->data == NULL)
		{
			obx_say("FATAL", "out of memory");
			exit(1);
		}
	}
	memcpy(b->data + b->len, s, n);
	b->len += n;
	b->data[b->len] = '\0';
}

void
obx_buf_be32(Buf *b, uint32_t v)
{
	uint32_t n = htonl(v);

	obx_buf_add(b, (const char *) &n, 4);
}

/*
 * A one-dimensional array of n elements of a type in PostgreSQL's binary
 * format, for a statement's parameter: this header, then n array_item.
 * Parsing 2,000-element array literals cost the server as much as the
 * statements themselves.
 */
void
obx_array_start(Buf *b, uint32_t elem_type, int n)
{
	obx_buf_be32(b, n > 0 ? 1 : 0); /* dimensions: none for an empty array */
	obx_buf_be32(b, 0);             /* no nulls */
	obx_buf_be32(b, elem_type);
	if (n == 0)
		return;
	obx_buf_be32(b, (uint32_t) n);
	obx_buf_be32(b, 1); /* lower bound */
}

void
obx_array_item(Buf *b, const char *p, size_t len)
{
	obx_buf_be32(b, (uint32_t) len);
	obx_buf_add(b, p, len);
}

long long
obx_now_us(void)
{
	struct timeval tv;

	gettimeofday(&tv, NULL);
	return (long long) tv.tv_sec * 1000000 + tv.tv_usec;
}

bool
obx_kafka_set(rd_kafka_conf_t *conf, const char *name, const char *value)
{
	char err[512];

	if (rd_kafka_conf_set(conf, name, value, err, sizeof(err)) != RD_KAFKA_CONF_OK)
	{
		obx_say("ERROR", "Kafka property %s: %s", name, err);
		return false;
	}
	return true;
}

/*
 * The settings every relay session runs with, the in-database relay's
 * (OBX_PINNED_SETTINGS), whatever the role or database sets.  One that
 * only a superuser may set must already have its value.
 */
static bool
pin_session(PGconn *conn)
{
	static const char *const pinned[][2] = OBX_PINNED_SETTINGS;
	size_t i;

	for (i = 0; i < sizeof(pinned) / sizeof(pinned[0]); i++)
	{
		const char *params[2] = {pinned[i][0], pinned[i][1]};
		PGresult *res = PQexecParams(conn,
									 "SELECT pg_catalog.current_setting($1) = $2"
									 " OR pg_catalog.set_config($1, $2, false) IS NOT NULL",
									 2, NULL, params, NULL, NULL, 0);
		bool ok = PQresultStatus(res) == PGRES_TUPLES_OK && strcmp(PQgetvalue(res, 0, 0), "t") == 0;

		if (!ok)
			obx_say("ERROR", "the relay's sessions need %s = '%s', and this role may not set it: %s",
					pinned[i][0], pinned[i][1], PQresultErrorMessage(res));
		PQclear(res);
		if (!ok)
			return false;
	}
	/* OBX_TOAST_COMPRESSION where the server has it; its default otherwise. */
	PQclear(PQexec(conn, "SELECT pg_catalog.set_config('default_toast_compression', '" OBX_TOAST_COMPRESSION "', false)"
						 " FROM pg_catalog.pg_settings WHERE name = 'default_toast_compression'"
						 " AND '" OBX_TOAST_COMPRESSION "' = ANY (enumvals)"));
	return true;
}

/*
 * A session of obx-relay's on conninfo (a database setting), named
 * application_name, with keepalives (a dead peer is noticed) and the
 * pinned settings; the connection string may override all but the
 * latter.  NULL, having said why, if not now; what (NULL: none) starts
 * the message.
 */
PGconn *
obx_session_open(const char *conninfo, const char *application_name, const char *what)
{
	const char *keys[] = {"application_name", "keepalives_idle", "keepalives_interval",
						  "keepalives_count", "dbname", NULL};
	const char *values[] = {application_name, "10", "5", "3", conninfo, NULL};
	PGconn *conn = PQconnectdbParams(keys, values, 1);

	if (PQstatus(conn) != CONNECTION_OK)
	{
		obx_say("ERROR", "%s%scould not connect to the database: %s", what ? what : "",
				what ? ": " : "", PQerrorMessage(conn));
		PQfinish(conn);
		return NULL;
	}
	if (!pin_session(conn))
	{
		PQfinish(conn);
		return NULL;
	}
	return conn;
}

/*
 * Keep obx._replica_problem's answer (res, a successful result of it) in
 * *problem, said once: a WARNING that the daemon does nothing in the
 * database (idle, with what the copies get instead: detail) when a reason
 * appears or changes, a LOG line (resumed) when it goes.  Returns whether
 * the database is free of it.  The relay (outbox.c) and the consumer
 * process (consume.c) read it each in its own session.
 */
bool
obx_replica_note(char **problem, const PGresult *res, const char *database, const char *idle,
				 const char *detail, const char *resumed)
{
	char *now = PQgetisnull(res, 0, 0) ? NULL : obx_xstrdup(PQgetvalue(res, 0, 0));

	if (now != NULL && (*problem == NULL || strcmp(now, *problem) != 0))
		obx_say("WARNING", "%s in database \"%s\": %s (%s; drop the subscription, or publish "
						   "only your own schemas)",
				idle, database, now, detail);
	else if (now == NULL && *problem != NULL)
		obx_say("LOG", "%s in database \"%s\": no subscription replicates obx's tables any more",
				resumed, database);
	free(*problem);
	*problem = now;
	return now == NULL;
}
