/*-------------------------------------------------------------------------
 *
 * obx_kafka_mock.c
 *	  obx-kafka-mock: a stand-alone Kafka stand-in for tests and demos.
 *
 * This program hosts librdkafka's built-in mock cluster (rdkafka_mock.h),
 * which speaks the real Kafka wire protocol on loopback ports, and exposes
 * a small line-oriented control protocol to inject faults into it (broker
 * outages, latency, per-request error codes, per-topic metadata errors).
 *
 * Control commands are read from stdin (replies go to stdout) and from a
 * TCP listener on 127.0.0.1.  Every command line gets exactly one reply
 * line: "ok", "ok <info>" or "error <message>".  Everything runs in a
 * single-threaded poll() loop; the mock brokers themselves run on
 * librdkafka's own internal thread.
 *
 * The process runs until "quit", SIGTERM or SIGINT.  End of file on stdin
 * merely stops reading stdin.
 *
 * tools/obx_kafka_mock.c
 *
 *-------------------------------------------------------------------------
 */
#define _GNU_SOURCE

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#define PROGNAME "obx-kafka-mock"

#define MAX_BROKERS     64
#define MAX_PARTITIONS  10000
#define MAX_RTT_MS      600000
#define MAX_ERROR_COUNT 10000
#define MAX_CTL_CLIENTS 64
#define CTL_LINE_MAX    8192
#define MAX_TOPIC_NAME  249

/* Exit codes */
#define EXIT_OK          0
#define EXIT_FAILURE_RUN 1
#define EXIT_BAD_USAGE   2

/*
 * A source of control commands: stdin or one TCP control connection.
 * Bytes are accumulated in buf until a newline completes a command.
 */
typedef struct ctl_conn
{
	int fd;          /* input fd, -1 if slot unused / closed */
	bool is_stdin;   /* replies go to stdout rather than fd */
	bool discarding; /* skipping the rest of an over-long line */
	size_t len;      /* bytes buffered in buf */
	char buf[CTL_LINE_MAX];
} ctl_conn;

/* Global program state; there is only ever one mock cluster. */
typedef struct mock_state
{
	rd_kafka_t *rk; /* client handle that hosts the cluster */
	rd_kafka_mock_cluster_t *mcluster;
	int broker_cnt;
	int default_partitions;
	char *bootstraps; /* copy of the bootstrap.servers list */
	bool quit_requested;
} mock_state;

/* Kafka protocol API names accepted by request-errors, by ApiKey. */
typedef struct api_name
{
	const char *name;
	int16_t key;
} api_name;

static const api_name api_names[] = {
	{"Produce", 0},
	{"Fetch", 1},
	{"ListOffsets", 2},
	{"Metadata", 3},
	{"OffsetCommit", 8},
	{"OffsetFetch", 9},
	{"FindCoordinator", 10},
	{"JoinGroup", 11},
	{"Heartbeat", 12},
	{"LeaveGroup", 13},
	{"SyncGroup", 14},
	{"DescribeGroups", 15},
	{"ListGroups", 16},
	{"SaslHandshake", 17},
	{"ApiVersions", 18},
	{"CreateTopics", 19},
	{"DeleteTopics", 20},
	{"DeleteRecords", 21},
	{"InitProducerId", 22},
	{"OffsetForLeaderEpoch", 23},
	{"AddPartitionsToTxn", 24},
	{"AddOffsetsToTxn", 25},
	{"EndTxn", 26},
	{"TxnOffsetCommit", 28},
	{"DescribeConfigs", 32},
	{"AlterConfigs", 33},
	{"SaslAuthenticate", 36},
	{"CreatePartitions", 37},
	{"DeleteGroups", 42},
	{NULL, 0}};

static mock_state state;

/* Write end / read end of the self-pipe used to wake poll() on signals. */
static int signal_pipe[2] = {-1, -1};
static volatile sig_atomic_t got_signal = 0;

/* State file bookkeeping, so that it can be removed on exit. */
static const char *state_file_path = NULL;
static bool state_file_written = false;

/*
 * Print usage text to the given stream.
 */
