<?php

namespace Obx\Laravel;

use Illuminate\Support\ServiceProvider;
use Obx\Laravel\Contracts\ShouldPublishToKafka;
use Obx\Laravel\Listeners\PublishToKafka;

/**
 * Registers the outbox behind the Obx facade (container key "obx"), the
 * listener that enqueues ShouldPublishToKafka events, the check of each
 * model's $dispatchesEvents at its boot (AfterCommit), and the artisan
 * commands obx:status, obx:quarantine, obx:retry, obx:replay, obx:skip and
 * obx:work.
 */
class ObxServiceProvider extends ServiceProvider
{
    public function register(): void
    {
        $this->mergeConfigFrom(__DIR__ . '/../config/obx.php', 'obx');

        $this->app->singleton('obx', fn ($app) => new Outbox(
            $app['db'],
            $app['config']->get('obx.connection'),
            $app['config']->get('obx.outside_transaction', Outbox::REFUSE),
        ));
        $this->app->alias('obx', Outbox::class);
    }

    public function boot(): void
    {
        $events = $this->app['events'];
        $events->listen(ShouldPublishToKafka::class, [PublishToKafka::class, 'handle']);
        $events->listen('eloquent.booted: *',
            fn (string $name, array $data) => AfterCommit::checkModel($data[0], $events));

        if (method_exists($this->app, 'configPath')) {
            $this->publishes([__DIR__ . '/../config/obx.php' => $this->app->configPath('obx.php')], 'obx-config');
        }

        $this->commands([
            Console\StatusCommand::class,
            Console\QuarantineCommand::class,
            Console\RetryCommand::class,
            Console\ReplayCommand::class,
            Console\SkipCommand::class,
            Console\WorkCommand::class,
            Console\DeadLettersCommand::class,
        ]);
    }
}
