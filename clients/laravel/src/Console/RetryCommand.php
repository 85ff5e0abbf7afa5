<?php

namespace Obx\Laravel\Console;

/** obx:retry: obx.retry per id, or obx.retry_quarantined with --all. */
class RetryCommand extends ObxCommand
{
    protected $signature = 'obx:retry
        {id?* : event ids to make publishable now (quarantined or backing off)}
        {--all : every quarantined event (obx.retry_quarantined)}
        {--topic= : with --all: only this topic}
        {--connection= : the database connection (default: config obx.connection)}';

    protected $description = 'Make quarantined obx events publishable again';

    public function handle(): int
    {
        $ids = $this->argument('id');
        if ($this->option('all') === (count($ids) > 0)) {
            $this->error('give event ids, or --all (not both)');
            return 2;
        }
        $outbox = $this->outbox();
        if ($this->option('all')) {
            $n = $outbox->retryQuarantined($this->option('topic'));
            $this->info("$n quarantined event(s) will be published again");
            return 0;
        }
        $rows = [];
        $missed = 0;
        foreach ($ids as $id) {
            $ok = $outbox->retry($id);
            $missed += $ok ? 0 : 1;
            $rows[] = [$id, $ok ? 'retried' : 'not quarantined or backing off: unchanged'];
        }
        $this->table(['id', 'result'], $rows);
        return $missed > 0 ? 1 : 0;
    }
}
