/*-------------------------------------------------------------------------
 *
 * daemon.h
 *	  What every file of obx-relay stands on (daemon.c): its log, memory
 *	  and clock helpers, the type oids and binary arrays of statement
 *	  parameters, a Kafka property set, the opening of a session with the
 *	  pinned settings, and the logical replica check's answer kept.
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

/* A growing string, for the statements' array parameters. */
typedef struct Buf
{
	char *data;
	size_t len;
	size_t cap;
} Buf;

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

#endif
