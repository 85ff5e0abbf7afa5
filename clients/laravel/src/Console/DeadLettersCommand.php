<?php

namespace Obx\Laravel\Console;

use Illuminate\Console\ConfirmableTrait;

/**
 * obx:dead-letters: the consumers' dead letters not replayed yet
 * (obx.dead_letters), and with --replay, obx.replay_dead_letter of those
 * listed (by id, or every one of the consumer).  In production --replay
 * asks first (--force does not), as migrate does.
 */
class DeadLettersCommand extends ObxCommand
{
    use ConfirmableTrait;

    protected $signature = 'obx:dead-letters
        {consumer? : only this consumer}
        {--id=* : with --replay: only these dead letters}
        {--replay : apply them again with their subscription\'s current handler}
        {--connection= : the database connection (default: config obx.connection)}
        {--force : replay in production without asking}';

    protected $description = 'List the consumers\' dead letters, or replay them once the cause is fixed';

    public function handle(): int
    {
        $outbox = $this->outbox();
        $consumer = $this->argument('consumer');
        $ids = $this->option('id');
        if (!$this->option('replay')) {
            $this->table(['id', 'consumer', 'topic', 'partition', 'offset', 'event id', 'error class',
                          'error', 'failed at', 'replays'], $this->rows($outbox->deadLetters($consumer)));
            return 0;
        }
        if ($ids === [] && $consumer === null) {
            $this->error('name a consumer, or --id the dead letters to replay');
            return 2;
        }
        $production = fn () => $this->laravel->bound('env') && $this->laravel['env'] === 'production';
        if (!$this->confirmToProceed('The handlers will run on these messages again.', $production)) {
            return 1;
        }
        $this->table(['replayed'], [[$outbox->replayDeadLetters($ids, $ids === [] ? $consumer : null)]]);
        return 0;
    }
}
