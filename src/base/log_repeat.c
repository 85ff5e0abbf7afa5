/*-------------------------------------------------------------------------
 *
 * log_repeat.c
 *	  The limit on repeated log lines every obx process shares: the
 *	  launcher, the relay and the consumer workers.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "log_repeat.h"

/*
 * Repeated log lines.  A worker that meets the same trouble over and over
 * (every message of a bad batch dead-lettered, a handler failing on every
 * retry) logs it once per OBX_LOG_REPEAT_MS, and the next line it logs
 * says how many it kept back.  Everything stays in the tables (dead
 * letters, consumer_status); the log is only the alarm.
 */
#define OBX_LOG_KEY_LEN 128

typedef struct LogRepeat
{
	char key[OBX_LOG_KEY_LEN];
	TimestampTz logged_at;
	int64 suppressed;
} LogRepeat;

/*
 * obx_log_allowed
 *		Whether to log a line of kind what (e.g. the subscription, error
 *		class and SQLSTATE) now; if so, *suppressed is how many of that
 *		kind were not logged since the last one.  Per process.
 */
bool
obx_log_allowed(const char *what, int64 *suppressed)
{
	static HTAB *seen = NULL;
	char key[OBX_LOG_KEY_LEN];
	LogRepeat *entry;
	bool found;
	TimestampTz now = GetCurrentTimestamp();

	if (seen == NULL)
	{
		HASHCTL ctl;

		ctl.keysize = OBX_LOG_KEY_LEN;
		ctl.entrysize = sizeof(LogRepeat);
		ctl.hcxt = TopMemoryContext;
		seen = hash_create("obx log repeats", 64, &ctl,
						   HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	}
	memset(key, 0, sizeof(key));
	strlcpy(key, what, sizeof(key));
	entry = hash_search(seen, key, HASH_ENTER, &found);
	if (found && !TimestampDifferenceExceeds(entry->logged_at, now, OBX_LOG_REPEAT_MS))
	{
		entry->suppressed++;
		return false;
	}
	*suppressed = found ? entry->suppressed : 0;
	entry->logged_at = now;
	entry->suppressed = 0;
	return true;
}
