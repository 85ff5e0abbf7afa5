<?php

namespace App\Actions;

use App\Events\OrderPlaced;
use App\Models\Order;
use Illuminate\Support\Facades\DB;

/**
 * Saves an order and enqueues its OrderPlaced event in one database
 * transaction: the event exists if and only if the order does.  The event
 * is dispatched with event(...); obx/laravel's listener enqueues it with
 * obx.enqueue on the same connection, inside this transaction.  No Kafka
 * call happens here; obx's relay publishes the event after the commit.
 */
final class PlaceOrder
{
    public function __construct(
        private string $topic,
        private int $schemaVersion,
    ) {
    }

    /**
     * $data: id ("ord_..."), customer_id, currency, warehouse (nullable) and
     * lines [['sku' => ..., 'qty' => ..., 'unit_price_minor' => ...], ...].
     * $eventId: a uuid chosen with the order id, before the first attempt,
     * and reused if the caller retries the same order.
     * $beforeCommit: runs last inside the transaction (a payment check, say);
     * if it throws, the order and its event roll back together.
     */
    public function __invoke(array $data, string $eventId, ?callable $beforeCommit = null): Order
    {
        return DB::transaction(function () use ($data, $eventId, $beforeCommit) {
            $order = Order::create([
                'id' => $data['id'],
                'customer_id' => $data['customer_id'],
                'currency' => $data['currency'],
                'warehouse' => $data['warehouse'] ?? null,
                'total_minor' => array_sum(array_map(
                    fn ($l) => $l['qty'] * $l['unit_price_minor'], $data['lines'])),
            ]);
            $order->setRelation('lines', $order->lines()->createMany($data['lines']));

            // The event id goes to obx as well as into the payload: the Kafka
            // header event_id and the body's eventId agree, and the inbox
            // deduplicates on it.
            event(OrderPlaced::fromOrder($order, $eventId, $this->topic, $this->schemaVersion));

            if ($beforeCommit !== null) {
                $beforeCommit($order);
            }

            return $order;
        });
    }
}
