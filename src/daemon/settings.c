/*-------------------------------------------------------------------------
 *
 * settings.c
 *	  obx-relay's settings: the in-database relay's defaults, then the
 *	  settings file (--config), then the environment (OBX_RELAY_<NAME>,
 *	  and OBX_RELAY_KAFKA_<NAME> for a librdkafka property, "_" standing
 *	  for "."); docs/operations.md, "Managed PostgreSQL", lists them.
 *	  Read at start and again on SIGHUP, by each of its processes.
 *
 *-------------------------------------------------------------------------
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon.h"
#include "protocol.h"
#include "settings.h"

Config obx_config;
const char *obx_config_file = NULL;

static void
config_defaults(Config *c)
{
	memset(c, 0, sizeof(*c));
	/* The in-database relay's defaults (docs/configuration.md). */
	c->batch_size = 2000;
	c->poll_interval_ms = 40;
	c->claim_gap_ms = 20;
	c->lease_timeout_s = 60;
	c->delivery_timeout_ms = 30000;
	c->max_attempts = 10;
	c->backoff_min_ms = 100;
	c->backoff_max_ms = 60000;
	c->quarantine_blocks_key = true;
	c->retention_s = 7 * 24 * 3600;
	c->processed_retention_s = 0;
	c->dead_letter_retention_s = 14 * 24 * 3600;
	c->relay_id = 1000;
}

static bool
parse_int(const char *name, const char *value, int min, int max, int *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(value, &end, 10);
	if (errno != 0 || end == value || *end != '\0' || v < min || v > max)
	{
		obx_say("ERROR", "setting %s must be a whole number from %d to %d, not \"%s\"",
				name, min, max, value);
		return false;
	}
	*out = (int) v;
	return true;
}

/* One setting; false (said why) if it is unknown or its value is bad. */
static bool
config_set(Config *c, const char *name, const char *value)
{
	if (strncmp(name, "kafka.", 6) == 0)
	{
		if (c->nkafka == MAX_KAFKA_PROPS)
		{
			obx_say("ERROR", "more than %d Kafka properties", MAX_KAFKA_PROPS);
			return false;
		}
		c->kafka_names[c->nkafka] = obx_xstrdup(name + 6);
		c->kafka_values[c->nkafka++] = obx_xstrdup(value);
		return true;
	}
	if (strcmp(name, "database") == 0)
	{
		if (c->ndatabases == MAX_DATABASES)
		{
			obx_say("ERROR", "more than %d databases", MAX_DATABASES);
			return false;
		}
		c->databases[c->ndatabases++] = obx_xstrdup(value);
		return true;
	}
	if (strcmp(name, "subscriptions") == 0)
	{
		free(c->subscriptions);
		c->subscriptions = *value == '\0' ? NULL : obx_xstrdup(value);
		return true;
	}
	if (strcmp(name, "brokers") == 0)
	{
		free(c->brokers);
		c->brokers = obx_xstrdup(value);
		return true;
	}
	if (strcmp(name, "quarantine_blocks_key") == 0)
	{
		if (strcmp(value, "on") == 0 || strcmp(value, "true") == 0)
			c->quarantine_blocks_key = true;
		else if (strcmp(value, "off") == 0 || strcmp(value, "false") == 0)
			c->quarantine_blocks_key = false;
		else
		{
			obx_say("ERROR", "setting quarantine_blocks_key must be on or off, not \"%s\"", value);
			return false;
		}
		return true;
	}
#define INT_SETTING(n, field, min, max) \
	if (strcmp(name, n) == 0)           \
		return parse_int(name, value, min, max, &c->field);
	INT_SETTING("batch_size", batch_size, 1, 100000);
	INT_SETTING("poll_interval", poll_interval_ms, 1, 3600000);
	INT_SETTING("claim_gap", claim_gap_ms, 0, 3600000);
	INT_SETTING("lease_timeout", lease_timeout_s, 1, 86400);
	INT_SETTING("delivery_timeout", delivery_timeout_ms, 1000, 3600000);
	INT_SETTING("max_attempts", max_attempts, 1, 1000000);
	INT_SETTING("backoff_min", backoff_min_ms, 1, 3600000);
	INT_SETTING("backoff_max", backoff_max_ms, 1, 86400000);
	INT_SETTING("retention", retention_s, 0, 365 * 24 * 3600);
	INT_SETTING("processed_retention", processed_retention_s, 0, INT_MAX);
	INT_SETTING("dead_letter_retention", dead_letter_retention_s, 0, INT_MAX);
	INT_SETTING("relay_id", relay_id, OBX_FIRST_DAEMON_OWNER, 1000000);
#undef INT_SETTING
	obx_say("ERROR", "unknown setting \"%s\"", name);
	return false;
}

