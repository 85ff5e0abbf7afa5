/*-------------------------------------------------------------------------
 *
 * settings.h
 *	  obx-relay's settings (settings.c): what both its processes run
 *	  with, read from the settings file and the environment at start and
 *	  again on SIGHUP.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OBX_DAEMON_SETTINGS_H
#define OBX_DAEMON_SETTINGS_H

#include <stdbool.h>

#define MAX_DATABASES   16
#define MAX_KAFKA_PROPS 64

typedef struct Config
{
	char *databases[MAX_DATABASES];
	int ndatabases;
	char *brokers;
	char *kafka_names[MAX_KAFKA_PROPS];
	char *kafka_values[MAX_KAFKA_PROPS];
	int nkafka;
	int batch_size;
	int poll_interval_ms; /* after a claim that took nothing */
	int claim_gap_ms;     /* after one that took events, not a full batch */
	int lease_timeout_s;
	int delivery_timeout_ms;
	int max_attempts;
	int backoff_min_ms;
	int backoff_max_ms;
	bool quarantine_blocks_key;
	int retention_s;
	int processed_retention_s;   /* 0: keep the dedupe rows for ever */
	int dead_letter_retention_s; /* 0: keep the dead letters for ever */
	int relay_id;
	char *subscriptions; /* consumed: NULL none, "*" all, or a list */
} Config;

/* The settings in force. */
extern Config obx_config;

/* The settings file (--config), or NULL: the environment alone. */
extern const char *obx_config_file;

extern bool obx_config_load(const char *path);
extern void obx_config_reload(void);

#endif
