<?php

namespace Obx\Laravel\Testing;

use Closure;
use Illuminate\Database\ConnectionInterface;
use Illuminate\Contracts\Events\Dispatcher;
use Illuminate\Database\ConnectionResolverInterface;
use Illuminate\Database\Events\TransactionBeginning;
use Illuminate\Support\Str;
use Illuminate\Support\Traits\ReflectsClosures;
use LogicException;
use Obx\Laravel\Contracts\ShouldPublishToKafka;
use Obx\Laravel\Exceptions\InvalidEvent;
use Obx\Laravel\Outbox;
use Obx\Laravel\Payload;
use PHPUnit\Framework\Assert as PHPUnit;

/**
 * What Obx::fake() puts behind the facade, for application tests: enqueue,
 * enqueueMany and publish (so event(...) too) record the event, with its
 * connection, instead of calling obx; markProcessed and processOnce keep
 * the marks in memory; createExtension, subscribe and unsubscribe do
 * nothing.  The operator calls (status, retry, ...) are not faked.
 *
 * It refuses what the real outbox refuses, before recording: topic names,
 * keys, event types and ids (checkNames), payloads and headers (Payload),
 * and publish or markProcessed outside a transaction
 * (NotInTransaction, DispatchedAfterCommit).  A transaction counts if the
 * application opened it on obx's connection after Obx::fake(): the one
 * RefreshDatabase, LazilyRefreshDatabase or DatabaseTransactions opens
 * around each test does not, even when it opens it later, so code that
 * forgets DB::transaction fails its tests as it would fail in production.
 * The fake sees no rollback: an event recorded in a transaction that then
 * rolls back stays recorded.
 */
class ObxFake extends Outbox
{
    use ReflectsClosures;

    /**
     * Shared by the fake and its connection() clones.  begun: per
     * connection, the levels of the transactions begun with an event since
     * the fake was made (those an application opens); without a
     * dispatcher (evented false), baseline: the levels open when it was.
     *
     * @var object{enqueued: array, processed: array, begun: array<string, int[]>, own: int,
     *             baseline: array<string, int>, evented: bool}
     */
    private object $state;

    /**
     * $db: the application's connections; $events: their event dispatcher.
     * A transaction counts if it was begun with an event after the fake
     * was made: RefreshDatabase and LazilyRefreshDatabase begin theirs with
     * the connection's dispatcher unset, whenever they begin it, and an
     * application cannot.  Without $events, the transactions open now are
     * the tests' and the others count.  $db null: no connection, so only
     * processOnce (and publish in "own_transaction" mode) is ever in a
     * transaction.
     */
    public function __construct(?ConnectionResolverInterface $db = null, ?string $connection = null,
                                string $outsideTransaction = self::REFUSE, ?Dispatcher $events = null)
    {
        parent::__construct($db, $connection, $outsideTransaction);
        $this->state = (object) ['enqueued' => [], 'processed' => [], 'begun' => [], 'own' => 0,
                                 'baseline' => [], 'evented' => $events !== null];
        if ($events !== null) {
            $state = $this->state;
            $events->listen(TransactionBeginning::class, function (TransactionBeginning $e) use ($state) {
                $state->begun[$e->connectionName][] = $e->connection->transactionLevel();
            });
        } elseif ($db !== null && method_exists($db, 'getConnections')) {
            foreach ($db->getConnections() as $name => $open) {
                $this->state->baseline[$name] = $open->transactionLevel();
            }
        }
    }

    public function enqueue(string $topic, string $key, $payload, ?string $type = null,
                            ?string $id = null, array $headers = [], ?string $aggregateId = null): string
    {
        return $this->record($topic, $key, $payload, $type, $id, $headers, null);
    }

    public function enqueueMany(string $topic, array $keys, array $payloads, ?string $type = null,
                                array $headers = []): array
    {
        if (count($keys) !== count($payloads)) {
            throw new InvalidEvent(sprintf(
                'obx enqueueMany needs as many keys as payloads (%d keys, %d payloads)',
                count($keys), count($payloads)));
        }
        $payloads = array_values($payloads);
        foreach ($payloads as $payload) {
            Payload::encode($payload);      // all or nothing, like the real one
        }
        $ids = [];
        foreach (array_values($keys) as $i => $key) {
            $ids[] = $this->enqueue($topic, $key, $payloads[$i], $type, null, $headers);
        }
        return $ids;
    }

