/*-------------------------------------------------------------------------
 *
 * inbound.c
 *	  A Kafka message made into an obx.inbound_event: the event id (header
 *	  event_id, else the payload's eventId or event_id), the event type,
 *	  the key and headers as text, and the payload as jsonb (NULL for a
 *	  tombstone with an event_id header: a deletion).  A message without a
 *	  valid event id or a JSON payload is malformed: the reason is kept for
 *	  its dead letter, and nothing here raises for bad input.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/syscache.h"
#include "utils/typcache.h"

#include "inbound.h"

/*
 * Text of a key or header value: itself when it is valid in the database
 * encoding, else "\x" and its bytes in hex, so that binary keys and headers
 * from other producers still reach the handler (and nothing is dropped).
 */
static char *
as_text(const char *data, size_t len)
{
	StringInfoData buf;
	size_t i;

	if (pg_verifymbstr(data, (int) len, true))
		return pnstrdup(data, len);
	initStringInfo(&buf);
	appendStringInfoString(&buf, "\\x");
	for (i = 0; i < len; i++)
		appendStringInfo(&buf, "%02x", (unsigned char) data[i]);
	return buf.data;
}

static const char *
header_value(const ObxInbound *msg, const char *name)
{
	int i;

	/* The last header of that name wins, as in the headers object. */
	for (i = msg->nheaders - 1; i >= 0; i--)
		if (strcmp(msg->header_names[i], name) == 0)
			return msg->header_values[i] == NULL ? NULL
												 : as_text(msg->header_values[i], msg->header_lens[i]);
	return NULL;
}

static char *
jsonb_string_field(Jsonb *jb, const char *field)
{
	JsonbValue key;
	JsonbValue *v;

	if (!JB_ROOT_IS_OBJECT(jb))
		return NULL;
	key.type = jbvString;
	key.val.string.val = (char *) field;
	key.val.string.len = strlen(field);
	v = findJsonbValueFromContainer(&jb->root, JB_FOBJECT, &key);
	if (v == NULL || v->type != jbvString || v->val.string.len == 0)
		return NULL;
	return pnstrdup(v->val.string.val, v->val.string.len);
}

static Datum
headers_jsonb(const ObxInbound *msg)
{
	StringInfoData buf;
	int i;

	initStringInfo(&buf);
	appendStringInfoChar(&buf, '{');
	for (i = 0; i < msg->nheaders; i++)
	{
		if (i > 0)
			appendStringInfoString(&buf, ", ");
		escape_json(&buf, as_text(msg->header_names[i], strlen(msg->header_names[i])));
		appendStringInfoString(&buf, ": ");
		if (msg->header_values[i] == NULL)
			appendStringInfoString(&buf, "null");
		else
			escape_json(&buf, as_text(msg->header_values[i], msg->header_lens[i]));
	}
	appendStringInfoChar(&buf, '}');
	return DirectFunctionCall1(jsonb_in, CStringGetDatum(buf.data));
}

/*
 * Run fn(arg) in a subtransaction.  Returns NULL when it succeeded, else
 * the error, with the subtransaction rolled back and the caller's memory
 * context and resource owner restored.
 */
ErrorData *
obx_in_subtransaction(void (*fn)(void *), void *arg)
{
	MemoryContext cxt = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	ErrorData *volatile edata = NULL;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(cxt);
	PG_TRY();
	{
		fn(arg);
		ReleaseCurrentSubTransaction();
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
	}
	PG_END_TRY();
	MemoryContextSwitchTo(cxt);
	CurrentResourceOwner = owner;
	return edata;
}

typedef struct ParseArgs
{
	const ObxInbound *msg;
	ObxInboundEvent *ev;
} ParseArgs;

static void
parse_payload(void *arg)
{
	ParseArgs *a = (ParseArgs *) arg;
	char *text = pnstrdup(a->msg->value, a->msg->value_len);

	if (!pg_verifymbstr(a->msg->value, (int) a->msg->value_len, true))
		ereport(ERROR,
				(errcode(ERRCODE_CHARACTER_NOT_IN_REPERTOIRE),
				 errmsg("message value is not valid %s", GetDatabaseEncodingName())));
	a->ev->payload = DirectFunctionCall1(jsonb_in, CStringGetDatum(text));
}

