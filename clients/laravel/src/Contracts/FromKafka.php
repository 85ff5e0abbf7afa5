<?php

namespace Obx\Laravel\Contracts;

use Obx\Laravel\Work\LandedMessage;

/**
 * An application event that obx:work can make from a landed Kafka message:
 * map its class in config obx.work.listeners and obx:work dispatches it
 * with Laravel's event dispatcher, so its listeners (Event::listen, or
 * discovered) run in the transaction that completes the message.
 */
interface FromKafka
{
    public static function fromKafka(LandedMessage $message): static;
}
