<?php

namespace Obx\Laravel\Listeners;

use Illuminate\Contracts\Container\Container;
use Obx\Laravel\Contracts\ShouldPublishToKafka;

/**
 * Enqueues every dispatched ShouldPublishToKafka event, synchronously, in
 * the dispatcher's transaction (never queued: a queued listener would run
 * after the commit, outside it).
 */
class PublishToKafka
{
    public function __construct(private Container $app)
    {
    }

    public function handle(ShouldPublishToKafka $event): void
    {
        $this->app->make('obx')->publish($event);
    }
}
