<?php

namespace Obx\Laravel\Testing;

use Illuminate\Support\Str;
use Obx\Laravel\Contracts\ShouldPublishToKafka;
use Obx\Laravel\Exceptions\InvalidEvent;
use Obx\Laravel\Outbox;
use Obx\Laravel\Payload;
use PHPUnit\Framework\Assert as PHPUnit;

/**
 * What Obx::fake() puts behind the facade, for application tests: enqueue,
 * enqueueMany and publish (so event(...) too) record the event instead of
 * calling obx, after the same payload and header checks; markProcessed and
 * processOnce keep the marks in memory; createExtension,
 * subscribe and unsubscribe do nothing.  The operator calls (status,
 * retry, ...) are not faked.  The fake sees no transactions: an event
 * recorded inside a transaction that rolls back stays recorded.
 */
class ObxFake extends Outbox
{
    /** @var array<int, array{topic: string, key: string, payload: array, type: ?string, id: string, headers: array}> */
    private array $enqueued = [];

    /** @var array<string, array<string, true>> consumer => event id => marked */
    private array $processed = [];

    public function __construct()
    {
        parent::__construct(null);
    }

    public function connection(?string $name): static
    {
        return $this;
    }

    public function enqueue(string $topic, string $key, $payload, ?string $type = null,
                            ?string $id = null, array $headers = [], ?string $aggregateId = null): string
    {
        $json = Payload::encode($payload);
        Payload::headers($headers);
        $id ??= (string) Str::orderedUuid();
        $this->enqueued[] = [
            'topic' => $topic,
            'key' => $key,
            'payload' => json_decode($json, true, 512, JSON_THROW_ON_ERROR),
            'type' => $type,
            'id' => $id,
            'headers' => $headers,
        ];
        return $id;
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
        $headers = $event->headers();
        if ($event->schemaVersion() !== null) {
            $headers['schema_version'] = (string) $event->schemaVersion();
        }
        return $this->enqueue($event->topic(), $event->key(), $event->payload(), $event->type(),
            $event->eventId(), $headers);
    }

    /** Records the mark: true the first time for $consumer and $eventId. */
    public function markProcessed(string $consumer, string $eventId): bool
    {
        if (isset($this->processed[$consumer][$eventId])) {
            return false;
        }
        $this->processed[$consumer][$eventId] = true;
        return true;
    }

    /**
     * Calls $effect the first time for $consumer and $eventId; an exception
     * from it takes the mark back, as the real transaction would.
     */
    public function processOnce(string $consumer, string $eventId, callable $effect): bool
    {
        if (!$this->markProcessed($consumer, $eventId)) {
            return false;
        }
        try {
            $effect();
        } catch (\Throwable $e) {
            unset($this->processed[$consumer][$eventId]);
            throw $e;
        }
        return true;
    }

    public function assertProcessed(string $consumer, string $eventId): void
    {
        PHPUnit::assertTrue(isset($this->processed[$consumer][$eventId]),
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
     * payload, type, id, headers.
     */
    public function enqueued(?string $topic = null, ?callable $callback = null): array
    {
        return array_values(array_filter($this->enqueued, fn (array $e) =>
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
        PHPUnit::assertEmpty($this->enqueued, 'obx events were enqueued.' . $this->summary());
    }

    private function summary(): string
    {
        if ($this->enqueued === []) {
            return ' Nothing was enqueued.';
        }
        return ' Enqueued: ' . implode(', ', array_map(
            fn (array $e) => "{$e['topic']}/{$e['key']}", $this->enqueued)) . '.';
    }
}
