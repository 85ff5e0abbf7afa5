<?php

namespace Obx\Laravel\Eloquent;

/**
 * For an Eloquent model whose events publish to Kafka: save() and delete()
 * run in a transaction on the model's connection (a savepoint inside the
 * caller's), so create(), update(), save() and delete() called with no
 * transaction of their own still fire saving, creating, created, updated,
 * saved, deleting and deleted inside one.  The ShouldPublishToKafka events
 * that these model events dispatch ($dispatchesEvents, observers,
 * listeners) are then enqueued atomically with the row, and an exception
 * from one rolls the row back.  Laravel's save() itself opens none.
 *
 * The model's connection must be obx's (config obx.connection): on another
 * one the listener finds no transaction and throws NotInTransaction.
 */
trait WritesInTransaction
{
    public function save(array $options = [])
    {
        return $this->getConnection()->transaction(fn () => parent::save($options));
    }

    public function delete()
    {
        return $this->getConnection()->transaction(fn () => parent::delete());
    }
}
