/*-------------------------------------------------------------------------
 *
 * kafka_conf.c
 *	  From obx's settings to a librdkafka handle: who may set which
 *	  librdkafka property, obx.kafka_properties and the properties file
 *	  where secrets come from, and creating a handle (producer or
 *	  consumer) the way every obx handle is created.
 *
 * Subscriptions are written by non-superusers, and librdkafka properties
 * reach far: brokers (where credentials are sent), security settings,
 * plugins and engines (code loaded into the server), commands (the
 * Kerberos kinit command runs a shell) and files.  A subscription may set
 * consumer tuning properties only; obx.subscribe refuses the rest, and the
 * consumer workers check again before building a consumer.
 *
 * PostgreSQL logs the new value of a setting changed by a reload, so
 * secrets (SASL passwords, key passwords) go in a file instead: key=value
 * lines, read when a worker builds a producer or consumer.  Nothing here
 * ever puts a value from that file in a message: errors name the line and
 * the property only.
 *
 * librdkafka's threads never run PostgreSQL code: all signals are blocked
 * while a handle is created, so its threads inherit a full mask and the
 * postmaster's signals reach only the worker's main thread, and its logs
 * are queued and served on the worker's own thread.  A process that hosts
 * librdkafka's threads keeps the memory it frees (keep_freed_memory).
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "fmgr.h"
#include "funcapi.h"
#include "storage/fd.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/memutils.h"

#include "obx.h"
#include "compat.h"
#include "kafka_conf.h"
#include "protocol.h"

PG_FUNCTION_INFO_V1(obx_subscription_kafka_properties);

/*
 * Consumer tuning: fetch sizes and waits, queue sizes, group timeouts,
 * where the offset starts, transactions' visibility, assignment strategy,
 * rack, checksums, metadata refresh.  Nothing that names a host, a file,
 * a command, a library or a credential, and nothing obx sets itself
 * (group.id, enable.auto.offset.store, enable.auto.commit,
 * enable.partition.eof, bootstrap.servers).  Sorted, for the SQL function.
 */
static const char *const subscription_properties[] = {
	"auto.commit.interval.ms",
	"auto.offset.reset",
	"check.crcs",
	"client.rack",
	"coordinator.query.interval.ms",
	"fetch.error.backoff.ms",
	"fetch.max.bytes",
	"fetch.message.max.bytes",
	"fetch.min.bytes",
	"fetch.wait.max.ms",
	"heartbeat.interval.ms",
	"isolation.level",
	"max.partition.fetch.bytes",
	"max.poll.interval.ms",
	"metadata.max.age.ms",
	"partition.assignment.strategy",
	"queued.max.messages.kbytes",
	"queued.min.messages",
	"session.timeout.ms",
	"topic.metadata.refresh.interval.ms",
};

/*
 * obx_kafka_subscription_property_allowed
 *		Whether a subscription may set this librdkafka property (exact
 *		name: an alias of an allowed property is not allowed).
 */
bool
obx_kafka_subscription_property_allowed(const char *name)
{
	int i;

	for (i = 0; i < lengthof(subscription_properties); i++)
		if (strcmp(name, subscription_properties[i]) == 0)
			return true;
	return false;
}

/*
 * Of the allowed properties, those that size what a subscription's consumer
 * holds in the worker's memory, and the most a subscription may set them
 * to: librdkafka's defaults.  A subscription may lower them, never raise
 * them: a role allowed to subscribe could otherwise make every consumer
 * worker pre-fetch up to 2 GB for each of its subscriptions.  A superuser
 * raises them for every consumer in obx.kafka_properties.
 */
static const struct
{
	const char *name;
	int64 max;
} subscription_maxima[] = {
	{"fetch.max.bytes", 52428800},
	{"fetch.message.max.bytes", 1048576},
	{"max.partition.fetch.bytes", 1048576},
	{"queued.max.messages.kbytes", 65536},
	{"queued.min.messages", 100000},
};

/*
 * Whether the value a subscription gives an allowed property is wrong, and
 * then why, as a message and a hint (or NULL): over its maximum
 * (subscription_maxima), or refused by librdkafka.  The number is read as
 * librdkafka reads it (strtoll, any base).
 */
