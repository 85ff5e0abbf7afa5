<?php

/*
 * Loads Laravel from Debian's php-laravel-framework (on PHP's include_path)
 * and the package through its autoload.php, as an application without
 * Composer would.
 */

require_once 'Illuminate/autoload.php';
require_once __DIR__ . '/../autoload.php';

spl_autoload_register(function (string $class): void {
    $prefix = 'Obx\\Laravel\\Tests\\';
    if (strncmp($class, $prefix, strlen($prefix)) === 0) {
        $file = __DIR__ . '/' . str_replace('\\', '/', substr($class, strlen($prefix))) . '.php';
        if (is_file($file)) {
            require $file;
        }
    }
});

// Laravel before 10.30 has no ShouldDispatchAfterCommit: the tests bring the marker.
if (!interface_exists('Illuminate\Contracts\Events\ShouldDispatchAfterCommit')) {
    require __DIR__ . '/Fixtures/Laravel10/ShouldDispatchAfterCommit.php';
}
