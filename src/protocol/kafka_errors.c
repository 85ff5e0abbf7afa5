/*-------------------------------------------------------------------------
 *
 * kafka_errors.c
 *	  What a Kafka error means for an event, the same in both runtimes
 *	  (the in-database relay and obx-relay): its class, which decides
 *	  between backing off and quarantining, and its names.  librdkafka
 *	  only, no PostgreSQL.
 *
 *-------------------------------------------------------------------------
 */
#include <stdbool.h>

#include <librdkafka/rdkafka.h>

#include "kafka_errors.h"

/*
 * obx_kafka_classify
 *		Sort a Kafka error into transient (retry forever), permanent
 *		(quarantine now) or other (retry up to obx.max_attempts).
 */
ObxErrorClass
obx_kafka_classify(int err)
{
	switch ((rd_kafka_resp_err_t) err)
	{
		case RD_KAFKA_RESP_ERR__MSG_TIMED_OUT:
		case RD_KAFKA_RESP_ERR__TIMED_OUT:
		case RD_KAFKA_RESP_ERR__TRANSPORT:
		case RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN:
		case RD_KAFKA_RESP_ERR__RESOLVE:
		case RD_KAFKA_RESP_ERR__QUEUE_FULL:
		case RD_KAFKA_RESP_ERR__PURGE_QUEUE:
		case RD_KAFKA_RESP_ERR__PURGE_INFLIGHT:
		case RD_KAFKA_RESP_ERR__DESTROY:
		case RD_KAFKA_RESP_ERR__FATAL:
		case RD_KAFKA_RESP_ERR__TIMED_OUT_QUEUE:
		case RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT:
		case RD_KAFKA_RESP_ERR_NETWORK_EXCEPTION:
		case RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE:
		case RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION:
		case RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS:
		case RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND:
		case RD_KAFKA_RESP_ERR_BROKER_NOT_AVAILABLE:
		case RD_KAFKA_RESP_ERR_REPLICA_NOT_AVAILABLE:
		case RD_KAFKA_RESP_ERR_KAFKA_STORAGE_ERROR:
		case RD_KAFKA_RESP_ERR_NOT_COORDINATOR:
		case RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE:
		case RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS:
		case RD_KAFKA_RESP_ERR_THROTTLING_QUOTA_EXCEEDED:
		case RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER:
		case RD_KAFKA_RESP_ERR_UNKNOWN_PRODUCER_ID:
		case RD_KAFKA_RESP_ERR_INVALID_PRODUCER_EPOCH:
			return OBX_ERROR_TRANSIENT;
		case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
		case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
		case RD_KAFKA_RESP_ERR_INVALID_RECORD:
		case RD_KAFKA_RESP_ERR_INVALID_MSG:
		case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
		case RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION:
		case RD_KAFKA_RESP_ERR__INVALID_ARG:
		case RD_KAFKA_RESP_ERR_UNSUPPORTED_FOR_MESSAGE_FORMAT:
		case RD_KAFKA_RESP_ERR_POLICY_VIOLATION:
			return OBX_ERROR_PERMANENT;
		default:
			return OBX_ERROR_OTHER;
	}
}

/*
 * obx_kafka_timed_out
 *		Whether librdkafka gave up on a message after message.timeout.ms
 *		(obx.delivery_timeout): the attempt has waited that long already.
 */
bool
obx_kafka_timed_out(int err)
{
	return err == RD_KAFKA_RESP_ERR__MSG_TIMED_OUT;
}

const char *
obx_kafka_error_name(int err)
{
	return rd_kafka_err2name((rd_kafka_resp_err_t) err);
}

const char *
obx_kafka_error_text(int err)
{
	return rd_kafka_err2str((rd_kafka_resp_err_t) err);
}

const char *
obx_error_class_name(ObxErrorClass cls)
{
	switch (cls)
	{
		case OBX_ERROR_TRANSIENT:
			return "transient";
		case OBX_ERROR_PERMANENT:
			return "permanent";
		case OBX_ERROR_OTHER:
			return "other";
	}
	return "other";
}
