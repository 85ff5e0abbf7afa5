<?php

namespace Obx\Laravel\Work;

use RuntimeException;

/**
 * A landed message whose payload or headers PHP cannot decode (valid JSON
 * nested deeper than PHP's parser goes): dead-lettered at once, since a
 * retry cannot help, so that it never stops the worker; its key goes on.
 */
final class Undecodable extends RuntimeException
{
}