static void
usage(FILE *out)
{
	fprintf(out,
			"Usage: " PROGNAME " [OPTIONS]\n"
			"\n"
			"Run a librdkafka mock Kafka cluster on loopback ports and accept\n"
			"fault-injection commands on stdin and on a TCP control port.\n"
			"\n"
			"Options:\n"
			"  --brokers N          number of mock brokers, ids 1..N (default 3)\n"
			"  --partitions N       default partition count for topic-create\n"
			"                       (default 4; see note below)\n"
			"  --control-port P     TCP control port on 127.0.0.1\n"
			"                       (default 0 = pick an ephemeral port)\n"
			"  --state-file PATH    write bootstrap=, control=, pid= lines to PATH\n"
			"                       (atomically) at startup, remove it at exit\n"
			"  --help               show this help and exit\n"
			"\n"
			"Note: topics auto-created by clients always get librdkafka's\n"
			"built-in default of 4 partitions; use \"topic-create\" to get\n"
			"a different count.\n"
			"\n"
			"Commands (one per line; reply is \"ok [info]\" or \"error <msg>\"):\n"
			"  ping\n"
			"  down <broker_id|all>\n"
			"  up <broker_id|all>\n"
			"  rtt <broker_id|all> <ms>\n"
			"  produce-errors <count> <err>...\n"
			"  request-errors <ApiName|ApiKey> <count> <err>...\n"
			"  request-errors-clear <ApiName|ApiKey>\n"
			"  topic-create <name> [<partitions> [<replication>]]\n"
			"  topic-error <name> <err>          (NO_ERROR clears)\n"
			"  leader <name> <partition> <broker_id>\n"
			"  brokers\n"
			"  quit\n");
}

/*
 * Report a command-line problem and exit with the usage error code.
 */
static void
bad_usage(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, PROGNAME ": ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\nTry \"" PROGNAME " --help\" for more information.\n");
	exit(EXIT_BAD_USAGE);
}

/*
 * Parse a complete decimal integer in [min, max].
 *
 * Returns true and sets *result on success; false if str is empty, has
 * trailing garbage, or is out of range.
 */
static bool
parse_int(const char *str, long min, long max, long *result)
{
	char *end;
	long val;

	if (str == NULL || *str == '\0')
		return false;
	errno = 0;
	val = strtol(str, &end, 10);
	if (errno != 0 || *end != '\0' || val < min || val > max)
		return false;
	*result = val;
	return true;
}

/*
 * Translate an error name or number into an rd_kafka_resp_err_t.
 *
 * Names are those printed by rd_kafka_err2name() (e.g. NOT_ENOUGH_REPLICAS,
 * _TRANSPORT), matched case-insensitively, with an optional
 * "RD_KAFKA_RESP_ERR_" or "ERR_" prefix.  Numbers may be any value in the
 * int16 range.  Returns false if the token is not recognised.
 */
static bool
parse_error_code(const char *tok, rd_kafka_resp_err_t *err)
{
	const struct rd_kafka_err_desc *descs;
	size_t ndescs;
	size_t i;
	long num;

	if (parse_int(tok, SHRT_MIN, SHRT_MAX, &num))
	{
		*err = (rd_kafka_resp_err_t) num;
		return true;
	}

	if (strncasecmp(tok, "RD_KAFKA_RESP_ERR_", 18) == 0)
		tok += 18;
	else if (strncasecmp(tok, "ERR_", 4) == 0)
		tok += 4;

	rd_kafka_get_err_descs(&descs, &ndescs);
	for (i = 0; i < ndescs; i++)
	{
		if (descs[i].name != NULL && strcasecmp(descs[i].name, tok) == 0)
		{
			*err = descs[i].code;
			return true;
		}
	}
	return false;
}

/*
 * Translate a Kafka API name (case-insensitive) or ApiKey number.
 */
static bool
parse_api_key(const char *tok, int16_t *key)
{
	const api_name *an;
	long num;

	if (parse_int(tok, 0, 999, &num))
	{
		*key = (int16_t) num;
		return true;
	}
	for (an = api_names; an->name != NULL; an++)
	{
		if (strcasecmp(an->name, tok) == 0)
		{
			*key = an->key;
			return true;
		}
	}
	return false;
}

/*
 * Parse "all" (-> -1) or a broker id in 1..broker_cnt.
 */
static bool
parse_broker_id(const char *tok, int32_t *broker_id)
{
	long num;

	if (strcasecmp(tok, "all") == 0)
	{
		*broker_id = -1;
		return true;
	}
	if (!parse_int(tok, 1, state.broker_cnt, &num))
		return false;
	*broker_id = (int32_t) num;
	return true;
}

/*
 * Check a topic name against Kafka's rules: 1..249 chars of [a-zA-Z0-9._-],
 * and not "." or "..".
 */