static bool
subscription_value_problem(const char *name, const char *value,
						   char **message, char **hint)
{
	rd_kafka_conf_t *conf;
	char err[256];
	int i;

	for (i = 0; i < lengthof(subscription_maxima); i++)
	{
		char *end;
		long long v;

		if (strcmp(name, subscription_maxima[i].name) != 0)
			continue;
		errno = 0;
		v = strtoll(value, &end, 0);
		if (end != value && (errno == ERANGE || v > subscription_maxima[i].max))
		{
			*message = psprintf("Kafka property \"%s\" of an obx subscription may be at most %lld, not %s",
								name, (long long) subscription_maxima[i].max, value);
			*hint = pstrdup("A subscription may lower the fetch and queue sizes below librdkafka's defaults, not raise them; "
							"a superuser raises them for every consumer in obx.kafka_properties.");
			return true;
		}
	}
	conf = rd_kafka_conf_new();
	if (rd_kafka_conf_set(conf, name, value, err, sizeof(err)) != RD_KAFKA_CONF_OK)
	{
		*message = psprintf("Kafka property \"%s\" of an obx subscription: %s", name, err);
		*hint = NULL;
		rd_kafka_conf_destroy(conf);
		return true;
	}
	rd_kafka_conf_destroy(conf);
	return false;
}

PG_FUNCTION_INFO_V1(obx_subscription_kafka_value_problem);

/*
 * obx._kafka_value_problem(name text, value text) RETURNS text[]:
 * {message, hint} of subscription_value_problem, or NULL.
 */
Datum
obx_subscription_kafka_value_problem(PG_FUNCTION_ARGS)
{
	char *name = text_to_cstring(PG_GETARG_TEXT_PP(0));
	char *value = text_to_cstring(PG_GETARG_TEXT_PP(1));
	char *message;
	char *hint;
	Datum elems[2];
	bool nulls[2] = {false, false};
	int dims[1] = {2};
	int lbs[1] = {1};

	if (!subscription_value_problem(name, value, &message, &hint))
		PG_RETURN_NULL();
	elems[0] = CStringGetTextDatum(message);
	elems[1] = hint ? CStringGetTextDatum(hint) : (Datum) 0;
	nulls[1] = (hint == NULL);
	PG_RETURN_ARRAYTYPE_P(construct_md_array(elems, nulls, 1, dims, lbs, TEXTOID,
											 -1, false, TYPALIGN_INT));
}

/*
 * obx.subscription_kafka_properties(): the allow-list, one row each.
 */
Datum
obx_subscription_kafka_properties(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	int i;

	obx_init_materialized_srf(fcinfo, true);
	for (i = 0; i < lengthof(subscription_properties); i++)
	{
		Datum value = CStringGetTextDatum(subscription_properties[i]);
		bool isnull = false;

		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, &value, &isnull);
	}
	return (Datum) 0;
}

/*
 * Read the whole properties file into a palloc'd string, after checking
 * that it is a regular file only the server's OS user (or root) can read,
 * as PostgreSQL checks its SSL key file; *len is its length.  NULL with a
 * message in errbuf if not.
 */
static char *
read_properties_file(const char *path, size_t *len, char *errbuf, size_t errlen)
{
	struct stat st;
	FILE *f;
	StringInfoData buf;
	char chunk[1024];
	size_t n;

	if (stat(path, &st) != 0)
	{
		snprintf(errbuf, errlen, "could not access obx.kafka_properties_file \"%s\": %m",
				 path);
		return NULL;
	}
	if (!S_ISREG(st.st_mode))
	{
		snprintf(errbuf, errlen, "obx.kafka_properties_file \"%s\" is not a regular file",
				 path);
		return NULL;
	}
	if (st.st_uid != geteuid() && st.st_uid != 0)
	{
		snprintf(errbuf, errlen,
				 "obx.kafka_properties_file \"%s\" must be owned by the database user or root",
				 path);
		return NULL;
	}
	if (!OBX_SECRET_FILE_OK(st.st_uid, st.st_mode, geteuid()))
	{
		snprintf(errbuf, errlen,
				 "obx.kafka_properties_file \"%s\" has group or world access; "
				 "it holds secrets, so it must be u=rw (0600) or less if owned by the "
				 "database user, u=rw,g=r (0640) or less if owned by root",
				 path);
		return NULL;
	}
	f = AllocateFile(path, "r");
	if (f == NULL)
	{
		snprintf(errbuf, errlen, "could not open obx.kafka_properties_file \"%s\": %m",
				 path);
		return NULL;
	}
	initStringInfo(&buf);
	while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0)
		appendBinaryStringInfo(&buf, chunk, (int) n);
	if (ferror(f))
	{
		snprintf(errbuf, errlen, "could not read obx.kafka_properties_file \"%s\": %m",
				 path);
		FreeFile(f);
		return NULL;
	}
	FreeFile(f);
	*len = buf.len;
	return buf.data;
}

