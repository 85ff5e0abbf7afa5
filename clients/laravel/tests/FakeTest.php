<?php

namespace Obx\Laravel\Tests;

use Illuminate\Support\Facades\DB;
use Obx\Laravel\Exceptions\DispatchedAfterCommit;
use Obx\Laravel\Exceptions\InvalidEvent;
use Obx\Laravel\Exceptions\NotInTransaction;
use Obx\Laravel\Facades\Obx;
use Obx\Laravel\Testing\ObxFake;
use Obx\Laravel\Tests\Fixtures\DeferredOrderCreated;
use Obx\Laravel\Tests\Fixtures\NotAnEvent;
use Obx\Laravel\Tests\Fixtures\OrderCreated;
use Obx\Laravel\Tests\Fixtures\OrderPlaced;
use Obx\Laravel\Tests\Fixtures\PlainOrder;
use PHPUnit\Framework\ExpectationFailedException;

/**
 * Obx::fake(), as an application's tests use it: a real connection (the
 * throwaway PostgreSQL, without obx) for the application's transactions,
 * and nothing enqueued in it.
 */
class FakeTest extends TestCase
{
    protected function databaseConfig(): array
    {
        $pg = TestDatabase::connection();
        return ['default' => 'app', 'connections' => ['app' => $pg, 'other' => $pg]];
    }

    public function testFakeRecordsWhatTheFacadeEnqueues(): void
    {
        $fake = Obx::fake();
        $this->assertInstanceOf(ObxFake::class, $fake);
        Obx::assertNothingEnqueued();

        $id = Obx::enqueue('orders.placed.v1', 'ord_1', ['orderId' => 'ord_1', 'totalMinor' => 990],
            type: 'OrderPlaced');
        $this->assertMatchesRegularExpression('/^[0-9a-f-]{36}$/', $id);

        Obx::assertEnqueued('orders.placed.v1');
        Obx::assertEnqueued('orders.placed.v1', fn (array $payload, array $event) =>
            $payload['orderId'] === 'ord_1' && $event['type'] === 'OrderPlaced' && $event['id'] === $id);
        Obx::assertEnqueuedTimes('orders.placed.v1', 1);
        Obx::assertNotEnqueued('orders.cancelled.v1');
        Obx::assertNotEnqueued('orders.placed.v1', fn (array $payload) => $payload['orderId'] === 'ord_2');
    }

    public function testAssertionsFailWhenTheyShould(): void
    {
        Obx::fake();
        $this->assertFails(fn () => Obx::assertEnqueued('orders.placed.v1'));

        Obx::enqueue('orders.placed.v1', 'ord_1', ['orderId' => 'ord_1']);
        $this->assertFails(fn () => Obx::assertNothingEnqueued());
        $this->assertFails(fn () => Obx::assertEnqueued('orders.placed.v1',
            fn (array $payload) => $payload['orderId'] === 'ord_9'));
        $this->assertFails(fn () => Obx::assertEnqueued('other.topic'));
        $this->assertFails(fn () => Obx::assertNotEnqueued('orders.placed.v1'));
        $this->assertFails(fn () => Obx::assertEnqueuedTimes('orders.placed.v1', 2));
    }

    public function testTheFakeMarksEventsProcessedOnce(): void
    {
        Obx::fake();
        $calls = 0;
        $this->assertTrue(Obx::processOnce('billing', 'ev-1', function () use (&$calls) { $calls++; }));
        $this->assertFalse(Obx::processOnce('billing', 'ev-1', function () use (&$calls) { $calls++; }));
        $this->assertSame(1, $calls);
        Obx::assertProcessed('billing', 'ev-1');
        $this->assertFails(fn () => Obx::assertProcessed('billing', 'ev-2'));

        try {
            Obx::processOnce('billing', 'ev-2', fn () => throw new \RuntimeException('declined'));
        } catch (\RuntimeException $e) {
        }
        $this->assertFails(fn () => Obx::assertProcessed('billing', 'ev-2'));
        DB::transaction(function () {
            $this->assertTrue(Obx::markProcessed('billing', 'ev-2'), 'a failed effect took its mark back');
            $this->assertFalse(Obx::markProcessed('billing', 'ev-2'));
        });
    }

    public function testEventsThatPublishThemselvesReachTheFake(): void
    {
        Obx::fake();
        event(new NotAnEvent());
        Obx::assertNothingEnqueued();

        DB::transaction(fn () => event(new OrderPlaced('ord_7', 1290, '0190f5c2-8a4e-7cc1-9b7e-2f0d5e6a1c33')));
        Obx::assertEnqueued('orders.placed.v1', fn (array $payload, array $event) =>
            $payload === ['orderId' => 'ord_7', 'totalMinor' => 1290]
            && $event['key'] === 'ord_7'
            && $event['type'] === 'OrderPlaced'
            && $event['id'] === '0190f5c2-8a4e-7cc1-9b7e-2f0d5e6a1c33'
            && $event['headers'] === ['schema_version' => '2']);
    }

