<?php

namespace Obx\Laravel\Tests\Fixtures;

use Illuminate\Database\Eloquent\Model;
use Obx\Laravel\Contracts\PublishesToKafka;
use Obx\Laravel\Contracts\ShouldPublishToKafka;

/** A model event that publishes itself, built from the model's fields. */
class OrderCreated implements ShouldPublishToKafka
{
    use PublishesToKafka;

    public function __construct(public Model $order)
    {
    }

    public function topic(): string
    {
        return 'orders.created.v1';
    }

    public function key(): string
    {
        return $this->order->id;
    }

    public function payload(): array
    {
        return $this->order->only(['id', 'total_minor']);
    }
}
