<?php

namespace Obx\Laravel\Migrations;

use Illuminate\Database\Migrations\Migration;
use Obx\Laravel\Facades\Obx;

/**
 * A migration that creates the extension (needs a superuser).  In a
 * migration file:
 *
 *     return new Obx\Laravel\Migrations\CreateObxExtension();          // default connection
 *     return new Obx\Laravel\Migrations\CreateObxExtension('inventory');
 *
 * down() keeps the extension: its outbox may hold unpublished events.
 */
class CreateObxExtension extends Migration
{
    public function __construct(?string $connection = null)
    {
        $this->connection = $connection;
    }

    public function up(): void
    {
        Obx::connection($this->connection)->createExtension();
    }

    public function down(): void
    {
    }
}
