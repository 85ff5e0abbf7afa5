<?php

use Illuminate\Database\Migrations\Migration;
use Illuminate\Database\Schema\Blueprint;
use Illuminate\Support\Facades\Schema;
use Obx\Laravel\Facades\Obx;

/*
 * The shop: obx (its outbox, obx.enqueue) and the orders.  Creating the
 * extension needs a superuser; in production a DBA runs it once and the
 * application role gets USAGE on schema obx and EXECUTE on obx.enqueue.
 */
return new class extends Migration
{
    protected $connection = 'shop';

    public function up(): void
    {
        Obx::connection($this->connection)->createExtension();   // CREATE EXTENSION IF NOT EXISTS obx

        Schema::connection($this->connection)->create('orders', function (Blueprint $table) {
            $table->string('id', 40)->primary();        // ord_..., chosen by the application
            $table->string('customer_id', 40);
            $table->bigInteger('total_minor');
            $table->char('currency', 3);
            $table->string('warehouse', 40)->nullable(); // the customer's pick, if any
            $table->timestampsTz();
        });

        Schema::connection($this->connection)->create('order_lines', function (Blueprint $table) {
            $table->id();
            $table->string('order_id', 40);
            $table->string('sku', 40);
            $table->integer('qty');
            $table->bigInteger('unit_price_minor');

            $table->foreign('order_id')->references('id')->on('orders');
            $table->index('order_id');
        });
    }

    public function down(): void
    {
        // The extension stays: its outbox may still hold unpublished events.
        Schema::connection($this->connection)->dropIfExists('order_lines');
        Schema::connection($this->connection)->dropIfExists('orders');
    }
};
