<?php

namespace Obx\Laravel\Console;

use Illuminate\Database\ConnectionInterface;
use Illuminate\Database\DetectsLostConnections;
use Obx\Laravel\Work\LandedMessage;
use Obx\Laravel\Work\Worker;
use Throwable;

/**
 * obx:work: runs PHP listeners on the Kafka messages obx's consumer landed
 * for a consumer (a subscription whose handler is obx.land), one at a time,
 * each listener's effects committed with the message's completion in one
 * transaction.  Long-running like queue:work; as many processes as you
 * like (per key, messages still run one after another, in order).
 * SIGTERM, SIGINT and SIGQUIT let the current message finish, then exit.
 */
class WorkCommand extends ObxCommand
{
    use DetectsLostConnections;

    protected $signature = 'obx:work
        {consumer? : the consumer name (default: config obx.work.consumer)}
        {--connection= : the database connection (default: config obx.connection)}
        {--once : run at most one message, then exit}
        {--stop-when-empty : exit once no message is ready}
        {--max-jobs=0 : exit after this many messages (0: no limit)}
        {--max-time=0 : exit after this many seconds (0: no limit)}
        {--memory=128 : exit when the process uses more than this many megabytes}
        {--sleep=1 : seconds to wait when no message is ready (a landing ends the wait)}
        {--tries= : attempts per message before it is dead-lettered (default: config obx.work.tries)}
        {--backoff= : seconds before each retry, comma-separated, the last repeats (default: config obx.work.backoff)}';

    protected $description = 'Run PHP listeners on Kafka messages landed by obx, exactly once per message';

    private bool $quit = false;

    public function handle(): int
    {
        $config = $this->laravel['config'];
        $consumer = $this->argument('consumer') ?: $config->get('obx.work.consumer');
        if (!$consumer) {
            $this->error('name a consumer: obx:work <consumer>, or set config obx.work.consumer');
            return 2;
        }
        $backoff = $this->option('backoff') !== null
            ? array_map('intval', explode(',', $this->option('backoff')))
            : (array) $config->get('obx.work.backoff', [1, 5, 30]);
        $db = $this->outbox()->db();
        // The start counter's own connection, made by the database manager
        // so that it reconnects as the main one does.
        $starts = $db->getName() . '-obx-work-starts';
        $this->laravel['config']->set("database.connections.$starts", ['name' => $starts] + $db->getConfig());
        $worker = new Worker(
            $this->laravel,
            $db,
            $this->laravel['db']->connection($starts),
            $consumer,
            (array) $config->get('obx.work.listeners', []),
            (int) ($this->option('tries') ?? $config->get('obx.work.tries', 5)),
            $backoff,
        );
        $this->listenForSignals();
        $worker->listen();

        $started = microtime(true);
        $jobs = 0;
        $maxJobs = (int) $this->option('max-jobs');
        $maxTime = (int) $this->option('max-time');
        $stopWhenEmpty = $this->option('stop-when-empty') || $this->option('once');
        while (!$this->quit) {
            try {
                $ran = $worker->runNext();
                if ($ran === null && !$stopWhenEmpty) {
                    $worker->wait((float) $this->option('sleep'), fn () => $this->quit);
                }
            } catch (Throwable $e) {
                if (!$this->causedByLostConnection($e)) {
                    throw $e;
                }
                $this->warn(sprintf('[%s] lost the database connection (%s); reconnecting',
                    date('Y-m-d H:i:s'), $e->getMessage()));
                $this->reconnect($worker, $db);
                continue;
            }
            if ($ran === null) {
                if ($stopWhenEmpty) {
                    break;
                }
            } else {
                $jobs++;
                $this->report(...$ran);
                if ($this->option('once') || ($maxJobs > 0 && $jobs >= $maxJobs)) {
                    break;
                }
            }
            if (($maxTime > 0 && microtime(true) - $started >= $maxTime)
                || memory_get_usage(true) / 1048576 >= (int) $this->option('memory')) {
                break;
            }
        }
        return 0;
    }

    /**
     * After a lost connection (a database restart, a failover): reconnect,
     * after 0.1 s and then twice as long each time up to 5 s, and LISTEN
     * again, until it works or a signal stops the worker.  A message in
     * hand was rolled back with the connection: it is claimed again.
     */
    private function reconnect(Worker $worker, ConnectionInterface $db): void
    {
        $delay = 0.1;
        while (!$this->quit) {
            usleep((int) ($delay * 1e6));
            try {
                $db->reconnect();
                $worker->listen();
                $this->info(sprintf('[%s] reconnected', date('Y-m-d H:i:s')));
                return;
            } catch (Throwable $e) {
                if (!$this->causedByLostConnection($e) && !$e instanceof \PDOException) {
                    throw $e;
                }
                $delay = min(5.0, $delay * 2);
            }
        }
    }

    private function report(LandedMessage $message, string $outcome, ?Throwable $error): void
    {
        $label = [Worker::DONE => 'DONE', Worker::SKIPPED => 'SKIPPED (mapped to null)',
                  Worker::RETRY => 'FAILED, will retry', Worker::DEAD_LETTER => 'FAILED, dead-lettered'][$outcome];
        $line = sprintf('[%s] %s %s %s attempt %d: %s', date('Y-m-d H:i:s'), $message->where(),
            $message->eventType ?? '-', $message->eventId, $message->attempt, $label);
        if ($error !== null) {
            $this->warn($line . ': ' . get_class($error) . ': ' . $error->getMessage());
        } else {
            $this->line($line);
        }
    }

    private function listenForSignals(): void
    {
        if (!extension_loaded('pcntl')) {
            return;
        }
        pcntl_async_signals(true);
        foreach ([SIGTERM, SIGINT, SIGQUIT] as $signal) {
            pcntl_signal($signal, function () {
                $this->quit = true;
            });
        }
    }
}
