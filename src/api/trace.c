/*-------------------------------------------------------------------------
 *
 * trace.c
 *	  W3C Trace Context (https://www.w3.org/TR/trace-context/) for enqueued
 *	  events.  The trace comes from the "traceparent" (and "tracestate") key
 *	  of obx.enqueue's headers argument, or else from the settings
 *	  obx.traceparent and obx.tracestate; it is validated and stored in the
 *	  event's headers, which the relay sends as Kafka headers.
 *
 * The headers argument wins over the settings: a caller that passes a
 * traceparent names the trace of this one event, the settings name the
 * trace of the transaction.  The tracestate goes with the traceparent it
 * came with and is never taken from the other source.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/json.h"
#include "utils/jsonb.h"

#include "obx.h"
#include "trace.h"

#define TRACEPARENT_LEN    55 /* version 00: 2+1+32+1+16+1+2 */
#define TRACESTATE_MAX_LEN 512

static bool
is_lower_hex(const char *s, int n)
{
	int i;

	for (i = 0; i < n; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return false;
	return true;
}

static bool
all_zeros(const char *s, int n)
{
	int i;

	for (i = 0; i < n; i++)
		if (s[i] != '0')
			return false;
	return true;
}

static void
bad_traceparent(const char *value, const char *source, const char *why)
{
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("invalid traceparent \"%s\" in %s", value, source),
			 errdetail("%s", why),
			 errhint("A W3C traceparent looks like 00-<32 hex digits trace id>-<16 hex digits parent id>-<2 hex digits flags>, in lower case.")));
}

/*
 * A traceparent as the W3C Trace Context specification defines it: version
 * 00 exactly, a later version (not ff) with at least the fields of 00 and
 * possibly more after a "-"; lower-case hex; trace id and parent id not
 * all zeros.  Raises an error naming what is wrong.
 */
static void
check_traceparent(const char *v, const char *source)
{
	size_t len = strlen(v);

	if (len < TRACEPARENT_LEN)
		bad_traceparent(v, source, psprintf("It has %zu characters; version 00 has %d.", len, TRACEPARENT_LEN));
	if (!is_lower_hex(v, 2) || v[2] != '-')
		bad_traceparent(v, source, "The version is not two lower-case hex digits followed by \"-\".");
	if (strncmp(v, "ff", 2) == 0)
		bad_traceparent(v, source, "Version ff is invalid.");
	if (strncmp(v, "00", 2) == 0 && len != TRACEPARENT_LEN)
		bad_traceparent(v, source, psprintf("It has %zu characters; version 00 has %d.", len, TRACEPARENT_LEN));
	if (len > TRACEPARENT_LEN && v[TRACEPARENT_LEN] != '-')
		bad_traceparent(v, source, "Fields after the flags must follow a \"-\".");
	if (!is_lower_hex(v + 3, 32) || v[35] != '-')
		bad_traceparent(v, source, "The trace id is not 32 lower-case hex digits followed by \"-\".");
	if (all_zeros(v + 3, 32))
		bad_traceparent(v, source, "The trace id is all zeros.");
	if (!is_lower_hex(v + 36, 16) || v[52] != '-')
		bad_traceparent(v, source, "The parent id is not 16 lower-case hex digits followed by \"-\".");
	if (all_zeros(v + 36, 16))
		bad_traceparent(v, source, "The parent id is all zeros.");
	if (!is_lower_hex(v + 53, 2))
		bad_traceparent(v, source, "The flags are not two lower-case hex digits.");
}

/*
 * A tracestate: at most 512 printable ASCII characters, and only with a
 * traceparent from the same source.  Its list members are the tracing
 * system's business and are passed on as given.
 */
static void
check_tracestate(const char *v, const char *source, bool has_parent)
{
	const char *p;

	if (!has_parent)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("tracestate without traceparent in %s", source),
				 errdetail("A tracestate belongs to the traceparent it came with.")));
	if (strlen(v) > TRACESTATE_MAX_LEN)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid tracestate in %s", source),
				 errdetail("It has %zu characters; at most %d are allowed.",
						   strlen(v), TRACESTATE_MAX_LEN)));
	for (p = v; *p; p++)
		if (*p < 0x20 || *p > 0x7e)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("invalid tracestate in %s", source),
					 errdetail("It may contain only printable ASCII characters.")));
}

/* The string value of key in headers, NULL when absent. */
static char *
header_string(Jsonb *headers, const char *name)
{
	JsonbValue key;
	JsonbValue *v;

	if (headers == NULL)
		return NULL;
	key.type = jbvString;
	key.val.string.val = (char *) name;
	key.val.string.len = strlen(name);
	v = findJsonbValueFromContainer(&headers->root, JB_FOBJECT, &key);
	if (v == NULL || v->type != jbvString)
		return NULL;
	return pnstrdup(v->val.string.val, v->val.string.len);
}

static void
append_member(StringInfo buf, const char *name, const char *value)
{
	if (buf->len > 1)
		appendStringInfoString(buf, ", ");
	escape_json(buf, name);
	appendStringInfoString(buf, ": ");
	escape_json(buf, value);
}

/*
 * obx_trace_headers
 *		The event's headers (NULL: none) with the trace context in them:
 *		the headers' own traceparent and tracestate, validated, or else
 *		those of obx.traceparent and obx.tracestate.  Returns the headers
 *		unchanged when there is no trace context; raises an error for a
 *		malformed one.
 */
Jsonb *
obx_trace_headers(Jsonb *headers)
{
	char *parent = header_string(headers, "traceparent");
	char *state = header_string(headers, "tracestate");
	StringInfoData buf;
	Datum trace;

	if (parent != NULL || state != NULL)
	{
		if (parent != NULL)
			check_traceparent(parent, "the event headers");
		if (state != NULL)
			check_tracestate(state, "the event headers", parent != NULL);
		return headers;
	}
	parent = (obx_traceparent && obx_traceparent[0]) ? obx_traceparent : NULL;
	state = (obx_tracestate && obx_tracestate[0]) ? obx_tracestate : NULL;
	if (parent == NULL && state == NULL)
		return headers;
	if (parent != NULL)
		check_traceparent(parent, "obx.traceparent");
	if (state != NULL)
		check_tracestate(state, "obx.tracestate", parent != NULL);

	initStringInfo(&buf);
	appendStringInfoChar(&buf, '{');
	append_member(&buf, "traceparent", parent);
	if (state != NULL)
		append_member(&buf, "tracestate", state);
	appendStringInfoChar(&buf, '}');
	trace = DirectFunctionCall1(jsonb_in, CStringGetDatum(buf.data));
	if (headers == NULL)
		return DatumGetJsonbP(trace);
	return DatumGetJsonbP(DirectFunctionCall2(jsonb_concat, JsonbPGetDatum(headers), trace));
}
