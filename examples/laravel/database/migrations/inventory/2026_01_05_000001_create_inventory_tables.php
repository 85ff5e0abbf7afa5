<?php

use Illuminate\Database\Migrations\Migration;
use Illuminate\Database\Schema\Blueprint;
use Illuminate\Support\Facades\DB;
use Illuminate\Support\Facades\Schema;
use Obx\Laravel\Facades\Obx;

/*
 * Inventory: obx (its inbox: subscriptions, processed_events, dead_letters)
 * and the stock with its reservations, in schema inventory.
 */
return new class extends Migration
{
    protected $connection = 'inventory';

    public function up(): void
    {
        $db = DB::connection($this->connection);
        Obx::connection($this->connection)->createExtension();
        $db->statement('CREATE SCHEMA inventory');

        Schema::connection($this->connection)->create('inventory.stock', function (Blueprint $table) {
            $table->string('warehouse', 40);
            $table->string('sku', 40);
            $table->integer('on_hand');
            $table->integer('reserved')->default(0);

            $table->primary(['warehouse', 'sku']);
        });
        $db->statement('ALTER TABLE inventory.stock
            ADD CONSTRAINT stock_reserved_check CHECK (reserved >= 0 AND reserved <= on_hand)');

        // One row per order line the handler saw.  Deliberately no unique key
        // on the order: the handler relies on obx running it once per event
        // id (obx.mark_processed in the same transaction), and the tests
        // count these rows to prove it.
        Schema::connection($this->connection)->create('inventory.reservations', function (Blueprint $table) {
            $table->id();
            $table->text('event_id');
            $table->string('order_id', 40);
            $table->string('warehouse', 40);
            $table->string('sku', 40);
            $table->integer('qty');
            $table->string('status', 16);               // reserved | backordered
            $table->smallInteger('schema_version');
            $table->timestampTz('created_at')->useCurrent();

            $table->index('order_id');
            $table->index('event_id');
        });
    }

    public function down(): void
    {
        DB::connection($this->connection)->statement('DROP SCHEMA inventory CASCADE');
    }
};
