<?php

namespace Obx\Laravel\Work\Events;

use Obx\Laravel\Work\LandedMessage;

/**
 * A message's listener ran (or the message was skipped, mapped to null)
 * and its transaction committed: the message is done (as queue:work's
 * JobProcessed).  $outcome: Worker::DONE or Worker::SKIPPED.
 */
final class MessageProcessed
{
    public function __construct(
        public readonly string $consumer,
        public readonly LandedMessage $message,
        public readonly string $outcome,
    ) {
    }
}
