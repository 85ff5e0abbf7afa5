<?php

namespace Obx\Laravel\Exceptions;

use InvalidArgumentException;

/**
 * An event obx would refuse, caught before any SQL runs: a payload that is
 * not an array or JsonSerializable (or does not encode to a JSON object),
 * or headers that are not a map of strings.
 */
class InvalidEvent extends InvalidArgumentException
{
}
