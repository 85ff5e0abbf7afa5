<?php

use Illuminate\Database\Migrations\Migration;
use Illuminate\Database\Schema\Blueprint;
use Illuminate\Support\Facades\Schema;
use Obx\Laravel\Facades\Obx;

/*
 * A consumer written in PHP: stock moves (topic stock.moves.v1, keyed by
 * sku) land in obx.landed (handler obx.land) and `obx:work` runs
 * App\Listeners\ApplyStockMove on each, which keeps a ledger per sku.
 */
return new class extends Migration
{
    protected $connection = 'inventory';

    public function up(): void
    {
        // One row per move applied, with the sku's balance after it.  No
        // unique key on the event: the tests count rows to prove each move
        // is applied once.
        Schema::connection($this->connection)->create('inventory.stock_moves', function (Blueprint $table) {
            $table->id();
            $table->text('event_id');
            $table->string('sku', 40);
            $table->integer('seq');
            $table->integer('qty');
            $table->integer('balance');
            $table->integer('prev_seq')->nullable();
            $table->integer('worker_pid');
        });

        $options = ['start' => 'earliest'];
        if (config('inventory.kafka')) {
            $options['kafka'] = config('inventory.kafka');
        }
        Obx::connection($this->connection)->subscribe(
            config('obx.work.consumer'), [config('inventory.moves_topic')], 'obx.land', $options);
    }

    public function down(): void
    {
        Obx::connection($this->connection)->unsubscribe(config('obx.work.consumer'));
        Schema::connection($this->connection)->drop('inventory.stock_moves');
    }
};
