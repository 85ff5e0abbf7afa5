<?php

/*
 * The shop side: what it sells and the event it publishes.
 */

return [

    // The topic of OrderPlaced (docs/event-contract.md documents it).
    'orders_topic' => env('ORDERS_TOPIC', 'orders.placed.v1'),

    // OrderPlaced schemaVersion this shop emits: 1, or 2 (adds the optional
    // "warehouse" the customer picked).  Consumers handle both.
    'schema_version' => (int) env('ORDER_SCHEMA_VERSION', 2),

    'currency' => 'EUR',

    // sku => unit price in minor units (cents)
    'catalog' => [
        'MUG-RED' => 1290,
        'MUG-BLUE' => 1290,
        'TEE-S' => 1990,
        'TEE-M' => 1990,
        'TEE-L' => 2190,
        'CAP-01' => 1590,
    ],

    // Warehouses a customer may pick (schemaVersion 2 only).
    'warehouses' => ['main', 'east'],

];
