/*-------------------------------------------------------------------------
 *
 * land.c
 *	  obx.land(obx.inbound_event), the built-in handler of a subscription
 *	  whose messages are consumed outside the database (php artisan
 *	  obx:work, docs/laravel.md): it writes the message into obx.landed,
 *	  in the transaction that marks it processed, so that every message
 *	  lands once.
 *
 * A handler is not told which subscription it serves; obx.land asks
 * handler.c, which knows the consumer whose handler it is calling.  Called
 * any other way (directly, from a trigger), there is no such consumer and
 * obx.land refuses: nobody can land a message for a consumer whose handler
 * is not running, so EXECUTE on it can be PUBLIC's.  The row itself is
 * written by obx._land (SECURITY DEFINER, granted to nobody), called
 * through fmgr as consumer_sql.c calls its inner functions
 * (obx_call_inner, call_inner.c).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "fmgr.h"
#include "utils/builtins.h"

#include "obx.h"
#include "call_inner.h"
#include "handler.h"

PG_FUNCTION_INFO_V1(obx_land);

/*
 * obx.land(e obx.inbound_event)
 *		Land e for the consumer whose handler is running (obx._land).
 */
Datum
obx_land(PG_FUNCTION_ARGS)
{
	const char *consumer = obx_handler_consumer();

	if (consumer == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("obx.land can only run as the handler of an obx subscription"),
				 errhint("Subscribe with it: SELECT obx.subscribe('name', ARRAY['topic'], 'obx.land(obx.inbound_event)').")));
	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("obx.land needs an event")));
	return obx_call_inner(fcinfo, "_land", TEXTOID, CStringGetTextDatum(consumer));
}
