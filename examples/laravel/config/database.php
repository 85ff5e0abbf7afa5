<?php

/*
 * Two databases in one PostgreSQL cluster, each with obx installed:
 *
 *   shop       orders, order_lines and obx's outbox; the relay workers
 *              (obx.database = 'shop') publish it to Kafka.
 *   inventory  stock and reservations; the consumer workers
 *              (obx.consumer_database = 'inventory') read orders.placed.v1
 *              and call inventory.reserve_stock once per event id.
 *
 * DB_HOST may be a host name or a Unix socket directory.
 */

return [

    'default' => 'shop',

    'connections' => [

        'shop' => [
            'driver' => 'pgsql',
            'host' => env('DB_HOST', '/var/run/postgresql'),
            'port' => env('DB_PORT', '5432'),
            'database' => env('SHOP_DATABASE', 'shop'),
            'username' => env('DB_USERNAME', 'postgres'),
            'password' => env('DB_PASSWORD', ''),
            'charset' => 'utf8',
            'prefix' => '',
            'schema' => 'public',
        ],

        'inventory' => [
            'driver' => 'pgsql',
            'host' => env('DB_HOST', '/var/run/postgresql'),
            'port' => env('DB_PORT', '5432'),
            'database' => env('INVENTORY_DATABASE', 'inventory'),
            'username' => env('DB_USERNAME', 'postgres'),
            'password' => env('DB_PASSWORD', ''),
            'charset' => 'utf8',
            'prefix' => '',
            'schema' => 'public',
        ],

    ],

    'migrations' => 'migrations',

];
