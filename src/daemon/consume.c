/*-------------------------------------------------------------------------
 *
 * consume.c
 *	  obx-relay's consumer: the subscriptions of its databases that the
 *	  setting "subscriptions" names ("*": all), each read by a librdkafka
 *	  consumer in the group the consumer workers use (the subscription's
 *	  name), its messages applied one per transaction (inbox.c) over a
 *	  connection of its own.  The subscriptions are read again every
 *	  second, on a session per database, and served in turns.  It runs in
 *	  the consumer process (process.c).
 *
 *-------------------------------------------------------------------------
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>

#include "consume.h"
#include "daemon.h"
#include "held.h"
#include "inbox.h"
#include "protocol.h"
#include "settings.h"
#include "subscription.h"

/* Messages applied per subscription before the next one gets a turn. */
#define TURN_MESSAGES 200
/* How often the subscriptions are read again, and the longest nap. */
#define REFRESH_US    1000000LL
#define POLL_US       10000LL

/*
 * The subscriptions consumed and, per database, the session that lists
 * them, with the logical replica check's answer.
 */
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

/* Whether the settings name subscriptions: the consumer process runs only then. */
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

/*
 * Close the subscription's consumer (leaving its group) and its session,
 * and forget its held partitions; the subscription stays listed.
 */
static void
sub_close(Sub *s)
{
	while (s->held != NULL)
		obx_held_release(s, s->held);
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

/*
 * Record the low and high watermarks of the subscription's partitions
 * (from librdkafka's cache, no network round trip) for obx.consumers' lag,
 * every OBX_WATERMARK_INTERVAL_MS when they moved, as the consumer workers
 * do (OBX_SQL_WATERMARKS), on the subscription's session, outside a
 * transaction of a message.
 */
static void
record_watermarks(Sub *s)
{
	rd_kafka_topic_partition_list_t *assigned = NULL;
	char *lists[4];
	size_t sizes[4] = {0, 0, 0, 0};
	FILE *out[4];
	const char *params[5];
	long long sum = 0;
	int n = 0;
	int i;

	if (obx_now_us() < s->watermarks_at)
		return;
	s->watermarks_at = obx_now_us() + OBX_WATERMARK_INTERVAL_MS * 1000LL;
	if (rd_kafka_assignment(s->rk, &assigned) != RD_KAFKA_RESP_ERR_NO_ERROR)
		return;
	for (i = 0; i < 4; i++)
	{
		lists[i] = NULL;
		out[i] = open_memstream(&lists[i], &sizes[i]);
		fputc('{', out[i]);
	}
	for (i = 0; i < assigned->cnt; i++)
	{
		rd_kafka_topic_partition_t *p = &assigned->elems[i];
		int64_t lo;
		int64_t hi;

		if (rd_kafka_get_watermark_offsets(s->rk, p->topic, p->partition, &lo, &hi) !=
				RD_KAFKA_RESP_ERR_NO_ERROR ||
			hi < 0)
			continue;
		/* Kafka's topic names are [a-zA-Z0-9._-]: nothing to escape. */
		fprintf(out[0], "%s\"%s\"", n ? "," : "", p->topic);
		fprintf(out[1], "%s%d", n ? "," : "", (int) p->partition);
		fprintf(out[2], "%s%lld", n ? "," : "", (long long) lo);
		fprintf(out[3], "%s%lld", n ? "," : "", (long long) hi);
		sum += (lo + 1) * 31 + hi * 1000003 + p->partition;
		n++;
	}
	rd_kafka_topic_partition_list_destroy(assigned);
	for (i = 0; i < 4; i++)
	{
		fputc('}', out[i]);
		fclose(out[i]);
	}
	if (n > 0 && sum != s->watermarks_sum)
	{
		PGresult *res;

		params[0] = s->name;
		for (i = 0; i < 4; i++)
			params[i + 1] = lists[i];
		res = PQexecParams(s->conn, OBX_SQL_WATERMARKS, 5, NULL, params, NULL, NULL, 0);
		if (PQresultStatus(res) == PGRES_COMMAND_OK)
			s->watermarks_sum = sum;
		else
			obx_say("WARNING", "consumer group \"%s\": could not record the watermarks: %s",
					s->name, PQresultErrorMessage(res));
		PQclear(res);
	}
	for (i = 0; i < 4; i++)
		free(lists[i]);
}

/* A turn of one subscription: up to TURN_MESSAGES messages. */
static void
serve_sub(Sub *s)
{
	int n;

	if (s->rk == NULL || !obx_inbox_connect(s))
		return;
	obx_held_resume_due(s);
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
		ok = obx_inbox_serve(s, m);
		rd_kafka_message_destroy(m);
		if (!ok)
		{
			obx_say("LOG", "consumer group \"%s\": the session broke; a new one in 1 s", s->name);
			PQfinish(s->conn);
			s->conn = NULL;
			return;
		}
	}
	record_watermarks(s);
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
