<?php

namespace Obx\Laravel\Migrations;

use Illuminate\Database\Migrations\Migration;
use Obx\Laravel\Facades\Obx;

/**
 * A migration that installs obx without its library, for a managed
 * PostgreSQL: it runs the SQL-only install file (Outbox::install) that the
 * application keeps with its migrations, so its own repository pins obx's
 * schema version.  In a migration file:
 *
 *     return new Obx\Laravel\Migrations\InstallObxSqlOnly(database_path('obx-sql-only.sql'));
 *     return new Obx\Laravel\Migrations\InstallObxSqlOnly(database_path('obx-sql-only.sql'), 'inventory');
 *
 * It runs in the migration's transaction.  down() keeps obx: its outbox may
 * hold unpublished events, and the SQL-only install has no drop guard to
 * stop a DROP SCHEMA obx CASCADE from losing them.
 */
class InstallObxSqlOnly extends Migration
{
    public function __construct(private string $sqlFile, ?string $connection = null)
    {
        $this->connection = $connection;
    }

    public function up(): void
    {
        Obx::connection($this->connection)->install($this->sqlFile);
    }

    public function down(): void
    {
    }
}