static bool
valid_topic_name(const char *name)
{
	size_t len = strlen(name);
	const char *p;

	if (len == 0 || len > MAX_TOPIC_NAME ||
		strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
		return false;
	for (p = name; *p; p++)
	{
		if (!isalnum((unsigned char) *p) && *p != '.' && *p != '_' &&
			*p != '-')
			return false;
	}
	return true;
}

/*
 * Shared implementation of produce-errors and request-errors.
 *
 * args[0] is the count, args[1..nargs-1] the error codes.  Either exactly
 * one code (repeated count times) or exactly count codes must be given.
 * Writes the reply into reply.
 */
static void
push_errors(int16_t api_key, char **args, int nargs,
			char *reply, size_t replysz)
{
	long count;
	int nerrs = nargs - 1;
	rd_kafka_resp_err_t *errs;
	long i;

	if (nargs < 2)
	{
		snprintf(reply, replysz, "error expected <count> <err>...");
		return;
	}
	if (!parse_int(args[0], 1, MAX_ERROR_COUNT, &count))
	{
		snprintf(reply, replysz, "error invalid count \"%s\" (1..%d)",
				 args[0], MAX_ERROR_COUNT);
		return;
	}
	if (nerrs != 1 && nerrs != count)
	{
		if (count == 1)
			snprintf(reply, replysz,
					 "error expected 1 error code, got %d", nerrs);
		else
			snprintf(reply, replysz,
					 "error expected 1 or %ld error codes, got %d",
					 count, nerrs);
		return;
	}

	errs = calloc((size_t) count, sizeof(*errs));
	if (errs == NULL)
	{
		snprintf(reply, replysz, "error out of memory");
		return;
	}
	for (i = 0; i < count; i++)
	{
		const char *tok = args[1 + (nerrs == 1 ? 0 : i)];

		if (!parse_error_code(tok, &errs[i]))
		{
			snprintf(reply, replysz, "error unknown error code \"%s\"", tok);
			free(errs);
			return;
		}
	}

	rd_kafka_mock_push_request_errors_array(state.mcluster, api_key,
											(size_t) count, errs);
	free(errs);
	snprintf(reply, replysz, "ok");
}

/*
 * Execute one control command line (already stripped of its newline) and
 * write exactly one reply line, without newline, into reply.
 *
 * Returns false if the line was blank (no reply is to be sent).
 */
static bool
exec_command(char *line, char *reply, size_t replysz)
{
	char *args[CTL_LINE_MAX / 2 + 1];
	int nargs = 0;
	char *save = NULL;
	char *tok;
	const char *cmd;
	rd_kafka_resp_err_t err;

	for (tok = strtok_r(line, " \t\r", &save); tok != NULL;
		 tok = strtok_r(NULL, " \t\r", &save))
		args[nargs++] = tok;
	if (nargs == 0)
		return false;

	cmd = args[0];

	if (strcmp(cmd, "ping") == 0)
	{
		if (nargs != 1)
			snprintf(reply, replysz, "error usage: ping");
		else
			snprintf(reply, replysz, "ok");
	}
	else if (strcmp(cmd, "down") == 0 || strcmp(cmd, "up") == 0)
	{
		int32_t broker_id;
		bool down = (cmd[0] == 'd');

		if (nargs != 2)
			snprintf(reply, replysz, "error usage: %s <broker_id|all>", cmd);
		else if (!parse_broker_id(args[1], &broker_id))
			snprintf(reply, replysz,
					 "error invalid broker \"%s\" (expected 1..%d or all)",
					 args[1], state.broker_cnt);
		else
		{
			if (down)
				err = rd_kafka_mock_broker_set_down(state.mcluster, broker_id);
			else
				err = rd_kafka_mock_broker_set_up(state.mcluster, broker_id);
			if (err)
				snprintf(reply, replysz, "error %s", rd_kafka_err2name(err));
			else
				snprintf(reply, replysz, "ok");
		}
	}
	else if (strcmp(cmd, "rtt") == 0)
	{
		int32_t broker_id;
		long ms;

		if (nargs != 3)
			snprintf(reply, replysz, "error usage: rtt <broker_id|all> <ms>");
		else if (!parse_broker_id(args[1], &broker_id))
			snprintf(reply, replysz,
					 "error invalid broker \"%s\" (expected 1..%d or all)",
					 args[1], state.broker_cnt);
		else if (!parse_int(args[2], 0, MAX_RTT_MS, &ms))
			snprintf(reply, replysz, "error invalid rtt \"%s\" (0..%d ms)",
					 args[2], MAX_RTT_MS);
		else
		{
			err = rd_kafka_mock_broker_set_rtt(state.mcluster, broker_id,
											   (int) ms);
			if (err)
				snprintf(reply, replysz, "error %s", rd_kafka_err2name(err));
			else
				snprintf(reply, replysz, "ok");
		}
	}
	else if (strcmp(cmd, "produce-errors") == 0)
		push_errors(0, &args[1], nargs - 1, reply, replysz);
	else if (strcmp(cmd, "request-errors") == 0)
	{
		int16_t api_key;

		if (nargs < 2)
			snprintf(reply, replysz,
					 "error usage: request-errors <api> <count> <err>...");
		else if (!parse_api_key(args[1], &api_key))
			snprintf(reply, replysz, "error unknown API \"%s\"", args[1]);
		else
			push_errors(api_key, &args[2], nargs - 2, reply, replysz);
	}
	else if (strcmp(cmd, "request-errors-clear") == 0)
	{
		int16_t api_key;

		if (nargs != 2)
			snprintf(reply, replysz, "error usage: request-errors-clear <api>");
		else if (!parse_api_key(args[1], &api_key))
			snprintf(reply, replysz, "error unknown API \"%s\"", args[1]);
		else
		{
			rd_kafka_mock_clear_request_errors(state.mcluster, api_key);
			snprintf(reply, replysz, "ok");
		}
	}
	else if (strcmp(cmd, "topic-create") == 0)
	{
		long partitions = state.default_partitions;
		long replication = state.broker_cnt < 3 ? state.broker_cnt : 3;

		if (nargs < 2 || nargs > 4)
			snprintf(reply, replysz,
					 "error usage: topic-create <name> [<partitions> [<replication>]]");
		else if (!valid_topic_name(args[1]))
			snprintf(reply, replysz, "error invalid topic name \"%s\"",
					 args[1]);
		else if (nargs >= 3 &&
				 !parse_int(args[2], 1, MAX_PARTITIONS, &partitions))
			snprintf(reply, replysz,
					 "error invalid partition count \"%s\" (1..%d)",
					 args[2], MAX_PARTITIONS);
		else if (nargs >= 4 &&
				 !parse_int(args[3], 1, state.broker_cnt, &replication))
			snprintf(reply, replysz,
					 "error invalid replication factor \"%s\" (1..%d)",
					 args[3], state.broker_cnt);
		else
		{
			err = rd_kafka_mock_topic_create(state.mcluster, args[1],
											 (int) partitions,
											 (int) replication);
			if (err)
				snprintf(reply, replysz, "error %s", rd_kafka_err2name(err));
			else
				snprintf(reply, replysz, "ok");
		}
	}
	else if (strcmp(cmd, "topic-error") == 0)
	{
		if (nargs != 3)
			snprintf(reply, replysz, "error usage: topic-error <name> <err>");
		else if (!valid_topic_name(args[1]))
			snprintf(reply, replysz, "error invalid topic name \"%s\"",
					 args[1]);
		else if (!parse_error_code(args[2], &err))
			snprintf(reply, replysz, "error unknown error code \"%s\"",
					 args[2]);
		else
		{
			/* Note: creates the topic with default settings if missing. */
			rd_kafka_mock_topic_set_error(state.mcluster, args[1], err);
			snprintf(reply, replysz, "ok");
		}
	}
	else if (strcmp(cmd, "leader") == 0)
	{
		long partition;
		int32_t broker_id;

		if (nargs != 4)
			snprintf(reply, replysz,
					 "error usage: leader <name> <partition> <broker_id>");
		else if (!valid_topic_name(args[1]))
			snprintf(reply, replysz, "error invalid topic name \"%s\"",
					 args[1]);
		else if (!parse_int(args[2], 0, MAX_PARTITIONS - 1, &partition))
			snprintf(reply, replysz, "error invalid partition \"%s\" (0..%d)",
					 args[2], MAX_PARTITIONS - 1);
		else if (strcasecmp(args[3], "all") == 0 ||
				 !parse_broker_id(args[3], &broker_id))
			snprintf(reply, replysz, "error invalid broker id \"%s\" (1..%d)",
					 args[3], state.broker_cnt);
		else
		{
			err = rd_kafka_mock_partition_set_leader(state.mcluster, args[1],
													 (int32_t) partition,
													 broker_id);
			if (err)
				snprintf(reply, replysz, "error %s", rd_kafka_err2name(err));
			else
				snprintf(reply, replysz, "ok");
		}
	}
	else if (strcmp(cmd, "brokers") == 0)
	{
		if (nargs != 1)
			snprintf(reply, replysz, "error usage: brokers");
		else
			snprintf(reply, replysz, "ok %s", state.bootstraps);
	}
	else if (strcmp(cmd, "quit") == 0)
	{
		if (nargs != 1)
			snprintf(reply, replysz, "error usage: quit");
		else
		{
			state.quit_requested = true;
			snprintf(reply, replysz, "ok");
		}
	}
	else
		snprintf(reply, replysz, "error unknown command \"%.64s\"", cmd);

	return true;
}

/*
 * Send one reply line to the connection's peer (stdout for stdin).
 *
 * Returns false if the peer could not be written to (the caller should
 * then drop the connection).  Replies are tiny, so a socket whose send
 * buffer is full is treated as a dead peer rather than queued for.
 */
static bool
send_reply(ctl_conn *conn, const char *reply)
{
	char out[1100];
	size_t len;
	size_t off = 0;

	if (conn->is_stdin)
	{
		fprintf(stdout, "%s\n", reply);
		fflush(stdout);
		return true;
	}

	snprintf(out, sizeof(out), "%s\n", reply);
	len = strlen(out);
	while (off < len)
	{
		ssize_t w = send(conn->fd, out + off, len - off, MSG_NOSIGNAL);

		if (w < 0)
		{
			if (errno == EINTR)
				continue;
			return false;
		}
		off += (size_t) w;
	}
	return true;
}

/*
 * Run every complete line buffered in conn, sending one reply per
 * non-blank line.  If at_eof, a trailing unterminated line is run too.
 *
 * Returns false if the connection must be closed (write failure).
 * Stops early once quit has been requested.
 */
static bool
process_lines(ctl_conn *conn, bool at_eof)
{
	char reply[1024];
	size_t start = 0;

	while (start < conn->len && !state.quit_requested)
	{
		char *nl = memchr(conn->buf + start, '\n', conn->len - start);
		char *line = conn->buf + start;

		if (nl == NULL)
		{
			if (!at_eof)
				break;
			/* Unterminated last line: treat the buffer end as newline. */
			if (conn->len == sizeof(conn->buf))
				break;
			nl = conn->buf + conn->len;
		}
		*nl = '\0';
		start = (size_t) (nl - conn->buf) + 1;
		if (start > conn->len)
			start = conn->len;

		if (conn->discarding)
		{
			/* Tail of an over-long line; its error was already sent. */
			conn->discarding = false;
			continue;
		}
		if (memchr(line, '\0', (size_t) (nl - line)) != NULL)
		{
			if (!send_reply(conn, "error command contains NUL byte"))
				return false;
			continue;
		}
		if (exec_command(line, reply, sizeof(reply)) &&
			!send_reply(conn, reply))
			return false;
	}

	/* Keep any unterminated remainder for the next read. */
	if (start > 0)
	{
		memmove(conn->buf, conn->buf + start, conn->len - start);
		conn->len -= start;
	}

	/* A full buffer without newline: reject the line, skip to next '\n'. */
	if (conn->len == sizeof(conn->buf))
	{
		if (!conn->discarding &&
			!send_reply(conn, "error command line too long"))
			return false;
		conn->discarding = true;
		conn->len = 0;
	}
	return true;
}

/*
 * Read what is available on conn and run any complete commands.
 *
 * Returns false when the connection has reached EOF or failed; the
 * caller then stops polling it (and closes it unless it is stdin).
 */
static bool
service_conn(ctl_conn *conn)
{
	ssize_t n;

	n = read(conn->fd, conn->buf + conn->len, sizeof(conn->buf) - conn->len);
	if (n < 0)
	{
		if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)
			return true;
		return false;
	}
	if (n == 0)
	{
		(void) process_lines(conn, true);
		return false;
	}
	conn->len += (size_t) n;
	return process_lines(conn, false);
}

