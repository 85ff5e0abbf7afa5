/*-------------------------------------------------------------------------
 *
 * produce_baseline.c
 *	  The librdkafka-only baseline of the drain benchmark: produce the very
 *	  messages obx drained (same keys, payloads and event_id header) to the
 *	  same broker, with the producer settings obx uses, and no database.
 *
 * Usage:
 *	  produce_baseline -b BROKERS -t TOPIC -f MESSAGES
 *	  produce_baseline -b BROKERS -t TOPIC -f MESSAGES -r RATE -d SECONDS [-g MS]
 *
 * MESSAGES holds one message per line, as COPY ... TO (FORMAT text) writes
 * it: key, event id and payload separated by tabs.  All of it is read into
 * memory before the clock starts.  The clock then covers creating the
 * producer, producing every message and receiving every delivery report,
 * like the obx drain figure covers the relay's start up to the last event
 * marked published.
 *
 * Prints one line:	seconds=<elapsed> delivered=<n> failed=<n>
 *
 * With -r and -d (paced mode, the latency benchmark's baseline) it instead
 * produces RATE messages a second for SECONDS seconds, evenly spaced by the
 * wall clock and cycling through MESSAGES, and measures each message from
 * the produce call to its delivery report (the broker's acknowledgement):
 *	  count=<n> failed=<n> p50_ms=<x> p99_ms=<x> max_ms=<x> rate=<achieved>
 * With -g as well, the messages go out in bursts every MS milliseconds:
 * each burst produces, back to back, the messages whose slots fell since
 * the previous one, as the relay hands librdkafka each turn's claim.
 *
 * Exit status 0 when every message was delivered, 1 otherwise, 2 on bad
 * usage or input.
 *
 *-------------------------------------------------------------------------
 */
#define _GNU_SOURCE

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

typedef struct message
{
	char *key;
	char *id;
	char *payload;
	size_t payload_len;
} message;

static long delivered = 0;
static long failed = 0;
static rd_kafka_resp_err_t first_error = RD_KAFKA_RESP_ERR_NO_ERROR;

/* Paced mode: when each message was produced, and how long it took. */
static double *sent_at = NULL;
static double *latency = NULL;

