/*-------------------------------------------------------------------------
 *
 * outbox.h
 *	  The relay's side of the outbox log (obx.events, obx.claims,
 *	  obx.records, obx.event_states): the in-memory batch a worker claims
 *	  and publishes, and the statements on it.
 *
 *	  claim.c	the claim: a batch of publishable events under a lease
 *	  outbox.c	what Kafka said about a batch; renewing and ending leases;
 *				whether a logical subscription writes into obx's tables
 *
 * Each function declared here is one short transaction of its own, never
 * open while the worker waits on Kafka.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OBX_OUTBOX_H
#define OBX_OUTBOX_H

#include "datatype/timestamp.h"
#include "utils/uuid.h"

#include "kafka_errors.h"

/*
 * How a publish attempt ended for one event.
 */
typedef enum ObxOutcome
{
	OBX_OUTCOME_UNSENT = 0, /* not handed to Kafka; release, no attempt */
	OBX_OUTCOME_IN_FLIGHT,  /* handed to librdkafka, no report yet */
	OBX_OUTCOME_DELIVERED,  /* acknowledged by the broker */
	OBX_OUTCOME_FAILED      /* failed; see err and error class */
} ObxOutcome;

/*
 * One claimed event.  Strings live in the worker's per-batch memory context.
 */
typedef struct ObxEvent
{
	pg_uuid_t id;
	char id_text[37];
	char *topic;
	char *key;
	char *payload;
	int payload_len;
	char *event_type; /* NULL when not set */
	int nheaders;     /* the caller's headers, as name/value pairs */
	char **header_names;
	char **header_values;
	int attempts; /* including this one */
	TimestampTz occurred_at;

	struct ObxBatch *batch; /* the batch it belongs to, for its reports */
	ObxOutcome outcome;
	int err; /* rd_kafka_resp_err_t when FAILED */
	ObxErrorClass error_class;
	bool refused_locally; /* FAILED by librdkafka at produce, never sent */
	int32 partition;      /* where it landed, or was refused */
	int64 offset;
	/*
	 * When librdkafka received Kafka's acknowledgement, set on its broker
	 * thread (0 until then; if still 0, when the worker served the report).
	 */
	TimestampTz acked_at;
} ObxEvent;

typedef struct ObxBatch
{
	int64 lease_id;
	int64 max_seq; /* the highest seq claimed; its record carries it */
	int64 min_seq; /* the lowest, which it carries too */
	int nevents;
	int in_flight;
	bool full; /* the claim stopped at obx.batch_size or OBX_BATCH_BYTES */
	ObxEvent *events;
	TimestampTz retry_at; /* set by obx_outbox_record: when the last of its
						   * failed, not quarantined events is due again,
						   * or 0 if none waits for a retry */
} ObxBatch;

/* claim.c */
extern bool obx_outbox_claim(ObxBatch *batch, int worker, bool force, bool landed);
extern void obx_claim_forget(void);
extern void obx_claim_lock(void);

/* outbox.c */
extern int obx_outbox_record(ObxBatch *batch);
extern void obx_outbox_release(ObxBatch *batch);
extern int obx_outbox_renew(ObxBatch *batch);
extern int64 obx_outbox_release_orphans(int worker);
extern void obx_outbox_analyze(void);

#endif /* OBX_OUTBOX_H */
