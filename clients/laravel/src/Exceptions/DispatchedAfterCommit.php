<?php

namespace Obx\Laravel\Exceptions;

/**
 * A ShouldPublishToKafka event that Laravel dispatches after a commit: the
 * event implements ShouldDispatchAfterCommit, a model maps it in
 * $dispatchesEvents, or it was dispatched by a listener or observer that
 * runs after the commit ($afterCommit, ShouldHandleEventsAfterCommit,
 * DB::afterCommit).  By then it cannot be enqueued with the writes it
 * reports; obx already publishes only what commits, so dispatch it inside
 * the transaction.  A NotInTransaction, so code that catches that one
 * catches this too.
 */
class DispatchedAfterCommit extends NotInTransaction
{
}
