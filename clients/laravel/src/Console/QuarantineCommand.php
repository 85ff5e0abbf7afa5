<?php

namespace Obx\Laravel\Console;

/** obx:quarantine: the events the relay gave up on (obx.quarantine). */
class QuarantineCommand extends ObxCommand
{
    protected $signature = 'obx:quarantine
        {--connection= : the database connection (default: config obx.connection)}
        {--topic= : only this topic}';

    protected $description = 'List the quarantined obx events (then obx:retry or obx:skip them)';

    public function handle(): int
    {
        $this->table(['id', 'topic', 'key', 'type', 'attempts', 'error class', 'last error', 'quarantined at'],
            $this->rows($this->outbox()->quarantine($this->option('topic'))));
        return 0;
    }
}
