<?php

namespace Obx\Laravel\Work;

use RuntimeException;

/**
 * A landed message whose worker process died while running it as many
 * times as it may be tried (obx.start_landed counted the starts): it is
 * dead-lettered without running its listener again.
 */
final class WorkerDied extends RuntimeException
{
}
