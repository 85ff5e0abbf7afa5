<?php

return [

    // The database connection obx's functions are called on (the one that
    // holds the extension and your tables); null: the default connection.
    'connection' => env('OBX_CONNECTION'),

    // A ShouldPublishToKafka event dispatched outside a database
    // transaction: "refuse" throws Obx\Laravel\Exceptions\NotInTransaction
    // (it would not be atomic with the writes it reports); "own_transaction"
    // enqueues it alone, in a transaction of its own.
    'outside_transaction' => env('OBX_OUTSIDE_TRANSACTION', 'refuse'),

    // php artisan obx:work: PHP listeners for the Kafka messages obx's
    // consumer lands for a subscription whose handler is obx.land
    // (docs/laravel.md, "Consuming in PHP: obx:work").
    'work' => [
        // The consumer name (obx.subscribe's); obx:work <consumer> overrides it.
        'consumer' => env('OBX_WORK_CONSUMER'),
        // topic => [event type => listener class, '*' => for any other type].
        // A listener has handle(Obx\Laravel\Work\LandedMessage $message) and
        // writes through the obx connection; an event class implementing
        // Obx\Laravel\Contracts\FromKafka is dispatched to its listeners.
        // null skips such messages; a message nothing maps is dead-lettered.
        'listeners' => [
            // 'orders.placed.v1' => ['OrderPlaced' => App\Listeners\ReserveStock::class],
        ],
        // Attempts per message before it becomes a dead letter, and the
        // seconds before each retry (the last repeats).
        'tries' => 5,
        'backoff' => [1, 5, 30],
    ],

];
