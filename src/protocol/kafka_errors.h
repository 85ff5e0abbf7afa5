/*-------------------------------------------------------------------------
 *
 * kafka_errors.h
 *	  Kafka errors' classes and names (kafka_errors.c), shared by the
 *	  in-database relay and obx-relay.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OBX_KAFKA_ERRORS_H
#define OBX_KAFKA_ERRORS_H

#include <stdbool.h>

/*
 * Error classes recorded in last_error_class and used for the decision
 * between backing off and quarantining.
 */
typedef enum ObxErrorClass
{
	OBX_ERROR_TRANSIENT, /* broker or network trouble: retry forever */
	OBX_ERROR_PERMANENT, /* this event can never be accepted as is */
	OBX_ERROR_OTHER      /* unknown: retry up to obx.max_attempts */
} ObxErrorClass;

extern ObxErrorClass obx_kafka_classify(int err);
extern bool obx_kafka_timed_out(int err);
extern const char *obx_kafka_error_name(int err);
extern const char *obx_kafka_error_text(int err);
extern const char *obx_error_class_name(ObxErrorClass cls);

#endif /* OBX_KAFKA_ERRORS_H */
