<?php

namespace Obx\Laravel\Exceptions;

use LogicException;

/**
 * A ShouldPublishToKafka event was dispatched outside a database
 * transaction while config obx.outside_transaction is "refuse" (the
 * default).  Dispatch it inside DB::transaction, next to the writes it
 * reports, or call Obx::enqueue yourself.
 */
class NotInTransaction extends LogicException
{
}
