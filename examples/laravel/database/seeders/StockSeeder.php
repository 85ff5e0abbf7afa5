<?php

namespace Database\Seeders;

use Illuminate\Database\Seeder;
use Illuminate\Support\Facades\DB;

/**
 * On hand: config('inventory.initial_on_hand') units of every catalog sku
 * in every warehouse.  Re-running it resets on_hand, never reserved.
 */
class StockSeeder extends Seeder
{
    public function run(): void
    {
        $rows = [];
        foreach (config('shop.warehouses') as $warehouse) {
            foreach (array_keys(config('shop.catalog')) as $sku) {
                $rows[] = [
                    'warehouse' => $warehouse,
                    'sku' => $sku,
                    'on_hand' => config('inventory.initial_on_hand'),
                ];
            }
        }
        DB::connection('inventory')->table('inventory.stock')
            ->upsert($rows, ['warehouse', 'sku'], ['on_hand']);
    }
}
