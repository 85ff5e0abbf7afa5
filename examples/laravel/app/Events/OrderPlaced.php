<?php

namespace App\Events;

use App\Models\Order;
use Obx\Laravel\Contracts\ShouldPublishToKafka;

/**
 * The OrderPlaced integration event: the contract of topic orders.placed.v1,
 * built field by field from a saved order.  It publishes itself: dispatched
 * with event(...) inside the order's DB::transaction, obx/laravel's listener
 * enqueues it in that transaction.  It is never the serialized
 * Eloquent model ($order->toArray()): columns and relations may change, and
 * the row may hold data consumers have no business seeing.
 *
 * Fields (docs/laravel.md):
 *   eventId        uuid, also obx's event id (Kafka header event_id)
 *   eventType      "OrderPlaced"
 *   schemaVersion  1 or 2
 *   occurredAt     RFC 3339 UTC, the order's created_at
 *   orderId, customerId, totalMinor, currency
 *   lines          [{sku, qty}], what inventory reserves
 *   warehouse      version 2 only, optional: the warehouse the customer picked
 *
 * Kafka headers: event_id (= eventId), event_type, schema_version.
 */
final class OrderPlaced implements ShouldPublishToKafka
{
    public const TYPE = 'OrderPlaced';

    private function __construct(
        private string $topic,
        private string $key,
        private array $payload,
    ) {
    }

    public static function fromOrder(Order $order, string $eventId, string $topic, int $schemaVersion): self
    {
        if (!in_array($schemaVersion, [1, 2], true)) {
            throw new \InvalidArgumentException("OrderPlaced has no schemaVersion $schemaVersion");
        }

        $payload = [
            'eventId' => $eventId,
            'eventType' => self::TYPE,
            'schemaVersion' => $schemaVersion,
            'occurredAt' => $order->created_at->toIso8601ZuluString(),
            'orderId' => $order->id,
            'customerId' => $order->customer_id,
            'totalMinor' => $order->total_minor,
            'currency' => $order->currency,
            'lines' => $order->lines
                ->map(fn ($line) => ['sku' => $line->sku, 'qty' => $line->qty])
                ->values()
                ->all(),
        ];
        if ($schemaVersion >= 2 && $order->warehouse !== null) {
            $payload['warehouse'] = $order->warehouse;
        }

        return new self($topic, $order->id, $payload);
    }

    /** obx's event id, the Kafka header event_id: the inbox deduplicates on it. */
    public function eventId(): string
    {
        return $this->payload['eventId'];
    }

    public function type(): string
    {
        return self::TYPE;
    }

    public function schemaVersion(): int
    {
        return $this->payload['schemaVersion'];
    }

    public function headers(): array
    {
        return [];
    }

    public function topic(): string
    {
        return $this->topic;
    }

    /** The Kafka key: the order id, so one order's events stay in order. */
    public function key(): string
    {
        return $this->key;
    }

    public function payload(): array
    {
        return $this->payload;
    }
}
