<?php

namespace Obx\Laravel\Console;

use Illuminate\Console\ConfirmableTrait;

/**
 * obx:replay: obx.replay by ids, or by topic and time range.  In
 * production it asks first (--force does not), as migrate does.
 */
class ReplayCommand extends ObxCommand
{
    use ConfirmableTrait;

    protected $signature = 'obx:replay
        {id?* : published event ids to publish again, with the same ids}
        {--topic= : instead of ids: the published events of this topic...}
        {--since= : ...that occurred at or after this time (required with --topic)}
        {--until= : ...and before this time (default: no end)}
        {--connection= : the database connection (default: config obx.connection)}
        {--force : replay in production without asking}';

    protected $description = 'Publish already published obx events again (consumers deduplicate by event id)';

    public function handle(): int
    {
        $ids = $this->argument('id');
        $topic = $this->option('topic');
        if (($topic !== null) === (count($ids) > 0) || ($topic !== null && $this->option('since') === null)) {
            $this->error('give event ids, or --topic with --since (not both)');
            return 2;
        }
        $production = fn () => $this->laravel->bound('env') && $this->laravel['env'] === 'production';
        if (!$this->confirmToProceed('Consumers will receive these events again.', $production)) {
            return 1;
        }
        $n = $topic !== null
            ? $this->outbox()->replayTopic($topic, $this->option('since'), $this->option('until'))
            : $this->outbox()->replay($ids);
        $this->table(['replayed'], [[$n]]);
        return 0;
    }
}
