/*-------------------------------------------------------------------------
 *
 * cloudevents.c
 *	  The CloudEvents 1.0 Kafka protocol binding, binary content mode: with
 *	  obx.cloudevents on, every record the relay produces gets the event's
 *	  attributes as headers (ce_specversion, ce_id, ce_type, ce_source,
 *	  ce_time, and content-type for the value), next to obx's own.
 *
 * The values come from the outbox row: ce_id is the event id, ce_type the
 * event type (the topic name for an event without one, so that every
 * record is a valid CloudEvent), ce_time occurred_at in RFC 3339 (UTC),
 * ce_source obx.cloudevents_source.  A header the caller set under one of
 * these names is left as the caller set it.  Runs in the relay, outside
 * any transaction: no catalog access.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "utils/datetime.h"
#include "utils/timestamp.h"

#include "cloudevents.h"
#include "obx.h"

/* Whether the caller's headers of the event have this name. */
static bool
caller_set(const ObxEvent *ev, const char *name)
{
	int i;

	for (i = 0; i < ev->nheaders; i++)
		if (strcmp(ev->header_names[i], name) == 0)
			return true;
	return false;
}

static void
add(rd_kafka_headers_t *hdrs, const ObxEvent *ev, const char *name,
	const char *value)
{
	if (!caller_set(ev, name))
		rd_kafka_header_add(hdrs, name, -1, value, -1);
}

/* t as RFC 3339 in UTC with microseconds: 2026-12-01T20:00:00.123456Z. */
static void
rfc3339(TimestampTz t, char *buf, size_t len)
{
	struct pg_tm tm;
	fsec_t fsec;

	if (timestamp2tm(t, NULL, &tm, &fsec, NULL, NULL) != 0)
	{
		strlcpy(buf, "", len);
		return;
	}
	snprintf(buf, len, "%04d-%02d-%02dT%02d:%02d:%02d.%06dZ",
			 tm.tm_year, tm.tm_mon, tm.tm_mday, tm.tm_hour, tm.tm_min,
			 tm.tm_sec, (int) fsec);
}

/*
 * obx_cloudevents_add
 *		Add the CloudEvents headers of ev to hdrs when obx.cloudevents is
 *		on; a tombstone (no value) gets no content-type.
 */
void
obx_cloudevents_add(rd_kafka_headers_t *hdrs, const ObxEvent *ev)
{
	char time[64];

	if (!obx_cloudevents)
		return;
	add(hdrs, ev, "ce_specversion", "1.0");
	add(hdrs, ev, "ce_id", ev->id_text);
	add(hdrs, ev, "ce_type", ev->event_type ? ev->event_type : ev->topic);
	add(hdrs, ev, "ce_source",
		obx_cloudevents_source && obx_cloudevents_source[0] ? obx_cloudevents_source : "/obx");
	rfc3339(ev->occurred_at, time, sizeof(time));
	if (time[0])
		add(hdrs, ev, "ce_time", time);
	if (ev->payload != NULL)
		add(hdrs, ev, "content-type", "application/json");
}
