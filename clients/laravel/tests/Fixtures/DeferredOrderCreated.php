<?php

namespace Obx\Laravel\Tests\Fixtures;

use Illuminate\Contracts\Events\ShouldDispatchAfterCommit;

/** OrderCreated, marked to be dispatched after the commit: a contradiction obx refuses. */
class DeferredOrderCreated extends OrderCreated implements ShouldDispatchAfterCommit
{
}
