<?php

namespace Obx\Laravel\Tests\Fixtures;

use Obx\Laravel\Contracts\FromKafka;
use Obx\Laravel\Work\LandedMessage;

/** An application event made from a landed message (WorkTest). */
class KafkaOrderPlaced implements FromKafka
{
    public function __construct(public string $eventId, public string $orderId, public int $n)
    {
    }

    public static function fromKafka(LandedMessage $message): static
    {
        return new static($message->eventId, $message->key, $message->payload['n']);
    }
}
