/*-------------------------------------------------------------------------
 *
 * check.c
 *	  obx-relay --check: each database of the settings reached, obx
 *	  installed there, the role's grants (docs/security.md, "The
 *	  workers"), no logical subscription into obx's tables, the handlers
 *	  of the subscriptions it consumes; then the brokers.  One line each
 *	  on standard output, and an exit status.
 *
 *-------------------------------------------------------------------------
 */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>

#include "check.h"
#include "consume.h"
#include "producer.h"
#include "protocol.h"
#include "settings.h"

/*
 * The grants the relay's statements need (docs/security.md, "The
 * workers"), as has_*_privilege checks.
 */
static const char *const grant_checks[][2] = {
	{"USAGE on schema obx", "has_schema_privilege('obx', 'USAGE')"},
	{"SELECT, INSERT on obx.claims", "has_table_privilege('obx.claims', 'SELECT, INSERT')"},
	{"SELECT, INSERT on obx.records", "has_table_privilege('obx.records', 'SELECT, INSERT')"},
	{"SELECT, INSERT on obx.renewals", "has_table_privilege('obx.renewals', 'SELECT, INSERT')"},
	{"INSERT on obx.published_counts", "has_table_privilege('obx.published_counts', 'INSERT')"},
	{"SELECT on obx.events", "has_table_privilege('obx.events', 'SELECT')"},
	{"SELECT, INSERT, UPDATE on obx.event_states", "has_table_privilege('obx.event_states', 'SELECT, INSERT, UPDATE')"},
	{"USAGE on obx.lease_seq", "has_sequence_privilege('obx.lease_seq', 'USAGE')"},
	{"EXECUTE on obx._tick()", "has_function_privilege('obx._tick()', 'EXECUTE')"},
	{"EXECUTE on obx._hold(uuid[])", "has_function_privilege('obx._hold(uuid[])', 'EXECUTE')"},
	{"EXECUTE on obx._rotate(float8)", "has_function_privilege('obx._rotate(float8)', 'EXECUTE')"},
	{"SELECT, DELETE on obx.processed_events", "has_table_privilege('obx.processed_events', 'SELECT, DELETE')"},
	{"SELECT, DELETE on obx.dead_letters", "has_table_privilege('obx.dead_letters', 'SELECT, DELETE')"},
	{"EXECUTE on obx._replica_problem()", "has_function_privilege('obx._replica_problem()', 'EXECUTE')"},
	{"EXECUTE on obx._consume(...)", "has_function_privilege('obx._consume(text, text, integer, bigint, text, text[], text[], bytea, timestamptz, integer, integer)', 'EXECUTE')"},
	{"EXECUTE on obx._call_handler(...)", "has_function_privilege('obx._call_handler(regprocedure, obx.inbound_event)', 'EXECUTE')"},
};

/* Whether no logical subscription writes into obx's tables here. */
static bool
check_replica(PGconn *conn)
{
	PGresult *res = PQexec(conn, OBX_SQL_REPLICA_PROBLEM);
	bool ok = PQresultStatus(res) == PGRES_TUPLES_OK && PQgetisnull(res, 0, 0);

	if (PQresultStatus(res) != PGRES_TUPLES_OK)
		printf("FAIL  %s: %s", OBX_SQL_REPLICA_PROBLEM, PQresultErrorMessage(res));
	else if (!ok)
		printf("FAIL  %s: obx-relay claims nothing here while it does (drop the subscription, "
			   "or publish only your own schemas)\n",
			   PQgetvalue(res, 0, 0));
	PQclear(res);
	return ok;
}

/*
 * One database: reached, obx installed, the role's grants, no logical
 * replica of obx's tables, the subscriptions' handlers; false if any
 * failed.
 */
static bool
check_database(const char *conninfo)
{
	const char *keys[] = {"application_name", "dbname", NULL};
	const char *values[] = {"obx-relay --check", conninfo, NULL};
	PGconn *conn = PQconnectdbParams(keys, values, 1);
	PGresult *res;
	bool ok = true;
	size_t i;

	if (PQstatus(conn) != CONNECTION_OK)
	{
		printf("FAIL  connect: %s", PQerrorMessage(conn));
		PQfinish(conn);
		return false;
	}
	printf("ok    connected to database \"%s\" on %s as role \"%s\"%s\n", PQdb(conn),
		   PQhost(conn), PQuser(conn), PQsslInUse(conn) ? " over TLS" : "");
	res = PQexec(conn, "SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user");
	if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1 &&
		strcmp(PQgetvalue(res, 0, 0), "t") == 0)
		printf("WARN  role \"%s\" is a superuser: give obx-relay a role with obx_worker's grants only\n",
			   PQuser(conn));
	PQclear(res);
	res = PQexec(conn, "SELECT pg_catalog.obj_description('obx'::pg_catalog.regnamespace, 'pg_namespace'),"
					   " (SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'obx')");
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		printf("FAIL  obx is not installed in this database (no schema obx)\n");
		PQclear(res);
		PQfinish(conn);
		return false;
	}
	if (!PQgetisnull(res, 0, 1))
		printf("ok    obx %s is installed as an extension\n", PQgetvalue(res, 0, 1));
	else
		printf("ok    %s\n", PQgetvalue(res, 0, 0));
	PQclear(res);
	for (i = 0; i < sizeof(grant_checks) / sizeof(grant_checks[0]); i++)
	{
		char sql[256];

		snprintf(sql, sizeof(sql), "SELECT pg_catalog.%s", grant_checks[i][1]);
		res = PQexec(conn, sql);
		if (PQresultStatus(res) != PGRES_TUPLES_OK || strcmp(PQgetvalue(res, 0, 0), "t") != 0)
		{
			printf("FAIL  role \"%s\" lacks %s (GRANT obx_worker TO %s)\n", PQuser(conn),
				   grant_checks[i][0], PQuser(conn));
			ok = false;
		}
		PQclear(res);
	}
	if (ok)
		printf("ok    role \"%s\" holds every grant the relay needs\n", PQuser(conn));
	ok &= check_replica(conn);
	ok &= obx_consume_check(conn);
	PQfinish(conn);
	return ok;
}

/* Whether the brokers answer the producer, set as the relay sets it. */
static bool
check_brokers(void)
{
	rd_kafka_t *rk;
	const struct rd_kafka_metadata *md;
	rd_kafka_resp_err_t err;

	rk = obx_producer_new();
	if (rk == NULL)
	{
		printf("FAIL  the Kafka settings are refused (above)\n");
		return false;
	}
	err = rd_kafka_metadata(rk, 0, NULL, &md, 10000);
	if (err != RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		printf("FAIL  brokers %s: %s\n", obx_config.brokers, rd_kafka_err2str(err));
		rd_kafka_destroy(rk);
		return false;
	}
	printf("ok    brokers %s answer: %d broker(s) in the cluster\n", obx_config.brokers, md->broker_cnt);
	rd_kafka_metadata_destroy(md);
	rd_kafka_destroy(rk);
	return true;
}

/* The checks, each database's and the brokers'; 0 if all passed, else 1. */
int
obx_check(void)
{
	bool ok = true;
	int i;

	for (i = 0; i < obx_config.ndatabases; i++)
		ok &= check_database(obx_config.databases[i]);
	ok &= check_brokers();
	printf("%s\n", ok ? "obx-relay --check: ok" : "obx-relay --check: FAILED");
	return ok ? 0 : 1;
}
