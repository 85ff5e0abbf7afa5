<?php

use Illuminate\Database\Migrations\Migration;
use Illuminate\Support\Facades\DB;

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

        DB::connection($this->connection)->select(
            "select obx.subscribe(?, string_to_array(?, ','),
                                  'inventory.reserve_stock(obx.inbound_event)'::regprocedure,
                                  ?::jsonb)",
            [
                config('inventory.consumer'),
                implode(',', config('inventory.topics')),
                json_encode($options),
            ]
        );
    }

    public function down(): void
    {
        DB::connection($this->connection)->select('select obx.unsubscribe(?)',
            [config('inventory.consumer')]);
    }
};