static char *
trim(char *s)
{
	char *end;

	while (*s == ' ' || *s == '\t')
		s++;
	end = s + strlen(s);
	while (end > s && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r'))
		*--end = '\0';
	return s;
}

/*
 * obx_kafka_file_properties
 *		Apply obx.kafka_properties_file, if set: one name=value per line,
 *		blank lines and lines starting with # ignored, spaces around name
 *		and value trimmed.  False with a message in errbuf that names the
 *		file, the line and the property, never a value.
 */
static bool
obx_kafka_file_properties(rd_kafka_conf_t *conf, char *errbuf, size_t errlen)
{
	char *text;
	char *line;
	char *next;
	size_t len;
	int lineno = 0;
	bool ok = true;

	if (obx_kafka_properties_file == NULL || obx_kafka_properties_file[0] == '\0')
		return true;
	text = read_properties_file(obx_kafka_properties_file, &len, errbuf, errlen);
	if (text == NULL)
		return false;

	for (line = text; ok && line != NULL; line = next)
	{
		char *eq;
		char *name;
		char err[512];
		rd_kafka_conf_res_t res;

		next = strchr(line, '\n');
		if (next != NULL)
			*next++ = '\0';
		lineno++;
		line = trim(line);
		if (*line == '\0' || *line == '#')
			continue;
		eq = strchr(line, '=');
		if (eq == NULL)
		{
			snprintf(errbuf, errlen,
					 "obx.kafka_properties_file line %d is not name=value", lineno);
			ok = false;
			break;
		}
		*eq = '\0';
		name = trim(line);
		res = rd_kafka_conf_set(conf, name, trim(eq + 1), err, sizeof(err));
		/* librdkafka's message may quote the value: it is never shown */
		explicit_bzero(err, sizeof(err));
		if (res == RD_KAFKA_CONF_UNKNOWN)
			snprintf(errbuf, errlen,
					 "obx.kafka_properties_file line %d: librdkafka has no property \"%s\"",
					 lineno, name);
		else if (res != RD_KAFKA_CONF_OK)
			snprintf(errbuf, errlen,
					 "obx.kafka_properties_file line %d: invalid value for \"%s\" (not shown)",
					 lineno, name);
		ok = (res == RD_KAFKA_CONF_OK);
	}
	explicit_bzero(text, len);
	pfree(text);
	return ok;
}

static char *file_signature = NULL;

/*
 * obx_kafka_file_signature
 *		A string that changes when obx.kafka_properties_file or its content
 *		does, for a worker to notice on reload that its Kafka clients must
 *		be rebuilt: as read by the last obx_kafka_file_reread (the first
 *		call reads it).  A hash, so that no secret is kept around in it.
 */
const char *
obx_kafka_file_signature(void)
{
	if (file_signature == NULL)
		obx_kafka_file_reread();
	return file_signature;
}

/*
 * obx_kafka_file_reread
 *		Read the file again for obx_kafka_file_signature: after a reload.
 */
void
obx_kafka_file_reread(void)
{
	char errbuf[512];
	char *text;
	size_t len;
	char *sig;

	if (obx_kafka_properties_file == NULL || obx_kafka_properties_file[0] == '\0')
		sig = "";
	else if ((text = read_properties_file(obx_kafka_properties_file, &len,
										  errbuf, sizeof(errbuf))) == NULL)
		sig = psprintf("%s:unreadable", obx_kafka_properties_file);
	else
	{
		uint64 hash = hash_bytes_extended((const unsigned char *) text, (int) len, 0);

		explicit_bzero(text, len);
		pfree(text);
		sig = psprintf("%s:" UINT64_FORMAT, obx_kafka_properties_file, hash);
	}
	if (file_signature != NULL)
		pfree(file_signature);
	file_signature = MemoryContextStrdup(TopMemoryContext, sig);
}

/*
 * librdkafka's log callback, for the producer and the consumers: it runs
 * on the worker's own thread (log.queue), inside a poll.
 */
static void
log_callback(const rd_kafka_t *rk, int level, const char *fac, const char *buf)
{
	/* Broker trouble also arrives through error_callback, as a WARNING. */
	int elevel = level <= 4 ? LOG : (level <= 6 ? DEBUG1 : DEBUG2);

	ereport(elevel,
			(errmsg_internal("obx librdkafka %s: %s", fac, buf)));
}

/*
 * obx_kafka_set
 *		Set one librdkafka property; false with a message naming it when
 *		librdkafka refuses.  Used for the producer and the consumers alike.
 */
bool
obx_kafka_set(rd_kafka_conf_t *conf, const char *name, const char *value,
			  char *errbuf, size_t errlen)
{
	char err[256];

	if (rd_kafka_conf_set(conf, name, value, err, sizeof(err)) != RD_KAFKA_CONF_OK)
	{
		snprintf(errbuf, errlen, "librdkafka property \"%s\": %s", name, err);
		return false;
	}
	return true;
}

/*
 * obx_kafka_user_properties
 *		Apply obx.kafka_properties: "name=value" pairs separated by
 *		semicolons.  Used for the producer and the consumers alike.
 *
 * Errors name the entry and the property but never echo a value, since
 * values may be secrets and errors reach the log and obx.workers.  Then
 * obx.kafka_properties_file (above), where secrets belong.
 */
bool
obx_kafka_user_properties(rd_kafka_conf_t *conf, char *errbuf, size_t errlen)
{
	char *copy = pstrdup(obx_kafka_properties ? obx_kafka_properties : "");
	char *save = NULL;
	char *item;
	int entry = 0;

	for (item = strtok_r(copy, ";", &save); item; item = strtok_r(NULL, ";", &save))
	{
		char *eq;
		char *name;
		char *value;
		char err[256];
		rd_kafka_conf_res_t res;

		entry++;
		while (*item == ' ' || *item == '\t' || *item == '\n')
			item++;
		if (*item == '\0')
			continue;
		eq = strchr(item, '=');
		if (eq == NULL)
		{
			snprintf(errbuf, errlen,
					 "obx.kafka_properties entry %d is not name=value", entry);
			return false;
		}
		*eq = '\0';
		name = item;
		value = eq + 1;
		while (eq > name && (eq[-1] == ' ' || eq[-1] == '\t'))
			*--eq = '\0';
		while (*value == ' ' || *value == '\t')
			value++;
		res = rd_kafka_conf_set(conf, name, value, err, sizeof(err));
		if (res == RD_KAFKA_CONF_UNKNOWN)
		{
			snprintf(errbuf, errlen,
					 "obx.kafka_properties entry %d: librdkafka has no property \"%s\"",
					 entry, name);
			return false;
		}
		if (res != RD_KAFKA_CONF_OK)
		{
			snprintf(errbuf, errlen,
					 "obx.kafka_properties entry %d: invalid value for \"%s\"",
					 entry, name);
			return false;
		}
	}
	return obx_kafka_file_properties(conf, errbuf, errlen);
}

/*
 * OBX_KEEP_FREED_BYTES: how much freed memory a worker keeps for reuse
 * instead of handing it back to the kernel: two batches' payloads.
 */
#define OBX_KEEP_FREED_BYTES (2 * OBX_BATCH_BYTES)

/*
 * Stop glibc from returning freed memory to the kernel after each batch.
 *
 * By default it shrinks the heap whenever more than 128 kB at its top is
 * free, and serves every allocation over 128 kB with an mmap of its own.
 * Each batch's transactions and memory contexts free that much, so each
 * batch shrank the heap and grew it again.  In a single-threaded backend
 * that is cheap; in a process with librdkafka's threads, every shrink
 * (brk, munmap) interrupts all CPUs the process's threads ran on to flush
 * their TLBs, and every regrowth page-faults: a share of the relay's CPU
 * time that grows with the rate of batches.
 */
static void
keep_freed_memory(void)
{
	static bool done = false;

	if (done)
		return;
	done = true;
	(void) mallopt(M_TRIM_THRESHOLD, OBX_KEEP_FREED_BYTES);
	(void) mallopt(M_MMAP_THRESHOLD, OBX_KEEP_FREED_BYTES);
}

/*
 * obx_kafka_new
 *		Create a librdkafka handle (producer or consumer) the way obx needs
 *		every handle: logs queued and served on the worker's own thread,
 *		and all signals blocked while librdkafka starts its threads, so
 *		they inherit a full mask.  On failure the caller still owns conf.
 */
rd_kafka_t *
obx_kafka_new(int type, rd_kafka_conf_t *conf, char *errbuf, size_t errlen)
{
	rd_kafka_t *rk;
	sigset_t all;
	sigset_t old;

	if (!obx_kafka_set(conf, "log.queue", "true", errbuf, errlen))
		return NULL;
	rd_kafka_conf_set_log_cb(conf, log_callback);
	keep_freed_memory();

	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	rk = rd_kafka_new((rd_kafka_type_t) type, conf, errbuf, errlen);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rk != NULL)
		rd_kafka_set_log_queue(rk, NULL);
	return rk;
}