    public function publish(ShouldPublishToKafka $event): string
    {
        $this->inTransactionFor($event);
        return $this->record($event->topic(), $event->key(), $event->payload(), $event->type(),
            $event->eventId(), self::eventHeaders($event), $event);
    }

    /** Records the mark: true the first time for $consumer and $eventId. */
    public function markProcessed(string $consumer, string $eventId): bool
    {
        if ($this->transactionLevel() === 0) {
            parent::markProcessed($consumer, $eventId);     // throws NotInTransaction
        }
        return $this->mark($consumer, $eventId);
    }

    /**
     * Calls $effect the first time for $consumer and $eventId, as inside a
     * transaction; an exception from it takes the mark back, as the real
     * transaction would.
     */
    public function processOnce(string $consumer, string $eventId, callable $effect): bool
    {
        if (!$this->mark($consumer, $eventId)) {
            return false;
        }
        $this->state->own++;
        try {
            $effect();
        } catch (\Throwable $e) {
            unset($this->state->processed[$consumer][$eventId]);
            throw $e;
        } finally {
            $this->state->own--;
        }
        return true;
    }

    public function assertProcessed(string $consumer, string $eventId): void
    {
        PHPUnit::assertTrue(isset($this->state->processed[$consumer][$eventId]),
            "obx consumer $consumer did not mark event $eventId processed");
    }

    public function createExtension(): void
    {
    }

    public function subscribe(string $consumer, array|string $topics, string $handler, array $options = []): void
    {
    }

    public function unsubscribe(string $consumer): bool
    {
        return true;
    }

    /**
     * The events recorded for $topic (every topic if null) for which
     * $callback($payload, $event) returns true; $event has topic, key,
     * payload, type, id, headers, connection and, for an event that
     * published itself, event (the object).
     */
    public function enqueued(?string $topic = null, ?callable $callback = null): array
    {
        return array_values(array_filter($this->state->enqueued, fn (array $e) =>
            ($topic === null || $e['topic'] === $topic)
            && ($callback === null || $callback($e['payload'], $e))));
    }

    /** At least one event was enqueued on $topic (that $callback accepts). */
    public function assertEnqueued(string $topic, ?callable $callback = null): void
    {
        PHPUnit::assertNotEmpty($this->enqueued($topic, $callback),
            "No matching obx event was enqueued on topic [$topic]." . $this->summary());
    }

    /** Exactly $times events were enqueued on $topic (that $callback accepts). */
    public function assertEnqueuedTimes(string $topic, int $times, ?callable $callback = null): void
    {
        $count = count($this->enqueued($topic, $callback));
        PHPUnit::assertSame($times, $count,
            "Expected $times matching obx events on topic [$topic], got $count." . $this->summary());
    }

    /** No event was enqueued on $topic (that $callback accepts). */
    public function assertNotEnqueued(string $topic, ?callable $callback = null): void
    {
        PHPUnit::assertEmpty($this->enqueued($topic, $callback),
            "An unexpected obx event was enqueued on topic [$topic]." . $this->summary());
    }

    /** No event was enqueued at all. */
    public function assertNothingEnqueued(): void
    {
        PHPUnit::assertEmpty($this->state->enqueued, 'obx events were enqueued.' . $this->summary());
    }

    /**
     * The ShouldPublishToKafka events of class $class (or a subclass)
     * published, for which $callback($event, $record) returns true.
     *
     * @return ShouldPublishToKafka[]
     */
    public function published(string $class, ?callable $callback = null): array
    {
        return array_values(array_map(fn (array $e) => $e['event'], array_filter($this->state->enqueued,
            fn (array $e) => $e['event'] instanceof $class
                && ($callback === null || $callback($e['event'], $e)))));
    }

    /**
     * At least one $event was published (that $callback accepts), as
     * Event::assertDispatched: $event is a class, or a closure whose first
     * parameter's type names it; an int $callback is assertPublishedTimes.
     */
    public function assertPublished(string|Closure $event, callable|int|null $callback = null): void
    {
        [$class, $callback] = $this->eventAndCallback($event, $callback);
        if (is_int($callback)) {
            $this->assertPublishedTimes($class, $callback);
            return;
        }
        PHPUnit::assertNotEmpty($this->published($class, $callback),
            "The expected [$class] obx event was not published." . $this->summary());
    }

