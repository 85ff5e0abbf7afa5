<?php

namespace App\Console\Commands;

use Illuminate\Console\Command;
use Illuminate\Support\Facades\DB;
use Obx\Laravel\Facades\Obx;

/**
 * Both sides at a glance: the shop's outbox (obx.status), the inventory
 * consumer (obx.consumers) and the stock.  obx:status shows one database's
 * outbox alone (--connection=inventory --consumers: the consumer).
 */
class Status extends Command
{
    protected $signature = 'status';

    protected $description = 'Show the outbox, the inventory consumer and the stock';

    public function handle(): int
    {
        $this->info('shop: orders and outbox');
        $this->line(sprintf('orders: %d', DB::table('orders')->count()));
        $this->table(['topic', 'pending', 'leased', 'published', 'quarantined', 'failing',
                      'oldest pending age', 'last error'], $this->rows(Obx::status()));

        $inventory = DB::connection('inventory');
        $this->info('inventory: consumer');
        $this->table(['consumer', 'processed', 'duplicates', 'dead lettered', 'retries', 'lag', 'dead letters pending'],
            $this->rows(Obx::connection('inventory')->consumers()));

        $this->info('inventory: stock');
        $this->table(['warehouse', 'sku', 'on hand', 'reserved', 'available'],
            $this->rows($inventory->select(
                'select warehouse, sku, on_hand, reserved, on_hand - reserved
                   from inventory.stock order by warehouse, sku')));
        return 0;
    }

    private function rows(array $result): array
    {
        return array_map(fn ($row) => array_values((array) $row), $result);
    }
}
