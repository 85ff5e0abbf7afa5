<?php

namespace App\Exceptions;

/**
 * Thrown inside the order transaction after the event is enqueued: the
 * transaction rolls back, and the order and its event are gone together.
 */
class PaymentDeclined extends \RuntimeException
{
}
