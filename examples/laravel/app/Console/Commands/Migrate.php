<?php

namespace App\Console\Commands;

use Illuminate\Console\Command;
use Illuminate\Database\DatabaseManager;
use Illuminate\Database\Migrations\DatabaseMigrationRepository;
use Illuminate\Database\Migrations\Migrator;
use Illuminate\Filesystem\Filesystem;

/**
 * Laravel's migrator, run once per database: database/migrations/shop on
 * the shop connection, database/migrations/inventory on the inventory
 * connection, each with its own migrations table.
 */
class Migrate extends Command
{
    protected $signature = 'migrate
        {--database=* : shop and/or inventory (default: both, shop first)}';

    protected $description = 'Run the pending migrations of the shop and inventory databases';

    public function handle(DatabaseManager $db): int
    {
        foreach ($this->option('database') ?: ['shop', 'inventory'] as $name) {
            if (!in_array($name, ['shop', 'inventory'], true)) {
                $this->error("unknown database \"$name\" (shop or inventory)");
                return 1;
            }
            $repository = new DatabaseMigrationRepository($db, config('database.migrations'));
            $migrator = new Migrator($repository, $db, new Filesystem(), $this->laravel['events']);
            $migrator->setOutput($this->output);

            $this->info("Migrating database $name");
            $migrator->usingConnection($name, function () use ($migrator, $repository, $name) {
                if (!$repository->repositoryExists()) {
                    $repository->createRepository();
                }
                $migrator->run([app('path.base') . "/database/migrations/$name"]);
            });
        }
        return 0;
    }
}