/*
 * Async-signal-safe handler for SIGTERM/SIGINT: note the signal and wake
 * the main loop through the self-pipe.  It may run on any thread.
 */
static void
handle_signal(int signo)
{
	int save_errno = errno;
	char c = 1;

	(void) signo;
	got_signal = 1;
	if (signal_pipe[1] >= 0)
		(void) write(signal_pipe[1], &c, 1);
	errno = save_errno;
}

/*
 * Set O_NONBLOCK and FD_CLOEXEC on fd.  Returns false on failure.
 */
static bool
set_nonblock_cloexec(int fd)
{
	int flags = fcntl(fd, F_GETFL);

	if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
		return false;
	flags = fcntl(fd, F_GETFD);
	if (flags < 0 || fcntl(fd, F_SETFD, flags | FD_CLOEXEC) < 0)
		return false;
	return true;
}

/*
 * Create the control listener on 127.0.0.1:port (0 = ephemeral).
 *
 * Returns the listening fd and stores the bound port in *bound_port,
 * or returns -1 after printing a message on stderr.
 */
static int
open_control_listener(int port, int *bound_port)
{
	struct sockaddr_in addr;
	socklen_t addrlen = sizeof(addr);
	int fd;
	int one = 1;

	fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0)
	{
		fprintf(stderr, PROGNAME ": socket: %s\n", strerror(errno));
		return -1;
	}
	(void) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));

	memset(&addr, 0, sizeof(addr));
	addr.sin_family = AF_INET;
	addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	addr.sin_port = htons((uint16_t) port);

	if (bind(fd, (struct sockaddr *) &addr, sizeof(addr)) < 0 ||
		listen(fd, 64) < 0 ||
		getsockname(fd, (struct sockaddr *) &addr, &addrlen) < 0 ||
		!set_nonblock_cloexec(fd))
	{
		fprintf(stderr, PROGNAME ": cannot listen on 127.0.0.1:%d: %s\n",
				port, strerror(errno));
		close(fd);
		return -1;
	}
	*bound_port = ntohs(addr.sin_port);
	return fd;
}

