<?php

namespace Obx\Laravel\Work;

use RuntimeException;

/**
 * A landed message whose topic and event type config obx.work.listeners
 * does not map: dead-lettered at once (a retry cannot help); replay it
 * after mapping it (to null, to skip such messages).
 */
final class NoListener extends RuntimeException
{
}