    public function testTheFakeRefusesWhatObxWouldRefuse(): void
    {
        Obx::fake();
        foreach ([['not json'], '{"orderId": "ord_1"}', [1, 2], 42, null, new \stdClass(),
                  new PlainOrder(['id' => 'ord_1']), ['note' => "a\0b"]] as $payload) {
            try {
                Obx::enqueue('orders.placed.v1', 'ord_1', $payload);
                $this->fail('payload accepted: ' . var_export($payload, true));
            } catch (InvalidEvent $e) {
                $this->assertInstanceOf(\InvalidArgumentException::class, $e);
            }
        }
        foreach ([['', 'ord_1', null, null, 'obx topic name must not be empty'],
                  [str_repeat('t', 250), 'ord_1', null, null, 'obx topic name is too long'],
                  ['orders placed', 'ord_1', null, null, 'invalid obx topic name "orders placed"'],
                  ['..', 'ord_1', null, null, 'invalid obx topic name ".."'],
                  ['orders.placed.v1', '', null, null, 'obx event key must not be empty'],
                  ['orders.placed.v1', str_repeat('k', 1025), null, null, 'obx event key is too long'],
                  ['orders.placed.v1', 'ord_1', '', null, 'obx event type must not be empty'],
                  ['orders.placed.v1', 'ord_1', null, 'evt_01JQ8X8F', 'invalid input syntax for type uuid']]
                 as [$topic, $key, $type, $id, $message]) {
            try {
                Obx::enqueue($topic, $key, ['a' => 1], $type, $id);
                $this->fail("accepted: $message");
            } catch (InvalidEvent $e) {
                $this->assertStringContainsString($message, $e->getMessage());
            }
        }
        $this->expectException(InvalidEvent::class);
        $this->expectExceptionMessage('header "attempt" must be a string');
        try {
            Obx::enqueue('orders.placed.v1', 'ord_1', ['a' => 1], headers: ['attempt' => 3]);
        } finally {
            Obx::assertNothingEnqueued();
        }
    }

    public function testTheFakesEnqueueManyIsAllOrNothing(): void
    {
        Obx::fake();
        $ids = Obx::enqueueMany('orders.placed.v1', ['a', 'b'], [['n' => 1], ['n' => 2]]);
        $this->assertCount(2, array_unique($ids));
        Obx::assertEnqueuedTimes('orders.placed.v1', 2);
        try {
            Obx::enqueueMany('orders.placed.v1', ['c', 'd'], [['n' => 3], 'four']);
            $this->fail('a bad payload was accepted');
        } catch (InvalidEvent $e) {
        }
        Obx::assertEnqueuedTimes('orders.placed.v1', 2);
    }

    public function testTheFakeRefusesWhatTheRealOutboxRefusesOutsideATransaction(): void
    {
        DB::beginTransaction();             // as RefreshDatabase does before the test runs
        try {
            Obx::fake();
            $refused = [
                'event outside a transaction' => fn () => event(new OrderPlaced('ord_1', 990)),
                'markProcessed outside a transaction' => fn () => Obx::markProcessed('billing', 'ev-1'),
                'a transaction on another connection' => fn () =>
                    DB::connection('other')->transaction(fn () => event(new OrderPlaced('ord_2', 990))),
            ];
            foreach ($refused as $what => $call) {
                try {
                    $call();
                    $this->fail("$what: not refused");
                } catch (NotInTransaction $e) {
                    $this->assertNotInstanceOf(DispatchedAfterCommit::class, $e, $what);
                }
            }
            try {
                DB::transaction(fn () => event(new DeferredOrderCreated(new PlainOrder(['id' => 'ord_3']))));
                $this->fail('an event dispatched after the commit was not refused');
            } catch (DispatchedAfterCommit $e) {
            }
            Obx::assertNothingEnqueued();
            $this->assertTrue(Obx::processOnce('billing', 'ev-2', fn () => Obx::markProcessed('billing', 'ev-1')),
                'processOnce runs its effect in a transaction');

            DB::transaction(fn () => event(new OrderPlaced('ord_4', 990)));
            Obx::processOnce('billing', 'ev-3', fn () => event(new OrderPlaced('ord_5', 990)));
            Obx::assertPublishedTimes(OrderPlaced::class, 2);
            Obx::assertProcessed('billing', 'ev-1');
        } finally {
            DB::rollBack();
        }

        $this->app = self::makeApp(['outside_transaction' => 'own_transaction'], $this->databaseConfig());
        Obx::fake();
        event(new OrderPlaced('ord_6', 990));
        Obx::assertPublished(OrderPlaced::class);
    }

