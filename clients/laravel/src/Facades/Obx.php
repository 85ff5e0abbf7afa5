<?php

namespace Obx\Laravel\Facades;

use Illuminate\Support\Facades\Facade;
use Obx\Laravel\Testing\ObxFake;

/**
 * obx's transactional outbox, from anywhere in a Laravel application.
 *
 * @method static string enqueue(string $topic, string $key, array|\JsonSerializable $payload, ?string $type = null, ?string $id = null, array $headers = [], ?string $aggregateId = null)
 * @method static string[] enqueueMany(string $topic, array $keys, array $payloads, ?string $type = null, array $headers = [])
 * @method static string publish(\Obx\Laravel\Contracts\ShouldPublishToKafka $event)
 * @method static \Obx\Laravel\Outbox connection(?string $name)
 * @method static void createExtension()
 * @method static void install(string $sqlFile)
 * @method static void subscribe(string $consumer, array|string $topics, string $handler, array $options = [])
 * @method static bool unsubscribe(string $consumer)
 * @method static bool markProcessed(string $consumer, string $eventId)
 * @method static bool processOnce(string $consumer, string $eventId, callable $effect)
 * @method static array status()
 * @method static array consumers()
 * @method static array quarantine(?string $topic = null)
 * @method static bool retry(string $id)
 * @method static int retryQuarantined(?string $topic = null)
 * @method static bool skip(string $id, string $reason)
 * @method static int replay(array $ids)
 * @method static int replayTopic(string $topic, string $since, ?string $until = null)
 * @method static void assertEnqueued(string $topic, ?callable $callback = null)
 * @method static void assertEnqueuedTimes(string $topic, int $times, ?callable $callback = null)
 * @method static void assertNotEnqueued(string $topic, ?callable $callback = null)
 * @method static void assertNothingEnqueued()
 * @method static void assertProcessed(string $consumer, string $eventId)
 * @method static void assertPublished(string|\Closure $event, callable|int|null $callback = null)
 * @method static void assertPublishedTimes(string $event, int $times = 1)
 * @method static void assertNotPublished(string|\Closure $event, ?callable $callback = null)
 *
 * @see \Obx\Laravel\Outbox
 * @see \Obx\Laravel\Testing\ObxFake
 */
class Obx extends Facade
{
    /**
     * Replaces the outbox with a fake that records events; returns it.  Call
     * it after RefreshDatabase has begun its transaction (in the test, or in
     * setUp after parent::setUp()): the fake counts the transactions opened
     * after it.
     */
    public static function fake(): ObxFake
    {
        $app = static::getFacadeApplication();
        $config = $app['config'];
        static::swap($fake = new ObxFake(
            $app->bound('db') ? $app['db'] : null,
            $config->get('obx.connection'),
            $config->get('obx.outside_transaction', ObxFake::REFUSE),
            $app->bound('events') ? $app['events'] : null,
        ));
        return $fake;
    }

    protected static function getFacadeAccessor(): string
    {
        return 'obx';
    }
}
