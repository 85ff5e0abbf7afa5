/*-------------------------------------------------------------------------
 *
 * trace.h
 *	  W3C trace context for enqueued events (trace.c): the traceparent and
 *	  tracestate headers, validated and merged into the event's headers.
 *	  Used by enqueue.c only.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OBX_TRACE_H
#define OBX_TRACE_H

#include "postgres.h"

#include "utils/jsonb.h"

extern Jsonb *obx_trace_headers(Jsonb *headers);

#endif /* OBX_TRACE_H */