/*
 * obx_inbound_build
 *		Build what the handler gets from the Kafka message.  Never raises
 *		for bad input: a message obx cannot turn into an event is marked
 *		malformed, with the reason.
 */
void
obx_inbound_build(const ObxInbound *msg, ObxInboundEvent *ev)
{
	memset(ev, 0, sizeof(*ev));
	ev->key = msg->key ? as_text(msg->key, msg->key_len) : NULL;
	ev->headers = headers_jsonb(msg);
	ev->event_id = (char *) header_value(msg, "event_id");
	ev->event_type = (char *) header_value(msg, "event_type");
	if (ev->event_id != NULL && ev->event_id[0] == '\0')
		ev->event_id = NULL;

	if (msg->value == NULL && ev->event_id != NULL)
		ev->tombstone = true; /* a deletion: the handler gets a NULL payload */
	else if (msg->value == NULL)
	{
		ev->malformed = true;
		ev->malformed_why = "message has no value (a tombstone) and no event_id header";
	}
	else
	{
		ParseArgs args = {msg, ev};
		ErrorData *edata = obx_in_subtransaction(parse_payload, &args);

		if (edata != NULL)
		{
			ev->malformed = true;
			ev->malformed_why = psprintf("payload is not JSON: %s", edata->message);
		}
		else
			ev->is_json = true;
	}
	if (!ev->malformed && !ev->tombstone)
	{
		Jsonb *jb = DatumGetJsonbP(ev->payload);

		if (ev->event_id == NULL)
			ev->event_id = jsonb_string_field(jb, "eventId");
		if (ev->event_id == NULL)
			ev->event_id = jsonb_string_field(jb, "event_id");
		if (ev->event_type == NULL)
			ev->event_type = jsonb_string_field(jb, "eventType");
	}
	if (ev->event_id != NULL && strlen(ev->event_id) > OBX_MAX_EVENT_ID_LEN)
	{
		/*
		 * It could never be marked processed (the dedupe index refuses it):
		 * retrying would block the partition forever.
		 */
		ev->malformed = true;
		ev->malformed_why = psprintf("event id is not valid: %zu bytes, at most %d allowed",
									 strlen(ev->event_id), OBX_MAX_EVENT_ID_LEN);
		ev->event_id = NULL;
	}
	else if (!ev->malformed && ev->event_id == NULL)
	{
		ev->malformed = true;
		ev->malformed_why = "no event id: no event_id header and no eventId or event_id field in the payload";
	}
}

/*
 * obx_inbound_row
 *		The obx.inbound_event a handler gets, as a composite Datum.  Only
 *		for an event that is not malformed.
 */
Datum
obx_inbound_row(const ObxInbound *msg, const ObxInboundEvent *ev)
{
	Oid nsp = get_namespace_oid("obx", false);
	Oid typid = GetSysCacheOid2(TYPENAMENSP, Anum_pg_type_oid,
								CStringGetDatum("inbound_event"),
								ObjectIdGetDatum(nsp));
	TupleDesc desc;
	Datum values[9];
	bool nulls[9];

	if (!OidIsValid(typid))
		elog(ERROR, "obx type obx.inbound_event does not exist");
	desc = lookup_rowtype_tupdesc_copy(typid, -1);
	memset(nulls, false, sizeof(nulls));
	values[0] = CStringGetTextDatum(ev->event_id);
	values[1] = ev->event_type ? CStringGetTextDatum(ev->event_type) : (Datum) 0;
	nulls[1] = (ev->event_type == NULL);
	values[2] = CStringGetTextDatum(msg->topic);
	values[3] = Int32GetDatum(msg->partition);
	values[4] = Int64GetDatum(msg->offset);
	values[5] = ev->key ? CStringGetTextDatum(ev->key) : (Datum) 0;
	nulls[5] = (ev->key == NULL);
	values[6] = ev->headers;
	values[7] = ev->payload;
	nulls[7] = ev->tombstone;
	values[8] = TimestampTzGetDatum(msg->timestamp);
	nulls[8] = (msg->timestamp == 0);
	return HeapTupleGetDatum(heap_form_tuple(desc, values, nulls));
}
