<?php

use Illuminate\Database\Migrations\Migration;
use Obx\Laravel\Facades\Obx;

/*
 * Subscribes inventory.reserve_stock to the orders topic.  obx's consumer
 * workers (obx.consumer_database = 'inventory') pick the subscription up
 * within obx.poll_interval, no restart.  A new consumer group starts at the
 * earliest offset, so orders placed before this migration are reserved too.
 */
return new class extends Migration
{
    protected $connection = 'inventory';

    public function up(): void
    {
        $options = ['start' => 'earliest'];
        if (config('inventory.kafka')) {
            $options['kafka'] = config('inventory.kafka');
        }

        // obx.subscribe(consumer, topics, 'inventory.reserve_stock(obx.inbound_event)', options)
        Obx::connection($this->connection)->subscribe(
            config('inventory.consumer'),
            config('inventory.topics'),
            'inventory.reserve_stock(obx.inbound_event)',
            $options
        );
    }

    public function down(): void
    {
        Obx::connection($this->connection)->unsubscribe(config('inventory.consumer'));
    }
};
