<?php

namespace Obx\Laravel\Console;

use Illuminate\Console\Command;
use Obx\Laravel\Outbox;

/**
 * What the obx:* commands share: the --connection option and table rows
 * from query results.
 */
abstract class ObxCommand extends Command
{
    protected function outbox(): Outbox
    {
        return $this->laravel->make('obx')->connection($this->option('connection')
            ?: $this->laravel['config']->get('obx.connection'));
    }

    /** @param object[] $result */
    protected function rows(array $result): array
    {
        return array_map(fn ($row) => array_map(
            fn ($v) => is_bool($v) ? ($v ? 'yes' : 'no') : $v, array_values((array) $row)), $result);
    }
}