    /** Exactly $times events of class $class were published. */
    public function assertPublishedTimes(string $class, int $times = 1): void
    {
        $count = count($this->published($class));
        PHPUnit::assertSame($times, $count,
            "The expected [$class] obx event was published $count times instead of $times times." . $this->summary());
    }

    /** No $event was published (that $callback accepts). */
    public function assertNotPublished(string|Closure $event, ?callable $callback = null): void
    {
        [$class, $callback] = $this->eventAndCallback($event, $callback);
        PHPUnit::assertEmpty($this->published($class, $callback),
            "The unexpected [$class] obx event was published." . $this->summary());
    }

    /** The fake runs no SQL: the calls it does not fake throw. */
    public function db(): ConnectionInterface
    {
        throw new LogicException('Obx::fake() runs no SQL: it fakes enqueue, enqueueMany, publish, '
            . 'markProcessed, processOnce, createExtension, subscribe and unsubscribe only');
    }

    /** Counts only the transactions opened after Obx::fake(), and processOnce's. */
    protected function transactionLevel(): int
    {
        if ($this->db === null) {
            return $this->state->own;
        }
        $connection = $this->db->connection($this->connection);
        $level = $connection->transactionLevel();
        if (!$this->state->evented) {
            return $level - ($this->state->baseline[$connection->getName()] ?? 0) + $this->state->own;
        }
        // The levels begun with an event that are still open: a commit or
        // a rollback (silent or not) has ended those above the level now.
        $begun = array_filter($this->state->begun[$connection->getName()] ?? [], fn ($l) => $l <= $level);
        $this->state->begun[$connection->getName()] = array_values($begun);
        return count($begun) + $this->state->own;
    }

    /**
     * What obx.enqueue checks in the database before the payload (docs/sql.md,
     * "Errors"), with its messages: the topic as Kafka names topics, the key,
     * the event type, and a given id as a uuid.  obx.topics, a server
     * setting, is not known here.
     */
    private static function checkNames(string $topic, string $key, ?string $type, ?string $id): void
    {
        if ($topic === '') {
            throw new InvalidEvent('obx topic name must not be empty');
        }
        if (strlen($topic) > 249) {
            throw new InvalidEvent('obx topic name is too long');
        }
        if ($topic === '.' || $topic === '..' || !preg_match('/^[a-zA-Z0-9._-]+$/', $topic)) {
            throw new InvalidEvent(sprintf('invalid obx topic name "%s"', $topic));
        }
        if ($key === '') {
            throw new InvalidEvent('obx event key must not be empty');
        }
        if (strlen($key) > 1024) {
            throw new InvalidEvent('obx event key is too long');
        }
        if ($type === '') {
            throw new InvalidEvent('obx event type must not be empty');
        }
        if ($id !== null && !Str::isUuid($id)) {
            throw new InvalidEvent(sprintf('invalid input syntax for type uuid: "%s"', $id));
        }
    }

    /** The connection's name, whatever its driver: the fake runs no SQL. */
    protected function connectionName(): string
    {
        return $this->db?->connection($this->connection)->getName() ?? ($this->connection ?? 'default');
    }

    private function record(string $topic, string $key, $payload, ?string $type, ?string $id, array $headers,
                            ?ShouldPublishToKafka $event): string
    {
        self::checkNames($topic, $key, $type, $id);
        $json = Payload::encode($payload);
        Payload::headers($headers);
        $id ??= (string) Str::orderedUuid();
        $this->state->enqueued[] = [
            'topic' => $topic,
            'key' => $key,
            'payload' => json_decode($json, true, 512, JSON_THROW_ON_ERROR),
            'type' => $type,
            'id' => $id,
            'headers' => $headers,
            'connection' => $this->connectionName(),
            'event' => $event,
        ];
        return $id;
    }

    private function mark(string $consumer, string $eventId): bool
    {
        if (isset($this->state->processed[$consumer][$eventId])) {
            return false;
        }
        $this->state->processed[$consumer][$eventId] = true;
        return true;
    }

    private function eventAndCallback(string|Closure $event, $callback): array
    {
        return $event instanceof Closure ? [$this->firstClosureParameterType($event), $event] : [$event, $callback];
    }

    private function summary(): string
    {
        if ($this->state->enqueued === []) {
            return ' Nothing was enqueued.';
        }
        return ' Enqueued: ' . implode(', ', array_map(
            fn (array $e) => "{$e['topic']}/{$e['key']}", $this->state->enqueued)) . '.';
    }
}
