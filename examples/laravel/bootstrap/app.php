<?php

/*
 * Boots the pieces of Laravel 8 this example uses, all from Debian's
 * php-laravel-framework and php-illuminate-* packages (no Composer): the
 * service container, config, the database manager behind the DB and Schema
 * facades (registered by Laravel's own DatabaseServiceProvider), Eloquent,
 * the event dispatcher and the Artisan console.
 *
 * Returns the console application; artisan-like runs it.
 */

// Debian installs the framework under /usr/share/php, on PHP's include_path.
require_once 'Illuminate/autoload.php';

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

$app = new Container();
Container::setInstance($app);
Facade::setFacadeApplication($app);

$app->instance('path.base', dirname(__DIR__));
$app->instance('config', new Config([
    'database' => require __DIR__ . '/../config/database.php',
    'shop' => require __DIR__ . '/../config/shop.php',
    'inventory' => require __DIR__ . '/../config/inventory.php',
]));
$app->instance('events', new Dispatcher($app));

$db = new DatabaseServiceProvider($app);
$db->register();
$db->boot();
// The aliases Laravel's Application registers, so commands can type-hint them.
$app->alias('db', Illuminate\Database\DatabaseManager::class);
$app->alias('db', Illuminate\Database\ConnectionResolverInterface::class);
$app->alias('events', Illuminate\Contracts\Events\Dispatcher::class);

$artisan = new Artisan($app, $app['events'], 'obx-laravel-example');
$artisan->resolveCommands([
    App\Console\Commands\Migrate::class,
    App\Console\Commands\SeedStock::class,
    App\Console\Commands\PlaceOrders::class,
    App\Console\Commands\Status::class,
]);

return $artisan;