static char *
trim(char *s)
{
	char *end;

	while (*s == ' ' || *s == '\t')
		s++;
	end = s + strlen(s);
	while (end > s && (end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\n' || end[-1] == '\r'))
		*--end = '\0';
	return s;
}

/*
 * Whether a setting holds a secret: a password in the connection string
 * (the keyword, or user:password@ in a URI), or a Kafka credential.
 */
static bool
holds_secret(const char *name, const char *value)
{
	if (strcmp(name, "database") == 0)
	{
		const char *scheme = strstr(value, "://");
		const char *at = scheme ? strchr(scheme + 3, '@') : NULL;
		const char *colon = scheme ? strchr(scheme + 3, ':') : NULL;

		return strstr(value, "password") != NULL || (at != NULL && colon != NULL && colon < at);
	}
	return strncmp(name, "kafka.", 6) == 0 &&
		   (strstr(name, "password") != NULL || strstr(name, "secret") != NULL ||
			strstr(name, "jaas") != NULL || strstr(name, "key.pem") != NULL);
}

/*
 * A settings file that holds a secret must be no more open than a
 * PostgreSQL key file, by obx.kafka_properties_file's rule
 * (OBX_SECRET_FILE_OK).
 */
static bool
secret_file_closed(FILE *f, const char *path)
{
	struct stat st;

	if (fstat(fileno(f), &st) != 0)
	{
		obx_say("ERROR", "could not stat settings file \"%s\": %s", path, strerror(errno));
		return false;
	}
	if (!OBX_SECRET_FILE_OK(st.st_uid, st.st_mode, geteuid()))
	{
		obx_say("ERROR", "settings file \"%s\" holds a password and has group or world access, "
						 "or another owner: it must be u=rw (0600) or less if owned by the user obx-relay "
						 "runs as, u=rw,g=r (0640) or less if owned by root",
				path);
		return false;
	}
	return true;
}

/*
 * Read the settings: the file (lines "name = value"; # starts a comment
 * line; a value may be in single quotes), then the environment.
 */
static bool
config_load(Config *c, const char *path)
{
	extern char **environ;
	char **env;
	bool ok = true;

	config_defaults(c);
	if (path != NULL)
	{
		FILE *f = fopen(path, "r");
		char line[8192];
		int lineno = 0;
		bool secret = false;

		if (f == NULL)
		{
			obx_say("ERROR", "could not open settings file \"%s\": %s", path, strerror(errno));
			return false;
		}
		while (fgets(line, sizeof(line), f) != NULL)
		{
			char *name = trim(line);
			char *eq;
			char *value;
			size_t len;

			lineno++;
			if (*name == '\0' || *name == '#')
				continue;
			eq = strchr(name, '=');
			if (eq == NULL)
			{
				obx_say("ERROR", "%s line %d: expected name = value", path, lineno);
				ok = false;
				continue;
			}
			*eq = '\0';
			name = trim(name);
			value = trim(eq + 1);
			len = strlen(value);
			if (len >= 2 && value[0] == '\'' && value[len - 1] == '\'')
			{
				value[len - 1] = '\0';
				value++;
			}
			secret |= holds_secret(name, value);
			ok &= config_set(c, name, value);
		}
		if (secret && !secret_file_closed(f, path))
			ok = false;
		fclose(f);
	}
	for (env = environ; *env != NULL; env++)
	{
		char name[256];
		const char *eq = strchr(*env, '=');
		size_t len;
		size_t i;

		if (strncmp(*env, "OBX_RELAY_", 10) != 0 || eq == NULL)
			continue;
		len = eq - (*env + 10);
		if (len == 0 || len >= sizeof(name))
			continue;
		for (i = 0; i < len; i++)
		{
			char ch = (*env)[10 + i];

			name[i] = (ch >= 'A' && ch <= 'Z') ? ch - 'A' + 'a' : ch;
		}
		name[len] = '\0';
		if (strncmp(name, "kafka_", 6) == 0)
		{
			name[5] = '.';
			for (i = 6; i < len; i++)
				if (name[i] == '_')
					name[i] = '.';
		}
		ok &= config_set(c, name, eq + 1);
	}
	if (c->ndatabases == 0)
	{
		obx_say("ERROR", "no database: set database (a libpq connection string)");
		ok = false;
	}
	if (c->brokers == NULL)
	{
		obx_say("ERROR", "no brokers: set brokers (Kafka's bootstrap servers)");
		ok = false;
	}
	return ok;
}

static void
config_free(Config *c)
{
	int i;

	for (i = 0; i < c->ndatabases; i++)
		free(c->databases[i]);
	for (i = 0; i < c->nkafka; i++)
	{
		free(c->kafka_names[i]);
		free(c->kafka_values[i]);
	}
	free(c->brokers);
	free(c->subscriptions);
	memset(c, 0, sizeof(*c));
}

/*
 * Load the settings into obx_config at start, from path (NULL: the
 * environment alone), which obx_config_reload reads again; false (said
 * why) if they do not load.
 */
bool
obx_config_load(const char *path)
{
	obx_config_file = path;
	return config_load(&obx_config, path);
}

/*
 * Read the settings again (SIGHUP); a file that does not load changes
 * nothing.
 */
void
obx_config_reload(void)
{
	Config next;

	if (config_load(&next, obx_config_file))
	{
		config_free(&obx_config);
		obx_config = next;
		obx_say("LOG", "settings reloaded");
	}
	else
	{
		config_free(&next);
		obx_say("ERROR", "settings not reloaded: the old ones stay");
	}
}