static double
now_seconds(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void
dr_callback(rd_kafka_t *rk, const rd_kafka_message_t *msg, void *opaque)
{
	(void) rk;
	(void) opaque;
	if (msg->err == RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		if (sent_at != NULL && msg->_private != NULL)
		{
			long idx = (long) (intptr_t) msg->_private - 1;

			latency[idx] = now_seconds() - sent_at[idx];
		}
		delivered++;
	}
	else
	{
		if (failed++ == 0)
			first_error = msg->err;
	}
}

/*
 * Undo COPY's text escaping in place (\\, \t, \n, \r); the harness's
 * payloads contain none of these, this is only for safety.
 */
static void
unescape(char *s)
{
	char *out = s;

	for (; *s; s++)
	{
		if (*s == '\\' && s[1] != '\0')
		{
			s++;
			switch (*s)
			{
				case 't':
					*out++ = '\t';
					break;
				case 'n':
					*out++ = '\n';
					break;
				case 'r':
					*out++ = '\r';
					break;
				default:
					*out++ = *s;
					break;
			}
		}
		else
			*out++ = *s;
	}
	*out = '\0';
}

static message *
read_messages(const char *path, long *count)
{
	FILE *f = fopen(path, "r");
	message *msgs = NULL;
	long n = 0;
	long cap = 0;
	char *line = NULL;
	size_t linecap = 0;
	ssize_t len;

	if (f == NULL)
	{
		perror(path);
		exit(2);
	}
	while ((len = getline(&line, &linecap, f)) > 0)
	{
		char *tab1;
		char *tab2;

		if (line[len - 1] == '\n')
			line[--len] = '\0';
		tab1 = strchr(line, '\t');
		tab2 = tab1 ? strchr(tab1 + 1, '\t') : NULL;
		if (tab2 == NULL)
		{
			fprintf(stderr, "%s:%ld: expected key<TAB>id<TAB>payload\n", path, n + 1);
			exit(2);
		}
		*tab1 = *tab2 = '\0';
		if (n == cap)
		{
			cap = cap ? cap * 2 : 65536;
			msgs = realloc(msgs, sizeof(message) * cap);
			if (msgs == NULL)
			{
				perror("realloc");
				exit(2);
			}
		}
		msgs[n].key = strdup(line);
		msgs[n].id = strdup(tab1 + 1);
		msgs[n].payload = strdup(tab2 + 1);
		unescape(msgs[n].key);
		unescape(msgs[n].payload);
		msgs[n].payload_len = strlen(msgs[n].payload);
		n++;
	}
	free(line);
	fclose(f);
	*count = n;
	return msgs;
}

static void
set(rd_kafka_conf_t *conf, const char *name, const char *value)
{
	char err[512];

	if (rd_kafka_conf_set(conf, name, value, err, sizeof(err)) != RD_KAFKA_CONF_OK)
	{
		fprintf(stderr, "librdkafka property %s: %s\n", name, err);
		exit(2);
	}
}

static int
compare_double(const void *a, const void *b)
{
	double x = *(const double *) a;
	double y = *(const double *) b;

	return (x > y) - (x < y);
}

/*
 * Hand one message to librdkafka, waiting while its local queue is full.
 * opaque is 0 or 1 + the message's index in the paced run.
 */
static void
produce_one(rd_kafka_t *rk, const char *topic, const message *m, long opaque)
{
	rd_kafka_headers_t *hdrs = rd_kafka_headers_new(1);
	rd_kafka_resp_err_t e;

	rd_kafka_header_add(hdrs, "event_id", -1, m->id, -1);
	for (;;)
	{
		e = rd_kafka_producev(rk,
							  RD_KAFKA_V_TOPIC(topic),
							  RD_KAFKA_V_KEY(m->key, strlen(m->key)),
							  RD_KAFKA_V_VALUE(m->payload, m->payload_len),
							  RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
							  RD_KAFKA_V_HEADERS(hdrs),
							  RD_KAFKA_V_OPAQUE((void *) (intptr_t) opaque),
							  RD_KAFKA_V_END);
		if (e != RD_KAFKA_RESP_ERR__QUEUE_FULL)
			break;
		rd_kafka_poll(rk, 10);
	}
	if (e != RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		rd_kafka_headers_destroy(hdrs);
		if (failed++ == 0)
			first_error = e;
	}
}

/* Serve delivery reports until there are n of them or 600 s have passed. */
static void
wait_for_reports(rd_kafka_t *rk, long n, double start)
{
	while (delivered + failed < n)
	{
		rd_kafka_poll(rk, 100);
		if (now_seconds() - start > 600)
		{
			fprintf(stderr, "gave up waiting for delivery reports\n");
			break;
		}
	}
}

/*
 * Paced mode: rate messages a second for seconds seconds, each sent at its
 * slot on the clock (start + i / rate), serving delivery reports between
 * slots so their arrival is timed to well under a millisecond.  With
 * burst > 0 (seconds), a message's slot moves to the next multiple of
 * burst from the start, so the messages of each interval go out together.
 */
static int
run_paced(rd_kafka_t *rk, const char *topic, message *msgs, long nmsgs,
		  double rate, double seconds, double burst)
{
	long n = (long) (rate * seconds);
	long i;
	long ok = 0;
	double start;
	double *sorted;

	sent_at = calloc(n, sizeof(double));
	latency = calloc(n, sizeof(double));
	sorted = calloc(n, sizeof(double));
	if (sent_at == NULL || latency == NULL || sorted == NULL || n <= 0)
	{
		fprintf(stderr, "bad rate or duration\n");
		return 2;
	}

	/* Connect and learn the topic's partitions before the clock starts. */
	produce_one(rk, topic, &msgs[0], 0);
	wait_for_reports(rk, 1, now_seconds());
	delivered = failed = 0;

	start = now_seconds();
	for (i = 0; i < n; i++)
	{
		double slot = start + i / rate;
		double t;

		if (burst > 0)
			slot = start + ceil(i / rate / burst) * burst;

		while ((t = now_seconds()) < slot)
		{
			int ms = (int) ((slot - t) * 1000);

			if (ms >= 1)
				rd_kafka_poll(rk, ms);
			else
			{
				struct timespec ts = {0, (long) ((slot - t) * 1e9)};

				rd_kafka_poll(rk, 0);
				nanosleep(&ts, NULL);
			}
		}
		sent_at[i] = now_seconds();
		produce_one(rk, topic, &msgs[i % nmsgs], i + 1);
		rd_kafka_poll(rk, 0);
	}
	wait_for_reports(rk, n, start);

	for (i = 0; i < n; i++)
		if (latency[i] > 0)
			sorted[ok++] = latency[i] * 1000;
	qsort(sorted, ok, sizeof(double), compare_double);
	printf("count=%ld failed=%ld p50_ms=%.2f p99_ms=%.2f max_ms=%.2f rate=%.0f\n",
		   ok, failed,
		   ok ? sorted[(long) (0.50 * (ok - 1))] : 0.0,
		   ok ? sorted[(long) (0.99 * (ok - 1))] : 0.0,
		   ok ? sorted[ok - 1] : 0.0,
		   n / (sent_at[n - 1] - start + 1.0 / rate));
	if (failed > 0)
		fprintf(stderr, "first error: %s\n", rd_kafka_err2str(first_error));
	return (ok == n) ? 0 : 1;
}

int
main(int argc, char **argv)
{
	const char *brokers = NULL;
	const char *topic = NULL;
	const char *path = NULL;
	double rate = 0;
	double seconds = 0;
	double burst = 0;
	message *msgs;
	long n;
	long i;
	int opt;
	double start;
	double elapsed;
	rd_kafka_conf_t *conf;
	rd_kafka_t *rk;
	char err[512];

	while ((opt = getopt(argc, argv, "b:t:f:r:d:g:")) != -1)
	{
		switch (opt)
		{
			case 'b':
				brokers = optarg;
				break;
			case 't':
				topic = optarg;
				break;
			case 'f':
				path = optarg;
				break;
			case 'r':
				rate = atof(optarg);
				break;
			case 'd':
				seconds = atof(optarg);
				break;
			case 'g':
				burst = atof(optarg) / 1000;
				break;
			default:
				fprintf(stderr, "usage: produce_baseline -b BROKERS -t TOPIC -f MESSAGES [-r RATE -d SECONDS [-g MS]]\n");
				return 2;
		}
	}
	if (brokers == NULL || topic == NULL || path == NULL)
	{
		fprintf(stderr, "usage: produce_baseline -b BROKERS -t TOPIC -f MESSAGES [-r RATE -d SECONDS [-g MS]]\n");
		return 2;
	}

	msgs = read_messages(path, &n);
	if (n == 0)
	{
		fprintf(stderr, "%s holds no messages\n", path);
		return 2;
	}

	start = now_seconds();

	/* The producer obx builds (src/relay/kafka.c), minus its log routing. */
	conf = rd_kafka_conf_new();
	set(conf, "bootstrap.servers", brokers);
	set(conf, "client.id", "obx-bench-baseline");
	set(conf, "enable.idempotence", "true");
	set(conf, "acks", "all");
	set(conf, "message.timeout.ms", "30000");
	set(conf, "partitioner", "murmur2_random");
	set(conf, "linger.ms", "1");
	set(conf, "socket.nagle.disable", "true");
	rd_kafka_conf_set_dr_msg_cb(conf, dr_callback);
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
	if (rk == NULL)
	{
		fprintf(stderr, "could not create the producer: %s\n", err);
		return 2;
	}

	if (rate > 0 || seconds > 0)
	{
		int rc = run_paced(rk, topic, msgs, n, rate, seconds, burst);

		rd_kafka_destroy(rk);
		return rc;
	}

	for (i = 0; i < n; i++)
	{
		produce_one(rk, topic, &msgs[i], 0);
		rd_kafka_poll(rk, 0);
	}
	wait_for_reports(rk, n, start);
	elapsed = now_seconds() - start;

	printf("seconds=%.3f delivered=%ld failed=%ld\n", elapsed, delivered, failed);
	if (failed > 0)
		fprintf(stderr, "first error: %s\n", rd_kafka_err2str(first_error));
	rd_kafka_destroy(rk);
	return (delivered == n) ? 0 : 1;
}
