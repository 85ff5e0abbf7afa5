<?php

namespace Obx\Laravel\Work\Events;

use Obx\Laravel\Work\LandedMessage;

/**
 * obx:work is about to run a message's listener, inside the transaction
 * that will complete the message (as queue:work's JobProcessing).
 */
final class MessageProcessing
{
    public function __construct(public readonly string $consumer, public readonly LandedMessage $message)
    {
    }
}
