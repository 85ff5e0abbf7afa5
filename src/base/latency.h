/*-------------------------------------------------------------------------
 *
 * latency.h
 *	  Publish latency per topic (latency.c): a histogram in shared memory,
 *	  fed by the relay's record step, read by the obx.publish_latency view.
 *	  Shared state the relay writes and a view reads, like the worker slots
 *	  of status.c; obx.c sets it up with the rest of obx's shared memory.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OBX_LATENCY_H
#define OBX_LATENCY_H

#include "datatype/timestamp.h"

/* One published event: its topic and enqueue-to-acknowledgement time. */
typedef struct ObxLatencySample
{
	const char *topic;
	int64 latency_us;
} ObxLatencySample;

extern Size obx_latency_shmem_size(void);
extern void obx_latency_shmem_request(void);
extern void obx_latency_shmem_init(void);
extern void obx_latency_add(const ObxLatencySample *samples, int n);

#endif /* OBX_LATENCY_H */
