/*-------------------------------------------------------------------------
 *
 * obx_relay.c
 *	  obx-relay: the relay as a standalone daemon, for a PostgreSQL that
 *	  cannot load obx's library (the SQL-only install, obx-sql-only.sql)
 *	  or where the relay should run on another host.  It runs the same
 *	  claim / produce / record protocol as the in-database relay
 *	  (relay.c), over libpq, against one or more databases, as a role that
 *	  holds obx_worker's grants and nothing more (docs/security.md, "The
 *	  workers").  It also runs the subscriptions its setting
 *	  "subscriptions" names (consume.c), in a second process (process.c,
 *	  obx-relay --consumer).
 *
 *	  obx-relay [--config FILE] [--check]
 *
 * Its settings (settings.c) come from the file and the environment.
 * SIGHUP reads them again and SIGTERM and SIGINT stop it, each once the
 * batches out are recorded.  This file is its command line.
 *
 *-------------------------------------------------------------------------
 */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "daemon.h"
#include "process.h"
#include "relay.h"
#include "settings.h"

static void
usage(void)
{
	fprintf(stderr,
			"obx-relay publishes obx's outbox to Kafka from outside the database,\n"
			"and runs the subscriptions its settings name.\n\n"
			"Usage: obx-relay [--config FILE] [--check]\n\n"
			"  --config FILE  settings, one \"name = value\" per line; OBX_RELAY_<NAME>\n"
			"                 in the environment overrides them\n"
			"  --check        check the databases, the role's grants and the brokers, then exit\n\n"
			"Settings: docs/operations.md, \"Managed PostgreSQL\".\n");
}

int
main(int argc, char **argv)
{
	bool check_only = false;
	bool consumer_only = false;
	const char *config_file = NULL;
	int i;

	for (i = 1; i < argc; i++)
	{
		if (strcmp(argv[i], "--config") == 0 && i + 1 < argc)
			config_file = argv[++i];
		else if (strcmp(argv[i], "--check") == 0)
			check_only = true;
		else if (strcmp(argv[i], "--consumer") == 0)
			consumer_only = true; /* the consumer process (process.c) */
		else
		{
			usage();
			return strcmp(argv[i], "--help") == 0 ? 0 : 2;
		}
	}
	if (!obx_config_load(config_file))
		return 2;
	if (check_only)
		return obx_check();

	obx_signals_install();
	if (consumer_only)
	{
		obx_say("LOG", "consumer process started");
		return obx_consumer_process_run();
	}
	return obx_relay_run();
}
