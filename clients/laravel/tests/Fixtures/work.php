<?php

/*
 * php work.php obx:work <args>: an obx:work process of WorkTest, on the
 * test database named by OBX_WORK_TEST_DB (JSON connection config), with
 * RecordEffect as the listener of every message of orders.placed.v1.
 */

require_once 'PHPUnit/Autoload.php';      // TestCase::makeApp's class extends PHPUnit's
require __DIR__ . '/../bootstrap.php';

use Obx\Laravel\Tests\TestCase;
use Symfony\Component\Console\Input\ArgvInput;

$app = TestCase::makeApp(
    ['work' => ['listeners' => ['orders.placed.v1' => ['*' => \Obx\Laravel\Tests\Fixtures\RecordEffect::class]],
                'tries' => 3, 'backoff' => [0]]],
    ['default' => 'app', 'connections' => ['app' => json_decode(getenv('OBX_WORK_TEST_DB'), true)]]);
$artisan = new \Illuminate\Console\Application($app, $app['events'], 'test');
$artisan->setAutoExit(false);
exit($artisan->run(new ArgvInput(array_merge(['artisan'], array_slice($argv, 1)))));