/*
 * Atomically publish the state file: write PATH.tmp, then rename to PATH.
 * Returns false after printing a message on stderr.
 */
static bool
write_state_file(const char *path, int control_port)
{
	size_t tmplen = strlen(path) + 5;
	char *tmp = malloc(tmplen);
	FILE *f;
	bool ok;

	if (tmp == NULL)
	{
		fprintf(stderr, PROGNAME ": out of memory\n");
		return false;
	}
	snprintf(tmp, tmplen, "%s.tmp", path);

	f = fopen(tmp, "w");
	if (f == NULL)
	{
		fprintf(stderr, PROGNAME ": cannot create \"%s\": %s\n",
				tmp, strerror(errno));
		free(tmp);
		return false;
	}
	fprintf(f, "bootstrap=%s\ncontrol=127.0.0.1:%d\npid=%ld\n",
			state.bootstraps, control_port, (long) getpid());
	ok = (fflush(f) == 0 && !ferror(f));
	if (fclose(f) != 0)
		ok = false;
	if (!ok)
	{
		fprintf(stderr, PROGNAME ": cannot write \"%s\": %s\n",
				tmp, strerror(errno));
		unlink(tmp);
		free(tmp);
		return false;
	}
	if (rename(tmp, path) != 0)
	{
		fprintf(stderr, PROGNAME ": cannot rename \"%s\" to \"%s\": %s\n",
				tmp, path, strerror(errno));
		unlink(tmp);
		free(tmp);
		return false;
	}
	free(tmp);
	return true;
}

