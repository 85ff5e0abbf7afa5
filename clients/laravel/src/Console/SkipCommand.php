<?php

namespace Obx\Laravel\Console;

/** obx:skip: obx.skip, gives up on quarantined events for good. */
class SkipCommand extends ObxCommand
{
    protected $signature = 'obx:skip
        {id* : quarantined event ids to give up on (moved to obx.skipped_events, never sent)}
        {--reason= : why (required; recorded in obx.skipped_events)}
        {--connection= : the database connection (default: config obx.connection)}';

    protected $description = 'Give up on quarantined obx events for good';

    public function handle(): int
    {
        $reason = (string) $this->option('reason');
        if (trim($reason) === '') {
            $this->error('obx:skip needs --reason');
            return 2;
        }
        $outbox = $this->outbox();
        $rows = [];
        $missed = 0;
        foreach ($this->argument('id') as $id) {
            $ok = $outbox->skip($id, $reason);
            $missed += $ok ? 0 : 1;
            $rows[] = [$id, $ok ? 'skipped' : 'not quarantined: unchanged'];
        }
        $this->table(['id', 'result'], $rows);
        return $missed > 0 ? 1 : 0;
    }
}
