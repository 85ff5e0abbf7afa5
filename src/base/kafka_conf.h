/*-------------------------------------------------------------------------
 *
 * kafka_conf.h
 *	  From obx's settings to a librdkafka handle (kafka_conf.c): used by
 *	  the relay's producer and the consumer workers alike.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OBX_KAFKA_CONF_H
#define OBX_KAFKA_CONF_H

struct rd_kafka_conf_s;
struct rd_kafka_s;

extern bool obx_kafka_set(struct rd_kafka_conf_s *conf, const char *name,
						  const char *value, char *errbuf, size_t errlen);
extern bool obx_kafka_user_properties(struct rd_kafka_conf_s *conf,
									  char *errbuf, size_t errlen);
extern const char *obx_kafka_file_signature(void);
extern void obx_kafka_file_reread(void);
extern bool obx_kafka_subscription_property_allowed(const char *name);
extern struct rd_kafka_s *obx_kafka_new(int type, struct rd_kafka_conf_s *conf,
										char *errbuf, size_t errlen);

#endif /* OBX_KAFKA_CONF_H */