    /**
     * LazilyRefreshDatabase opens the test's transaction on the first
     * query, after Obx::fake(), with the connection's dispatcher unset (as
     * RefreshDatabase and DatabaseTransactions do): it does not count, so
     * an event outside DB::transaction is still refused.
     */
    public function testATransactionOpenedSilentlyAfterTheFakeDoesNotCount(): void
    {
        Obx::fake();
        $connection = DB::connection();
        $dispatcher = $connection->getEventDispatcher();
        $connection->unsetEventDispatcher();
        $connection->beginTransaction();
        $connection->setEventDispatcher($dispatcher);
        try {
            try {
                event(new OrderPlaced('ord_1', 990));
                $this->fail('an event outside DB::transaction was accepted');
            } catch (NotInTransaction $e) {
            }
            DB::transaction(fn () => DB::transaction(fn () => event(new OrderPlaced('ord_2', 990))));
            Obx::assertPublishedTimes(OrderPlaced::class, 1);
            try {
                event(new OrderPlaced('ord_3', 990));
                $this->fail('an event after the transactions committed was accepted');
            } catch (NotInTransaction $e) {
            }
        } finally {
            $connection->unsetEventDispatcher();
            $connection->rollBack();
            $connection->setEventDispatcher($dispatcher);
        }
    }

    public function testTheFakeRecordsTheConnection(): void
    {
        Obx::fake();
        Obx::enqueue('orders.placed.v1', 'ord_1', ['n' => 1]);
        Obx::connection('other')->enqueue('orders.placed.v1', 'ord_2', ['n' => 2]);
        DB::connection('other')->transaction(fn () => Obx::connection('other')->publish(new OrderPlaced('ord_3', 3)));

        $this->assertSame([['ord_1', 'app'], ['ord_2', 'other'], ['ord_3', 'other']],
            array_map(fn (array $e) => [$e['key'], $e['connection']], Obx::enqueued()));
        Obx::assertEnqueued('orders.placed.v1', fn (array $payload, array $event) => $event['connection'] === 'other');
        Obx::assertPublished(OrderPlaced::class, fn (OrderPlaced $e, array $event) => $event['connection'] === 'other');
    }

    public function testClassBasedAssertions(): void
    {
        Obx::fake();
        DB::transaction(function () {
            event(new OrderPlaced('ord_1', 990));
            event(new OrderPlaced('ord_2', 1290));
        });
        Obx::enqueue('orders.placed.v1', 'ord_3', ['orderId' => 'ord_3']);     // not an OrderPlaced object

        Obx::assertPublished(OrderPlaced::class);
        Obx::assertPublished(OrderPlaced::class, fn (OrderPlaced $e) => $e->orderId === 'ord_1' && $e->totalMinor === 990);
        Obx::assertPublished(fn (OrderPlaced $e) => $e->orderId === 'ord_2');
        Obx::assertPublished(OrderPlaced::class, 2);
        Obx::assertPublishedTimes(OrderPlaced::class, 2);
        Obx::assertNotPublished(OrderCreated::class);
        Obx::assertNotPublished(OrderPlaced::class, fn (OrderPlaced $e) => $e->orderId === 'ord_3');
        Obx::assertNotPublished(fn (OrderPlaced $e) => $e->totalMinor > 5000);
        Obx::assertEnqueuedTimes('orders.placed.v1', 3);

        $this->assertFails(fn () => Obx::assertPublished(OrderCreated::class));
        $this->assertFails(fn () => Obx::assertPublished(OrderPlaced::class, fn (OrderPlaced $e) => $e->orderId === 'ord_3'));
        $this->assertFails(fn () => Obx::assertPublished(fn (OrderPlaced $e) => $e->orderId === 'ord_9'));
        $this->assertFails(fn () => Obx::assertPublished(OrderPlaced::class, 3));
        $this->assertFails(fn () => Obx::assertPublishedTimes(OrderPlaced::class, 1));
        $this->assertFails(fn () => Obx::assertPublishedTimes(OrderPlaced::class, 3));
        $this->assertFails(fn () => Obx::assertNotPublished(OrderPlaced::class));
        $this->assertFails(fn () => Obx::assertNotPublished(fn (OrderPlaced $e) => $e->orderId === 'ord_1'));
    }

    public function testTheFakeRunsNoSql(): void
    {
        Obx::fake();
        $this->expectException(\LogicException::class);
        $this->expectExceptionMessage('Obx::fake() runs no SQL');
        Obx::status();
    }

    private function assertFails(callable $assertion): void
    {
        try {
            $assertion();
        } catch (ExpectationFailedException $e) {
            $this->addToAssertionCount(1);
            return;
        }
        $this->fail('the assertion passed, it should have failed');
    }
}
