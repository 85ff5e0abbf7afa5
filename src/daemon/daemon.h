/*-------------------------------------------------------------------------
 *
 * daemon.h
 *	  What obx-relay's files share: its settings, its log, memory and
 *	  clock helpers, the type oids and binary arrays of statement
 *	  parameters, and the opening of a session with the pinned settings
 *	  (daemon.c).  obx_relay.c is the daemon and its relay; consume.c runs
 *	  its subscriptions.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OBX_DAEMON_H
#define OBX_DAEMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>

#define MAX_DATABASES   16
#define MAX_KAFKA_PROPS 64

/* Type oids of the statements' parameters (libpq has no catalog headers). */
#define BOOLOID        16
#define BYTEAOID       17
#define INT8OID        20
#define INT4OID        23
#define TEXTOID        25
#define FLOAT8OID      701
#define BOOLARRAYOID   1000
#define INT4ARRAYOID   1007
#define TEXTARRAYOID   1009
#define INT8ARRAYOID   1016
#define TIMESTAMPTZOID 1184
#define TSTZARRAYOID   1185
#define UUIDOID        2950
#define UUIDARRAYOID   2951
#define PGSNAPSHOTOID  5038

typedef struct Config
{
	char *databases[MAX_DATABASES];
	int ndatabases;
	char *brokers;
	char *kafka_names[MAX_KAFKA_PROPS];
	char *kafka_values[MAX_KAFKA_PROPS];
	int nkafka;
	int batch_size;
	int poll_interval_ms; /* after a claim that took nothing */
	int claim_gap_ms;     /* after one that took events, not a full batch */
	int lease_timeout_s;
	int delivery_timeout_ms;
	int max_attempts;
	int backoff_min_ms;
	int backoff_max_ms;
	bool quarantine_blocks_key;
	int retention_s;
	int relay_id;
	char *subscriptions; /* consumed: NULL none, "*" all, or a list */
} Config;

extern Config obx_config;

/* A growing string, for the statements' array parameters. */
typedef struct Buf
{
	char *data;
	size_t len;
	size_t cap;
} Buf;

/* daemon.c */
extern void obx_say(const char *level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
extern char *obx_xstrdup(const char *s);
extern void *obx_xcalloc(size_t n, size_t size);
extern long long obx_now_us(void);
extern bool obx_kafka_set(rd_kafka_conf_t *conf, const char *name, const char *value);
extern void obx_buf_add(Buf *b, const char *s, size_t n);
extern void obx_buf_be32(Buf *b, uint32_t v);
extern void obx_array_start(Buf *b, uint32_t elem_type, int n);
extern void obx_array_item(Buf *b, const char *p, size_t len);
extern PGconn *obx_session_open(const char *conninfo, const char *application_name,
								const char *what);
extern bool obx_replica_note(char **problem, const PGresult *res, const char *database,
							 const char *idle, const char *detail, const char *resumed);

/* consume.c: the subscriptions obx-relay runs (obx_config.subscriptions). */
extern bool obx_consume_enabled(void);
extern long long obx_consume_serve(void);
extern void obx_consume_stop(void);
extern bool obx_consume_check(PGconn *conn);

#endif
