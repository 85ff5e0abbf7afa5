<?php

namespace Obx\Laravel\Tests\Fixtures;

use Obx\Laravel\Contracts\PublishesToKafka;
use Obx\Laravel\Contracts\ShouldPublishToKafka;

/** An application event that publishes itself. */
class OrderPlaced implements ShouldPublishToKafka
{
    use PublishesToKafka;

    public function __construct(public string $orderId, public int $totalMinor, public ?string $id = null)
    {
    }

    public function topic(): string
    {
        return 'orders.placed.v1';
    }

    public function key(): string
    {
        return $this->orderId;
    }

    public function payload(): array
    {
        return ['orderId' => $this->orderId, 'totalMinor' => $this->totalMinor];
    }

    public function eventId(): ?string
    {
        return $this->id;
    }

    public function schemaVersion(): ?int
    {
        return 2;
    }
}
