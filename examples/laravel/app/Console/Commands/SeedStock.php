<?php

namespace App\Console\Commands;

use Database\Seeders\StockSeeder;
use Illuminate\Console\Command;

class SeedStock extends Command
{
    protected $signature = 'db:seed';

    protected $description = 'Put the initial stock of every catalog sku in every warehouse';

    public function handle(): int
    {
        (new StockSeeder())->setContainer($this->laravel)->setCommand($this)->__invoke();
        $this->info('Stock seeded');
        return 0;
    }
}
