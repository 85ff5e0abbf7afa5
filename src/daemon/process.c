/*-------------------------------------------------------------------------
 *
 * process.c
 *	  obx-relay's two processes: the signals both take (SIGTERM and
 *	  SIGINT stop, SIGHUP reloads the settings; the relay's process passes
 *	  them on to the consumer process), and the consumer process, which
 *	  runs the subscriptions (consume.c), started by the relay's process,
 *	  started again when it dies, and stopped with it.
 *
 *-------------------------------------------------------------------------
 */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "consume.h"
#include "daemon.h"
#include "process.h"
#include "settings.h"

volatile sig_atomic_t obx_stop_requested = 0;
volatile sig_atomic_t obx_reload_requested = 0;

/*
 * The consumer process (obx_consumer_process_run), as the relay's process
 * sees it: its pid while it runs, and when a new one may be started after
 * one died.
 */
static volatile pid_t consumer_pid = 0;
static long long consumer_start_at = 0;
static long long consumer_started = 0;
static int consumer_deaths = 0; /* in a row, each within a minute of its start */

/* Both signals go on to the consumer process, which stops or reloads too. */
static void
on_stop(int sig)
{
	(void) sig;
	obx_stop_requested = 1;
	if (consumer_pid > 0)
		kill(consumer_pid, SIGTERM);
}

static void
on_reload(int sig)
{
	(void) sig;
	obx_reload_requested = 1;
	if (consumer_pid > 0)
		kill(consumer_pid, SIGHUP);
}

/* The signals' handlers, in either process. */
void
obx_signals_install(void)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_stop;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sa.sa_handler = on_reload;
	sigaction(SIGHUP, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
}

/*
 * obx_consumer_process_run
 *		The consumer process: the subscriptions (consume.c) until SIGTERM,
 *		or until a SIGHUP's settings name none.  Its own process, so that
 *		a handler that takes long (up to its handler_timeout_ms) holds back
 *		neither the relay's claims nor the renewal of its leases.
 */
int
obx_consumer_process_run(void)
{
	while (obx_consume_enabled())
	{
		while (!obx_stop_requested && !obx_reload_requested)
			usleep((useconds_t) obx_consume_serve());
		obx_consume_stop();
		if (obx_stop_requested)
			return 0;
		obx_reload_requested = 0;
		obx_config_reload();
	}
	obx_say("LOG", "no subscription to run: the consumer process stops");
	return 0;
}

/*
 * Start the consumer process when the settings name subscriptions and none
 * runs (or is waiting to be started again): obx-relay itself again, with
 * --consumer.  The exec makes it a process of its own from the start (a
 * fork alone would copy one thread of a process whose librdkafka threads
 * may hold locks).  It dies with the relay, kill -9 included: a daemon is
 * its two processes or none.
 */
static void
consumer_start(void)
{
	pid_t parent = getpid();
	pid_t pid;
	char *const args[] = {"obx-relay", "--consumer", obx_config_file ? "--config" : NULL,
						  (char *) obx_config_file, NULL};

	if (!obx_consume_enabled() || consumer_pid > 0 || obx_stop_requested ||
		obx_now_us() < consumer_start_at)
		return;
	fflush(stderr);
	pid = fork();
	if (pid < 0)
	{
		obx_say("ERROR", "cannot start the consumer process: %s; again in 1 s", strerror(errno));
		consumer_start_at = obx_now_us() + 1000000;
		return;
	}
	if (pid == 0)
	{
		/* Only async-signal-safe calls until the exec. */
		if (prctl(PR_SET_PDEATHSIG, SIGKILL) == 0 && getppid() == parent)
			execv("/proc/self/exe", args);
		_exit(127);
	}
	consumer_pid = pid;
	consumer_started = obx_now_us();
}

/*
 * Whether the consumer process exited (without blocking).  One that died
 * while its subscriptions are still wanted is started again by
 * consumer_start: after a second, doubling up to a minute while each new
 * one dies within a minute.
 */
static void
consumer_reap(void)
{
	int status;
	int delay_s;

	if (consumer_pid <= 0 || waitpid(consumer_pid, &status, WNOHANG) != consumer_pid)
		return;
	consumer_pid = 0;
	if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
		return;
	consumer_deaths = obx_now_us() - consumer_started < 60000000LL ? consumer_deaths + 1 : 1;
	delay_s = consumer_deaths > 6 ? 60 : 1 << (consumer_deaths - 1);
	if (WIFSIGNALED(status))
		obx_say("WARNING", "the consumer process was killed by signal %d; a new one in %d s",
				WTERMSIG(status), delay_s);
	else
		obx_say("WARNING", "the consumer process exited with status %d; a new one in %d s",
				WEXITSTATUS(status), delay_s);
	consumer_start_at = obx_now_us() + delay_s * 1000000LL;
}

/* Stop the consumer process and wait for it; false if it did not stop cleanly. */
bool
obx_consumer_process_stop(void)
{
	int status = 0;

	if (consumer_pid <= 0)
		return true;
	kill(consumer_pid, SIGTERM);
	while (waitpid(consumer_pid, &status, 0) < 0 && errno == EINTR)
		;
	consumer_pid = 0;
	if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
		return true;
	obx_say("WARNING", "the consumer process did not stop cleanly");
	return false;
}

/*
 * From the relay's loop: the consumer process reaped if it exited, and
 * started if it is wanted and none runs.
 */
void
obx_consumer_process_watch(void)
{
	consumer_reap();
	consumer_start();
}
