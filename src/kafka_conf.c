/*-------------------------------------------------------------------------
 *
 * kafka_conf.c
 *	  Who may set which librdkafka property, and where secrets come from:
 *	  the consumer properties a subscription may set (an allow-list), and
 *	  obx.kafka_properties_file, the superuser's client properties file.
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
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <sys/stat.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

#include "common/hashfn.h"
#include "fmgr.h"
#include "funcapi.h"
#include "storage/fd.h"
#include "utils/builtins.h"
#include "utils/memutils.h"

#include "obx.h"

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
 * obx.subscription_kafka_properties(): the allow-list, one row each.
 */
Datum
obx_subscription_kafka_properties(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	int i;

	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
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
	if ((st.st_uid == geteuid() && (st.st_mode & (S_IRWXG | S_IRWXO)) != 0) ||
		(st.st_uid == 0 && (st.st_mode & (S_IWGRP | S_IXGRP | S_IRWXO)) != 0))
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
bool
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
