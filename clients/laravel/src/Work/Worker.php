<?php

namespace Obx\Laravel\Work;

use Illuminate\Contracts\Container\Container;
use Illuminate\Contracts\Debug\ExceptionHandler;
use Illuminate\Contracts\Events\Dispatcher;
use Illuminate\Database\ConnectionInterface;
use Obx\Laravel\Contracts\FromKafka;
use Obx\Laravel\Work\Events\MessageFailed;
use Obx\Laravel\Work\Events\MessageProcessed;
use Obx\Laravel\Work\Events\MessageProcessing;
use Throwable;

/**
 * What obx:work does for one message: take the consumer's next landed row
 * (obx.claim_landed: per key in landing order, skipping rows other
 * workers hold), run its listener, and commit the listener's effects with
 * the row's deletion (obx.complete_landed) in one transaction on the
 * connection.  A listener that throws is rolled back to a savepoint taken
 * after the claim, so the row stays locked while obx.fail_landed records
 * the failure: retried after a backoff, first of its key, or at the last
 * try moved to obx.dead_letters.  A process killed mid-listener loses its
 * transaction and its lock: the row is taken again, its effects never
 * half-committed.  Each start is counted first on a second connection
 * (obx.start_landed, autocommit), so such a death counts as an attempt: a
 * message that kills its worker every time is dead-lettered at the last
 * try without running its listener again.
 */
final class Worker
{
    public const DONE = 'done';
    public const SKIPPED = 'skipped';
    public const RETRY = 'retry';
    public const DEAD_LETTER = 'dead_letter';

    /**
     * @param array<string, array<string, ?string>> $listeners topic => event type (or "*") => class
     * @param int[] $backoff seconds before the 1st, 2nd, ... retry; the last repeats
     */
    /**
     * @param ConnectionInterface $starts another connection to the same
     *        database, outside the claim's transaction (obx.start_landed)
     */
    public function __construct(
        private Container $container,
        private ConnectionInterface $db,
        private ConnectionInterface $starts,
        private string $consumer,
        private array $listeners,
        private int $tries = 5,
        private array $backoff = [1, 5, 30],
    ) {
    }

