/*-------------------------------------------------------------------------
 *
 * subscription.h
 *	  A subscription obx-relay's consumer process consumes, what its files
 *	  pass between them: consume.c lists and builds it, inbox.c applies
 *	  its messages on its session, held.c holds back its partitions.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OBX_DAEMON_SUBSCRIPTION_H
#define OBX_DAEMON_SUBSCRIPTION_H

#include <stdbool.h>

#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>

typedef struct Sub
{
	int db; /* its database: an index of obx_config.databases */
	char *name;
	char *signature; /* what the consumer was built from */
	int timeout_ms;  /* handler_timeout_ms: the session's statement_timeout */
	rd_kafka_t *rk;
	PGconn *conn;
	long long retry_at;          /* when to try to connect or build again */
	struct Held *held;           /* its partitions held back (held.c) */
	long long refused_logged_at; /* a refusal is logged once a minute */
	long long watermarks_at;     /* when to record the watermarks next */
	long long watermarks_sum;    /* a sum of those recorded last */
	bool listed;
	struct Sub *next;
} Sub;

#endif
