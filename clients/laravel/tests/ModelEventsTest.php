<?php

namespace Obx\Laravel\Tests;

use Illuminate\Database\Eloquent\Model;
use Illuminate\Support\Facades\DB;
use Obx\Laravel\Exceptions\DispatchedAfterCommit;
use Obx\Laravel\Exceptions\NotInTransaction;
use Obx\Laravel\Facades\Obx;
use Obx\Laravel\Tests\Fixtures\AfterCommitObserver;
use Obx\Laravel\Tests\Fixtures\DeferredOrder;
use Obx\Laravel\Tests\Fixtures\DeferredOrderCreated;
use Obx\Laravel\Tests\Fixtures\Order;
use Obx\Laravel\Tests\Fixtures\OrderCreated;
use Obx\Laravel\Tests\Fixtures\OrderPlaced;
use Obx\Laravel\Tests\Fixtures\PlainOrder;
use RuntimeException;

/**
 * Eloquent model events that publish to Kafka, against a real PostgreSQL
 * with obx: with WritesInTransaction the row and its events commit or roll
 * back together, even without a transaction of the caller's; events that
 * Laravel would dispatch after the commit are refused before the write
 * where that can be seen, at dispatch otherwise.
 */
class ModelEventsTest extends TestCase
{
    protected function databaseConfig(): array
    {
        return ['default' => 'app', 'connections' => ['app' => TestDatabase::connection()]];
    }

    protected function setUp(): void
    {
        parent::setUp();
        Obx::createExtension();
        DB::statement('CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, total_minor int NOT NULL)');
        DB::statement('TRUNCATE orders, obx.events, obx.claims, obx.records, obx.event_states');
        Model::clearBootedModels();     // each test boots its models on its own dispatcher
    }

    public function testWithoutTheTraitTheRowCommitsAndItsEventIsRefused(): void
    {
        try {
            PlainOrder::create(['id' => 'ord_1', 'total_minor' => 990]);
            $this->fail('a model event outside a transaction was not refused');
        } catch (NotInTransaction $e) {
        }
        $this->assertSame([['ord_1', 0]], $this->ordersAndEvents(), "Laravel's save() opens no transaction");
    }

    public function testTheTraitEnqueuesModelEventsWithTheRow(): void
    {
        $order = Order::create(['id' => 'ord_1', 'total_minor' => 990]);
        $this->assertSame(0, DB::transactionLevel());
        $this->assertEquals([(object) ['topic' => 'orders.created.v1', 'event_key' => 'ord_1',
                                       'payload' => '{"id": "ord_1", "total_minor": 990}',
                                       'event_type' => 'OrderCreated']],
            DB::select('select topic, event_key, payload::text, event_type from obx.outbox_events'));

        $order->update(['total_minor' => 1290]);
        $this->assertSame(1290, Order::find('ord_1')->total_minor);
        $this->app['events']->listen('eloquent.deleted: ' . Order::class,
            fn (Order $deleted) => event(new OrderPlaced($deleted->id, 0)));
        $order->delete();
        $this->assertFalse(Order::whereKey('ord_1')->exists());
        $this->assertSame(1, (int) DB::selectOne(
            "select count(*) as n from obx.outbox_events where topic = 'orders.placed.v1' and event_key = 'ord_1'")->n,
            'an event of "deleted" is enqueued with the delete');
        $this->assertSame(0, DB::transactionLevel());

        // a listener that fails after the enqueue takes the row back with the event
        $this->app['events']->listen(OrderCreated::class, fn () => throw new RuntimeException('declined'));
        try {
            Order::create(['id' => 'ord_2', 'total_minor' => 450]);
            $this->fail('the failing listener did not throw');
        } catch (RuntimeException $e) {
            $this->assertSame('declined', $e->getMessage());
        }
        $this->assertSame([], $this->ordersAndEvents('ord_2'));
    }

    public function testAnAfterCommitObserverIsRefusedAtDispatch(): void
    {
        foreach (['refuse', 'own_transaction'] as $mode) {
            $this->app = self::makeApp(['outside_transaction' => $mode], $this->databaseConfig());
            Model::clearBootedModels();
            Order::observe(AfterCommitObserver::class);
            try {
                Order::create(['id' => "ord_$mode", 'total_minor' => 990]);
                $this->fail("$mode: an event dispatched after the commit was not refused");
            } catch (DispatchedAfterCommit $e) {
                $this->assertStringContainsString('OrderPlaced was dispatched after a commit', $e->getMessage());
            }
            $this->assertSame(0, (int) DB::selectOne(
                "select count(*) as n from obx.outbox_events where topic = 'orders.placed.v1'")->n, $mode);
        }
    }

    public function testAModelThatDispatchesADeferredEventIsRefusedAtBoot(): void
    {
        try {
            new DeferredOrder();
            $this->fail('the model booted');
        } catch (DispatchedAfterCommit $e) {
            $this->assertStringContainsString(DeferredOrder::class . ' dispatches ' . DeferredOrderCreated::class
                . ' on "created"', $e->getMessage());
        }
        // booted now: still refused, before the row is written
        $this->expectException(DispatchedAfterCommit::class);
        try {
            DeferredOrder::create(['id' => 'ord_1', 'total_minor' => 990]);
        } finally {
            $this->assertSame([], $this->ordersAndEvents());
        }
    }

    public function testADeferredEventIsRefusedAtDispatch(): void
    {
        try {
            DB::transaction(fn () => event(new DeferredOrderCreated(new PlainOrder(['id' => 'ord_1']))));
            $this->fail('an event that asks to be dispatched after the commit was enqueued');
        } catch (DispatchedAfterCommit $e) {
            $this->assertStringContainsString('implements both ShouldPublishToKafka and ShouldDispatchAfterCommit',
                $e->getMessage());
        }
        $this->assertSame([], $this->ordersAndEvents());
    }

    /** [order id, its events in the outbox] for each order (or the one given), and events of no order. */
    private function ordersAndEvents(?string $id = null): array
    {
        return array_map(fn ($r) => [$r->id, (int) $r->n], DB::select(
            'select coalesce(o.id, e.event_key) as id, count(e.id) as n
               from orders o full join obx.outbox_events e on e.event_key = o.id
              where ?::text is null or coalesce(o.id, e.event_key) = ?
              group by 1 order by 1', [$id, $id]));
    }
}
