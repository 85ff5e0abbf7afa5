<?php

namespace Obx\Laravel\Tests\Fixtures;

/** An observer that runs after the commit and publishes from there. */
class AfterCommitObserver
{
    public $afterCommit = true;

    public function created($order): void
    {
        event(new OrderPlaced($order->id, $order->total_minor));
    }
}
