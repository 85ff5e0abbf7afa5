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

];
