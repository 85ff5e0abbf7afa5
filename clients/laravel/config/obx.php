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

];
