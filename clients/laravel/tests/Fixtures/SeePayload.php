<?php

namespace Obx\Laravel\Tests\Fixtures;

use Illuminate\Container\Container;
use Obx\Laravel\Work\LandedMessage;

/** A listener that keeps each payload it gets in the container's "seen". */
class SeePayload
{
    public function handle(LandedMessage $message): void
    {
        Container::getInstance()->make('seen')[$message->eventId] = $message->payload;
    }
}
