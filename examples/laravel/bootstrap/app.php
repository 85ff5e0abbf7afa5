<?php

/*
 * Boots the pieces of Laravel 8 this example uses, all from Debian's
 * php-laravel-framework and php-illuminate-* packages (no Composer): the
 * service container, config, the database manager behind the DB and Schema
 * facades (registered by Laravel's own DatabaseServiceProvider), Eloquent,
 * the event dispatcher and the Artisan console; and the obx/laravel package
 * (clients/laravel): the Obx facade, the listener that enqueues
 * ShouldPublishToKafka events, the obx:* commands.
 *
 * Returns the console application; artisan-like runs it.
 */

// Debian installs the framework under /usr/share/php, on PHP's include_path.
require_once 'Illuminate/autoload.php';
// obx/laravel without Composer (with Composer: composer require obx/laravel).
require_once __DIR__ . '/../../../clients/laravel/autoload.php';

// Composer's PSR-4 mapping of a Laravel application, by hand.
spl_autoload_register(function (string $class): void {
    $roots = [
        'App\\' => __DIR__ . '/../app/',
        'Database\\Seeders\\' => __DIR__ . '/../database/seeders/',
    ];
    foreach ($roots as $prefix => $dir) {
        if (strncmp($class, $prefix, strlen($prefix)) === 0) {
            $file = $dir . str_replace('\\', '/', substr($class, strlen($prefix))) . '.php';
            if (is_file($file)) {
                require $file;
            }
            return;
        }
    }
});

use Illuminate\Config\Repository as Config;
use Illuminate\Console\Application as Artisan;
use Illuminate\Container\Container;
use Illuminate\Database\DatabaseServiceProvider;
use Illuminate\Events\Dispatcher;
use Illuminate\Support\Facades\Facade;
use Obx\Laravel\ObxServiceProvider;

$app = new Container();
Container::setInstance($app);
Facade::setFacadeApplication($app);

$app->instance('path.base', dirname(__DIR__));
$app->instance('config', new Config([
    'database' => require __DIR__ . '/../config/database.php',
    'shop' => require __DIR__ . '/../config/shop.php',
    'inventory' => require __DIR__ . '/../config/inventory.php',
    'obx' => require __DIR__ . '/../config/obx.php',
]));
$app->instance('events', new Dispatcher($app));

// The aliases Laravel's Application registers, so commands can type-hint them.
$app->alias('events', Illuminate\Contracts\Events\Dispatcher::class);
$app->instance(Illuminate\Contracts\Container\Container::class, $app);

// What config/app.php's providers list does in a full application.
$providers = [new DatabaseServiceProvider($app), new ObxServiceProvider($app)];
foreach ($providers as $provider) {
    $provider->register();
}
foreach ($providers as $provider) {
    $provider->boot();
}
$app->alias('db', Illuminate\Database\DatabaseManager::class);
$app->alias('db', Illuminate\Database\ConnectionResolverInterface::class);

// The package's obx:* commands join through ObxServiceProvider::boot.
$artisan = new Artisan($app, $app['events'], 'obx-laravel-example');
$artisan->resolveCommands([
    App\Console\Commands\Migrate::class,
    App\Console\Commands\SeedStock::class,
    App\Console\Commands\PlaceOrders::class,
    App\Console\Commands\Status::class,
]);

return $artisan;