/*
 * Create the hosting rd_kafka_t and the mock cluster.  Returns false after
 * printing a message on stderr.
 */
static bool
start_cluster(void)
{
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	char errstr[512];
	const char *bs;

	/*
	 * The hosting handle never connects anywhere; it only provides the
	 * mock cluster with its bookkeeping.  Keep it quiet about having no
	 * bootstrap servers.
	 *
	 * The mock brokers' sockets take their options from this handle, and
	 * librdkafka leaves Nagle's algorithm on by default.  A Kafka broker
	 * turns it off (TCP_NODELAY on every accepted connection); with it on,
	 * a response written while the client has not yet acknowledged the
	 * previous one waits for that acknowledgement, which the client may
	 * delay by up to 40 ms.
	 */
	if (rd_kafka_conf_set(conf, "log_level", "3",
						  errstr, sizeof(errstr)) != RD_KAFKA_CONF_OK ||
		rd_kafka_conf_set(conf, "socket.nagle.disable", "true",
						  errstr, sizeof(errstr)) != RD_KAFKA_CONF_OK)
	{
		fprintf(stderr, PROGNAME ": %s\n", errstr);
		rd_kafka_conf_destroy(conf);
		return false;
	}

	state.rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
	if (state.rk == NULL)
	{
		fprintf(stderr, PROGNAME ": cannot create Kafka handle: %s\n", errstr);
		rd_kafka_conf_destroy(conf);
		return false;
	}

	state.mcluster = rd_kafka_mock_cluster_new(state.rk, state.broker_cnt);
	if (state.mcluster == NULL)
	{
		fprintf(stderr, PROGNAME ": cannot create mock cluster\n");
		rd_kafka_destroy(state.rk);
		state.rk = NULL;
		return false;
	}

	bs = rd_kafka_mock_cluster_bootstraps(state.mcluster);
	state.bootstraps = strdup(bs ? bs : "");
	if (state.bootstraps == NULL)
	{
		fprintf(stderr, PROGNAME ": out of memory\n");
		return false;
	}
	return true;
}

