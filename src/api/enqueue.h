/*-------------------------------------------------------------------------
 *
 * enqueue.h
 *	  What enqueue.c shares with enqueue_many.c and event_id.c: an event
 *	  as the caller gives it, and the checks, the insert's plans, the
 *	  insert of one event and the wake-up that obx.enqueue and
 *	  obx.enqueue_many both use; the insert of an event whose id was given
 *	  (event_id.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef OBX_ENQUEUE_H
#define OBX_ENQUEUE_H

#include "executor/spi.h"
#include "fmgr.h"
#include "utils/jsonb.h"
#include "utils/uuid.h"

/* An event as obx.enqueue's arguments give it. */
typedef struct EnqueueEvent
{
	char *topic;
	char *key;
	Jsonb *payload;
	char *aggregate_id; /* NULL: the key */
	char *event_type;   /* NULL when not given */
	Jsonb *headers;     /* NULL when not given */
	pg_uuid_t *id;
	bool id_given; /* false: generated, so new */
} EnqueueEvent;

extern text *obx_enqueue_required_text(FunctionCallInfo fcinfo, int argno,
									   const char *what);
extern void obx_enqueue_check_topic(const char *topic);
extern void obx_enqueue_check_event(const EnqueueEvent *ev);
extern void obx_enqueue_check_existing(Datum id, const char *topic, const char *key,
									   const char *aggregate_id, Jsonb *payload,
									   const char *event_type, Jsonb *headers);
extern void obx_enqueue_make_id(pg_uuid_t *uuid);
extern void obx_enqueue_prepare_plans(void);
extern bool obx_enqueue_schema_is_1_0(void);
extern int obx_enqueue_plans_epoch;
extern void obx_enqueue_wake_at_commit(void);
extern bool obx_enqueue_insert(const EnqueueEvent *ev);

/* event_id.c */
extern bool obx_enqueue_given(const EnqueueEvent *ev, SPIPlanPtr plan, Datum *values,
							  const char *nulls);

#endif /* OBX_ENQUEUE_H */
