<?php

/*
 * Loads obx/laravel without Composer, for an application built on Debian's
 * php-laravel-framework (or any hand-made autoloader):
 *
 *     require_once 'Illuminate/autoload.php';      // Debian's Laravel
 *     require_once '/path/to/clients/laravel/autoload.php';
 *
 * It registers the package's PSR-4 prefix Obx\Laravel\ => src/, the same
 * mapping composer.json declares.  With Composer, do not include it.
 */

spl_autoload_register(function (string $class): void {
    $prefix = 'Obx\\Laravel\\';
    if (strncmp($class, $prefix, strlen($prefix)) !== 0) {
        return;
    }
    $file = __DIR__ . '/src/' . str_replace('\\', '/', substr($class, strlen($prefix))) . '.php';
    if (is_file($file)) {
        require $file;
    }
});