/*
 * Tear down the mock cluster (closing its broker listeners) and its host.
 */
static void
stop_cluster(void)
{
	if (state.mcluster != NULL)
		rd_kafka_mock_cluster_destroy(state.mcluster);
	state.mcluster = NULL;
	if (state.rk != NULL)
		rd_kafka_destroy(state.rk);
	state.rk = NULL;
	free(state.bootstraps);
	state.bootstraps = NULL;
}

/*
 * Parse argv into the given settings; exits with status 2 on bad usage.
 */
static void
parse_args(int argc, char **argv, int *control_port)
{
	int i;

	state.broker_cnt = 3;
	state.default_partitions = 4;
	*control_port = 0;

	for (i = 1; i < argc; i++)
	{
		const char *opt = argv[i];
		const char *val = NULL;
		const char *eq;
		size_t optlen;
		long num;

		if (strcmp(opt, "--help") == 0 || strcmp(opt, "-h") == 0)
		{
			usage(stdout);
			exit(EXIT_OK);
		}

		/* Accept both "--opt value" and "--opt=value". */
		eq = strchr(opt, '=');
		optlen = eq ? (size_t) (eq - opt) : strlen(opt);
		if (eq)
			val = eq + 1;

#define OPT_IS(name) (optlen == strlen(name) && strncmp(opt, name, optlen) == 0)

		if (!OPT_IS("--brokers") && !OPT_IS("--partitions") &&
			!OPT_IS("--control-port") && !OPT_IS("--state-file"))
			bad_usage("unrecognized argument \"%s\"", opt);

		if (val == NULL)
		{
			if (i + 1 >= argc)
				bad_usage("option \"%.*s\" requires a value",
						  (int) optlen, opt);
			val = argv[++i];
		}

		if (OPT_IS("--brokers"))
		{
			if (!parse_int(val, 1, MAX_BROKERS, &num))
				bad_usage("invalid --brokers value \"%s\" (expected 1..%d)",
						  val, MAX_BROKERS);
			state.broker_cnt = (int) num;
		}
		else if (OPT_IS("--partitions"))
		{
			if (!parse_int(val, 1, MAX_PARTITIONS, &num))
				bad_usage("invalid --partitions value \"%s\" (expected 1..%d)",
						  val, MAX_PARTITIONS);
			state.default_partitions = (int) num;
		}
		else if (OPT_IS("--control-port"))
		{
			if (!parse_int(val, 0, 65535, &num))
				bad_usage("invalid --control-port value \"%s\" (expected 0..65535)",
						  val);
			*control_port = (int) num;
		}
		else
		{
			if (*val == '\0')
				bad_usage("--state-file requires a non-empty path");
			state_file_path = val;
		}
#undef OPT_IS
	}
}

