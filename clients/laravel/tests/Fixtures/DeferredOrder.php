<?php

namespace Obx\Laravel\Tests\Fixtures;

/** A model that maps "created" to an event Laravel 10.30+ would dispatch after the commit. */
class DeferredOrder extends PlainOrder
{
    protected $dispatchesEvents = ['created' => DeferredOrderCreated::class];
}
