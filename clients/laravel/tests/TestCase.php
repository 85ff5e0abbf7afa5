<?php

namespace Obx\Laravel\Tests;

use Illuminate\Config\Repository as Config;
use Illuminate\Console\Application as Artisan;
use Illuminate\Container\Container;
use Illuminate\Database\DatabaseServiceProvider;
use Illuminate\Events\Dispatcher;
use Illuminate\Support\Facades\Facade;
use Obx\Laravel\ObxServiceProvider;
use PHPUnit\Framework\TestCase as PHPUnitTestCase;

/**
 * A fresh Laravel container per test, with config, events, Laravel's
 * DatabaseServiceProvider and the package's ObxServiceProvider, booted as
 * an application would.
 */
abstract class TestCase extends PHPUnitTestCase
{
    protected Container $app;

    protected function setUp(): void
    {
        parent::setUp();
        $this->app = self::makeApp($this->obxConfig(), $this->databaseConfig());
    }

    protected function tearDown(): void
    {
        Facade::clearResolvedInstances();
        parent::tearDown();
    }

    protected function obxConfig(): array
    {
        return [];
    }

    protected function databaseConfig(): array
    {
        return ['default' => 'none', 'connections' => ['none' => ['driver' => 'pgsql']]];
    }

    public static function makeApp(array $obx, array $database): Container
    {
        $app = new Container();
        Container::setInstance($app);
        Facade::clearResolvedInstances();
        Facade::setFacadeApplication($app);
        $app->instance('config', new Config(['database' => $database, 'obx' => $obx]));
        $app->instance('events', new Dispatcher($app));
        $app->alias('events', \Illuminate\Contracts\Events\Dispatcher::class);
        $app->instance(\Illuminate\Contracts\Container\Container::class, $app);

        Artisan::forgetBootstrappers();
        $providers = [new DatabaseServiceProvider($app), new ObxServiceProvider($app)];
        foreach ($providers as $provider) {
            $provider->register();
        }
        foreach ($providers as $provider) {
            $provider->boot();
        }
        $app->alias('db', \Illuminate\Database\DatabaseManager::class);
        $app->alias('db', \Illuminate\Database\ConnectionResolverInterface::class);
        return $app;
    }

    /** Runs an artisan command; returns [exit code, output]. */
    protected function artisan(string $command, array $parameters = []): array
    {
        $artisan = new Artisan($this->app, $this->app['events'], 'test');
        $code = $artisan->call($command, $parameters);
        return [$code, $artisan->output()];
    }
}
