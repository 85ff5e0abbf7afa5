/*-------------------------------------------------------------------------
 *
 * batch.h
 *	  A batch of claimed events, what the relay's files pass between
 *	  them: the claim fills it from its rows (claim.c), the producer hands
 *	  its events to librdkafka and its delivery reports fill in how each
 *	  went (producer.c), and the record writes that down (outbox.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef OBX_DAEMON_BATCH_H
#define OBX_DAEMON_BATCH_H

#include <stdbool.h>
#include <stddef.h>

#include <libpq-fe.h>

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
	bool lost;      /* its lease ran out (obx_renew) */
	PGresult *rows; /* the claim's rows, which the events point into */
} Batch;

#endif
