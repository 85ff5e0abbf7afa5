<?php

namespace Obx\Laravel;

use Illuminate\Contracts\Events\Dispatcher;
use Illuminate\Database\DatabaseTransactionRecord;
use Illuminate\Database\Eloquent\Model;
use Obx\Laravel\Contracts\ShouldPublishToKafka;
use Obx\Laravel\Exceptions\DispatchedAfterCommit;

/**
 * The ways Laravel runs a ShouldPublishToKafka event after the commit of
 * the transaction that wrote what it reports, each refused with
 * DispatchedAfterCommit as early as it can be seen:
 * - an event class that implements ShouldDispatchAfterCommit (Laravel
 *   10.30+ defers its whole dispatch): at the boot of a model that maps it
 *   in $dispatchesEvents, else when it reaches the listener;
 * - a listener or observer that runs after the commit ($afterCommit,
 *   ShouldHandleEventsAfterCommit, DB::afterCommit) and dispatches one:
 *   when it reaches the listener, which finds Laravel's after-commit
 *   callbacks on the call stack.
 */
final class AfterCommit
{
    private const DEFERRED = 'Illuminate\Contracts\Events\ShouldDispatchAfterCommit';

    /** Throws if $event's class makes Laravel dispatch it after the commit. */
    public static function refuseDeferredEvent(ShouldPublishToKafka $event): void
    {
        if (is_a($event, self::DEFERRED)) {
            throw new DispatchedAfterCommit(self::deferredClassMessage(get_class($event)));
        }
    }

    /**
     * Throws if the caller runs inside an after-commit callback of Laravel's
     * transaction manager.  Only called outside a transaction, so the stack
     * walk costs nothing on the normal path.
     */
    public static function refuseInCallback(ShouldPublishToKafka $event): void
    {
        foreach (debug_backtrace(DEBUG_BACKTRACE_IGNORE_ARGS) as $frame) {
            if (($frame['class'] ?? null) === DatabaseTransactionRecord::class
                && $frame['function'] === 'executeCallbacks') {
                throw new DispatchedAfterCommit(sprintf(
                    'obx event %s was dispatched after a commit, by a listener or observer that runs after '
                    . 'commit ($afterCommit, ShouldHandleEventsAfterCommit or DB::afterCommit); the writes it '
                    . 'reports are committed without it. Dispatch it from a listener that runs inside the '
                    . 'transaction: obx publishes only what commits anyway', get_class($event)));
            }
        }
    }

    /**
     * At a model's boot (the eloquent.booted event): throws if its
     * $dispatchesEvents maps a model event to a ShouldPublishToKafka event
     * that Laravel dispatches after the commit, and makes every later save
     * or delete of that model throw the same before writing.
     */
    public static function checkModel(Model $model, Dispatcher $events): void
    {
        $dispatches = (fn () => $this->dispatchesEvents)->call($model);
        foreach ($dispatches as $modelEvent => $class) {
            if (is_subclass_of($class, ShouldPublishToKafka::class) && is_subclass_of($class, self::DEFERRED)) {
                $message = sprintf('model %s dispatches %s on "%s" ($dispatchesEvents): %s',
                    get_class($model), $class, $modelEvent, self::deferredClassMessage($class));
                $refuse = fn () => throw new DispatchedAfterCommit($message);
                $events->listen(['eloquent.saving: ' . get_class($model), 'eloquent.deleting: ' . get_class($model)],
                    $refuse);
                $refuse();
            }
        }
    }

    private static function deferredClassMessage(string $class): string
    {
        return sprintf('obx event %s implements both ShouldPublishToKafka and ShouldDispatchAfterCommit, so '
            . 'Laravel dispatches it after the commit, where it cannot be enqueued with the writes it reports; '
            . 'remove ShouldDispatchAfterCommit: obx already publishes only what commits', $class);
    }
}
