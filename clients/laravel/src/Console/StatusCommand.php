<?php

namespace Obx\Laravel\Console;

/**
 * obx:status: the outbox per topic (obx.status), and the consumers
 * (obx.consumers) with what waits for obx:work (obx.landed_status).
 */
class StatusCommand extends ObxCommand
{
    protected $signature = 'obx:status
        {--connection= : the database connection (default: config obx.connection)}
        {--consumers : also show the consumers of this database and what waits for obx:work}
        {--json : print the rows as JSON (topics; consumers and landed with --consumers)}';

    protected $description = 'Show the obx outbox per topic: pending, leased, published, quarantined';

    public function handle(): int
    {
        $outbox = $this->outbox();
        if ($this->option('json')) {
            $out = ['topics' => $outbox->status()];
            if ($this->option('consumers')) {
                $out['consumers'] = $outbox->consumers();
                $out['landed'] = $outbox->landedStatus();
            }
            $this->line(json_encode($out, JSON_THROW_ON_ERROR | JSON_UNESCAPED_SLASHES | JSON_UNESCAPED_UNICODE));
            return 0;
        }
        $this->table(['topic', 'pending', 'leased', 'published', 'quarantined', 'failing',
                      'oldest pending age', 'last error', 'problem'], $this->rows($outbox->status()));
        if ($this->option('consumers')) {
            $this->table(['consumer', 'processed', 'duplicates', 'dead lettered', 'retries', 'lag',
                          'dead letters pending'], $this->rows($outbox->consumers()));
            $this->table(['consumer', 'landed for obx:work', 'failing', 'backing off', 'oldest landed age'],
                $this->rows($outbox->landedStatus()));
        }
        return 0;
    }
}
