<?php

/*
 * obx/laravel (clients/laravel/config/obx.php documents the keys).
 */

return [

    // The shop enqueues; the inventory migrations and `status` pick the
    // inventory connection with Obx::connection('inventory').
    'connection' => env('OBX_CONNECTION', 'shop'),

    // OrderPlaced is always dispatched inside the order's DB::transaction;
    // outside one it would be a bug, so it is refused.
    'outside_transaction' => 'refuse',

    // php artisan-like obx:work --connection=inventory: stock moves in PHP
    // (database/migrations/inventory/..._subscribe_stock_moves_php.php).
    'work' => [
        'consumer' => env('MOVES_CONSUMER', 'inventory-moves'),
        'listeners' => [
            env('MOVES_TOPIC', 'stock.moves.v1') => ['StockMoved' => App\Listeners\ApplyStockMove::class],
        ],
        'tries' => 3,
        'backoff' => [1, 5, 30],
    ],

];
