<?php

namespace Obx\Laravel\Work\Events;

use Obx\Laravel\Work\LandedMessage;
use Throwable;

/**
 * A message failed and its failure is recorded (as queue:work's
 * JobExceptionOccurred, or JobFailed when it is dead-lettered).
 * $outcome: Worker::RETRY (tried again after the backoff) or
 * Worker::DEAD_LETTER (moved to obx.dead_letters).
 */
final class MessageFailed
{
    public function __construct(
        public readonly string $consumer,
        public readonly LandedMessage $message,
        public readonly string $outcome,
        public readonly Throwable $exception,
    ) {
    }
}
