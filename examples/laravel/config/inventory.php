<?php

/*
 * The inventory side: its obx subscription and the stock it starts with.
 */

return [

    // The consumer name names the effect; it is also the Kafka consumer
    // group and the key of obx.processed_events.
    'consumer' => env('INVENTORY_CONSUMER', 'inventory-reservation'),

    'topics' => [env('ORDERS_TOPIC', 'orders.placed.v1')],

    // Stock moves, consumed in PHP by obx:work (config obx.work).
    'moves_topic' => env('MOVES_TOPIC', 'stock.moves.v1'),

    // Extra librdkafka consumer properties of the subscription, as
    // "key=value;key=value" (e.g. "session.timeout.ms=6000").
    'kafka' => collect(explode(';', (string) env('INVENTORY_KAFKA_PROPERTIES', '')))
        ->filter()
        ->mapWithKeys(function ($pair) {
            [$key, $value] = array_pad(explode('=', $pair, 2), 2, '');
            return [trim($key) => trim($value)];
        })
        ->all(),

    // Units of every catalog sku put on hand in every warehouse by db:seed.
    'initial_on_hand' => (int) env('INVENTORY_ON_HAND', 10000),

];