    /**
     * Runs the next ready message, if any.  Returns null when none was
     * ready, else [LandedMessage, outcome, ?Throwable].
     */
    public function runNext(): ?array
    {
        $db = $this->db;
        $db->beginTransaction();
        try {
            $row = $db->selectOne(
                'select id, consumer_name, event_id, event_type, topic, kafka_partition, kafka_offset,
                        event_key, headers::text as headers, payload::text as payload,
                        kafka_timestamp::text as kafka_timestamp, attempts as failures
                   from obx.claim_landed(?) where id is not null', [$this->consumer]);
            if ($row === null) {
                $db->commit();
                return null;
            }
            $row->attempts = (int) $this->starts->selectOne('select obx.start_landed(?, ?) as n',
                [$this->consumer, $row->id])->n - 1;
            try {
                $message = LandedMessage::fromRow($row);
            } catch (Undecodable $e) {
                $message = LandedMessage::undecoded($row);
                $outcome = $this->fail($message, $e);
                $db->commit();
                return $this->failed($message, $outcome, $e);
            }
            $level = $db->transactionLevel();
            $db->beginTransaction();                 // a savepoint: the claim's lock outlives a failure
            try {
                if ($message->attempt > max(1, $this->tries)) {
                    throw new WorkerDied(sprintf('the obx:work process died while running this message '
                        . '(%d of %d starts ended neither in success nor in an exception)',
                        $message->attempt - 1 - (int) $row->failures, $message->attempt - 1));
                }
                $this->events()->dispatch(new MessageProcessing($this->consumer, $message));
                $outcome = $this->dispatch($message);
                while ($db->transactionLevel() > $level) {
                    $db->commit();
                }
                $db->selectOne('select obx.complete_landed(?, ?)', [$this->consumer, $message->id]);
                $db->commit();
                $this->events()->dispatch(new MessageProcessed($this->consumer, $message, $outcome));
                return [$message, $outcome, null];
            } catch (Throwable $e) {
                $db->rollBack($level);
                $outcome = $this->fail($message, $e);
                $db->commit();
                return $this->failed($message, $outcome, $e);
            }
        } catch (Throwable $e) {
            if ($db->transactionLevel() > 0) {
                $db->rollBack(0);
            }
            throw $e;
        }
    }

    /**
     * LISTEN for the consumer's landings (obx._land notifies the channel
     * obx_landed_<md5 of the consumer name> at commit), so that wait()
     * returns as soon as a message lands.
     */
    public function listen(): void
    {
        $this->db->statement('LISTEN obx_landed_' . md5($this->consumer));
    }

    /**
     * Waits up to $seconds, less if a landing is notified or $stop()
     * becomes true (checked every 100 ms).  Without a PDO to read
     * notifications from, it sleeps.
     */
    public function wait(float $seconds, callable $stop): void
    {
        $until = microtime(true) + max(0.0, $seconds);
        $pdo = method_exists($this->db, 'getPdo') ? $this->db->getPdo() : null;
        $pdo = $pdo instanceof \PDO && method_exists($pdo, 'pgsqlGetNotify') ? $pdo : null;
        while (!$stop() && ($left = $until - microtime(true)) > 0) {
            $ms = (int) ceil(min(0.1, $left) * 1000);
            if ($pdo === null) {
                usleep($ms * 1000);
            } elseif ($pdo->pgsqlGetNotify(\PDO::FETCH_ASSOC, $ms) !== false) {
                while ($pdo->pgsqlGetNotify(\PDO::FETCH_ASSOC, 0) !== false) {
                }
                return;
            }
        }
    }

    /** The listener class mapped to the message: by topic, then event type or "*". */
    public function listenerFor(LandedMessage $message): ?string
    {
        $types = $this->listeners[$message->topic] ?? null;
        if ($types === null) {
            throw new NoListener(sprintf('no obx:work listener for topic "%s" (config obx.work.listeners)',
                $message->topic));
        }
        if ($message->eventType !== null && array_key_exists($message->eventType, $types)) {
            return $types[$message->eventType];
        }
        if (array_key_exists('*', $types)) {
            return $types['*'];
        }
        throw new NoListener(sprintf('no obx:work listener for event type "%s" of topic "%s" (config obx.work.listeners)',
            $message->eventType ?? '(none)', $message->topic));
    }

    /**
     * Runs what the message maps to: an event class implementing FromKafka
     * is made from it and dispatched to its Laravel listeners (none is an
     * error: a typo must not pass for a success); any other
     * class is resolved from the container and gets the message
     * (handle($message), or __invoke).  A type mapped to null is skipped.
     */
    private function dispatch(LandedMessage $message): string
    {
        $class = $this->listenerFor($message);
        if ($class === null) {
            return self::SKIPPED;
        }
        if (is_subclass_of($class, FromKafka::class)) {
            $events = $this->container->make('events');
            if (!$events->hasListeners($class)) {
                throw new NoListener(sprintf('no Laravel listener for the event class %s that obx:work maps '
                    . 'topic "%s" to (config obx.work.listeners)', $class, $message->topic));
            }
            $events->dispatch($class::fromKafka($message));
            return self::DONE;
        }
        $listener = $this->container->make($class);
        method_exists($listener, 'handle') ? $listener->handle($message) : $listener($message);
        return self::DONE;
    }

    /**
     * A failure recorded and committed: reported to Laravel's exception
     * handler (as queue:work reports a job's), and MessageFailed
     * dispatched.  Returns runNext's result for it.
     */
    private function failed(LandedMessage $message, string $outcome, Throwable $e): array
    {
        if ($this->container->bound(ExceptionHandler::class)) {
            $this->container->make(ExceptionHandler::class)->report($e);
        }
        $this->events()->dispatch(new MessageFailed($this->consumer, $message, $outcome, $e));
        return [$message, $outcome, $e];
    }

    private function events(): Dispatcher
    {
        return $this->container->make('events');
    }

    /** obx.fail_landed: a retry after the backoff, or the dead letter at the last try. */
    private function fail(LandedMessage $message, Throwable $e): string
    {
        $tries = $e instanceof NoListener || $e instanceof WorkerDied || $e instanceof Undecodable ? 1
            : max(1, $this->tries);
        $wait = $this->backoff === [] ? 0
            : $this->backoff[min($message->attempt, count($this->backoff)) - 1];
        $error = sprintf('%s: %s (listener %s)', get_class($e), mb_strimwidth($e->getMessage(), 0, 2000, '...'),
            $e instanceof NoListener || $e instanceof Undecodable ? '-' : ($this->safeListenerName($message) ?? '-'));
        return $this->db->selectOne(
            'select obx.fail_landed(?, ?, ?, ?, ?::interval) as outcome',
            [$this->consumer, $message->id, $error, $tries, sprintf('%d seconds', $wait)])->outcome;
    }

    private function safeListenerName(LandedMessage $message): ?string
    {
        try {
            return $this->listenerFor($message);
        } catch (NoListener) {
            return null;
        }
    }
}