int
main(int argc, char **argv)
{
	int control_port;
	int bound_port = 0;
	int listen_fd;
	ctl_conn stdin_conn;
	ctl_conn *clients;
	struct pollfd pfds[3 + MAX_CTL_CLIENTS];
	int client_slot[3 + MAX_CTL_CLIENTS];
	struct sigaction sa;
	int exit_code = EXIT_OK;
	int i;

	parse_args(argc, argv, &control_port);

	if (state.default_partitions != 4)
		fprintf(stderr,
				PROGNAME ": note: --partitions only applies to topic-create; "
						 "topics auto-created by clients get 4 partitions\n");

	setvbuf(stdout, NULL, _IOLBF, 0);

	/* Signals: SIGPIPE is ignored, SIGTERM/SIGINT go through a self-pipe. */
	if (pipe(signal_pipe) != 0 ||
		!set_nonblock_cloexec(signal_pipe[0]) ||
		!set_nonblock_cloexec(signal_pipe[1]))
	{
		fprintf(stderr, PROGNAME ": cannot create pipe: %s\n", strerror(errno));
		return EXIT_FAILURE_RUN;
	}
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = SIG_IGN;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGPIPE, &sa, NULL);
	/* Reading a terminal from the background then fails instead of stopping. */
	sigaction(SIGTTIN, &sa, NULL);
	sa.sa_handler = handle_signal;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);

	clients = calloc(MAX_CTL_CLIENTS, sizeof(*clients));
	if (clients == NULL)
	{
		fprintf(stderr, PROGNAME ": out of memory\n");
		return EXIT_FAILURE_RUN;
	}
	for (i = 0; i < MAX_CTL_CLIENTS; i++)
		clients[i].fd = -1;

	listen_fd = open_control_listener(control_port, &bound_port);
	if (listen_fd < 0)
		return EXIT_FAILURE_RUN;

	if (!start_cluster())
	{
		stop_cluster();
		return EXIT_FAILURE_RUN;
	}

	printf("bootstrap %s\n", state.bootstraps);
	printf("control 127.0.0.1:%d\n", bound_port);
	if (state_file_path != NULL)
	{
		if (!write_state_file(state_file_path, bound_port))
		{
			stop_cluster();
			return EXIT_FAILURE_RUN;
		}
		state_file_written = true;
	}
	printf("ready\n");
	fflush(stdout);

	memset(&stdin_conn, 0, sizeof(stdin_conn));
	stdin_conn.fd = STDIN_FILENO;
	stdin_conn.is_stdin = true;

	while (!state.quit_requested && !got_signal)
	{
		int npfds = 0;
		int rc;

		pfds[npfds].fd = signal_pipe[0];
		pfds[npfds].events = POLLIN;
		client_slot[npfds++] = -1;
		pfds[npfds].fd = listen_fd;
		pfds[npfds].events = POLLIN;
		client_slot[npfds++] = -1;
		pfds[npfds].fd = stdin_conn.fd; /* negative fd: ignored */
		pfds[npfds].events = POLLIN;
		client_slot[npfds++] = -1;
		for (i = 0; i < MAX_CTL_CLIENTS; i++)
		{
			if (clients[i].fd < 0)
				continue;
			pfds[npfds].fd = clients[i].fd;
			pfds[npfds].events = POLLIN;
			client_slot[npfds++] = i;
		}

		rc = poll(pfds, (nfds_t) npfds, -1);
		if (rc < 0)
		{
			if (errno == EINTR)
				continue;
			fprintf(stderr, PROGNAME ": poll: %s\n", strerror(errno));
			exit_code = EXIT_FAILURE_RUN;
			break;
		}

		if (pfds[0].revents)
		{
			char drain[64];

			while (read(signal_pipe[0], drain, sizeof(drain)) > 0)
				;
		}

		/* stdin */
		if (pfds[2].revents && !state.quit_requested)
		{
			if (!service_conn(&stdin_conn))
				stdin_conn.fd = -1; /* EOF: stop reading, keep running */
		}

		/* existing control connections */
		for (i = 3; i < npfds && !state.quit_requested; i++)
		{
			ctl_conn *c = &clients[client_slot[i]];

			if (pfds[i].revents == 0)
				continue;
			if (!service_conn(c))
			{
				close(c->fd);
				c->fd = -1;
			}
		}

		/* new control connections */
		if ((pfds[1].revents & POLLIN) && !state.quit_requested)
		{
			for (;;)
			{
				int fd = accept(listen_fd, NULL, NULL);
				int slot;

				if (fd < 0)
					break; /* EAGAIN or transient error */
				for (slot = 0; slot < MAX_CTL_CLIENTS; slot++)
					if (clients[slot].fd < 0)
						break;
				if (slot == MAX_CTL_CLIENTS || !set_nonblock_cloexec(fd))
				{
					static const char msg[] = "error too many control connections\n";

					(void) send(fd, msg, sizeof(msg) - 1, MSG_NOSIGNAL);
					close(fd);
					continue;
				}
				memset(&clients[slot], 0, sizeof(clients[slot]));
				clients[slot].fd = fd;
			}
		}
	}

	for (i = 0; i < MAX_CTL_CLIENTS; i++)
		if (clients[i].fd >= 0)
			close(clients[i].fd);
	free(clients);
	close(listen_fd);

	stop_cluster();

	if (state_file_written)
		(void) unlink(state_file_path);

	return exit_code;
}
