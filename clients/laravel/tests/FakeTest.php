<?php

namespace Obx\Laravel\Tests;

use Obx\Laravel\Exceptions\InvalidEvent;
use Obx\Laravel\Facades\Obx;
use Obx\Laravel\Testing\ObxFake;
use Obx\Laravel\Tests\Fixtures\NotAnEvent;
use Obx\Laravel\Tests\Fixtures\OrderPlaced;
use PHPUnit\Framework\ExpectationFailedException;

/** Obx::fake(), as an application's tests use it: no database at all. */
class FakeTest extends TestCase
{
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
        $this->assertTrue(Obx::markProcessed('billing', 'ev-2'), 'a failed effect took its mark back');
        $this->assertFalse(Obx::markProcessed('billing', 'ev-2'));
    }

    public function testEventsThatPublishThemselvesReachTheFake(): void
    {
        Obx::fake();
        event(new NotAnEvent());
        Obx::assertNothingEnqueued();

        event(new OrderPlaced('ord_7', 1290, '0190f5c2-8a4e-7cc1-9b7e-2f0d5e6a1c33'));
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
        foreach ([['not json'], '{"orderId": "ord_1"}', [1, 2], 42, null, new \stdClass()] as $payload) {
            try {
                Obx::enqueue('orders.placed.v1', 'ord_1', $payload);
                $this->fail('payload accepted: ' . var_export($payload, true));
            } catch (InvalidEvent $e) {
                $this->assertInstanceOf(\InvalidArgumentException::class, $e);
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
