<?php

namespace Obx\Laravel\Tests;

use PHPUnit\Framework\TestCase as PHPUnitTestCase;

/**
 * What composer.json promises: Laravel 8 to 12 and PHP ^8.1, and a stable
 * version, obx's own, that an application can require from a path
 * repository (checked with Composer itself when it is installed).
 */
class VersionsTest extends PHPUnitTestCase
{
    private const ILLUMINATE = ['illuminate/console', 'illuminate/database', 'illuminate/events', 'illuminate/support'];

    public function testLaravel8To12AndPhp81(): void
    {
        $require = self::composer()['require'];
        $this->assertSame('^8.1', $require['php']);
        foreach (self::ILLUMINATE as $package) {
            $this->assertSame(['^8.0', '^9.0', '^10.0', '^11.0', '^12.0'], explode('|', $require[$package]), $package);
        }
    }

    public function testTheVersionIsObxs(): void
    {
        $this->assertMatchesRegularExpression('/^\d+\.\d+\.\d+$/', self::composer()['version'] ?? '');
        $this->assertStringStartsWith(self::obxVersion() . '.', self::composer()['version'], 'obx.control default_version');
    }

    public function testAnApplicationRequiresAStableVersionFromAPathRepository(): void
    {
        $composer = trim((string) shell_exec('command -v composer'));
        if ($composer === '') {
            $this->markTestSkipped('no composer on PATH');
        }
        $version = self::composer()['version'];
        $app = sys_get_temp_dir() . '/obx-laravel-app.' . getmypid();
        foreach (['8.83.26', '12.0.0'] as $laravel) {
            exec('rm -rf ' . escapeshellarg($app));
            mkdir($app, 0700, true);
            file_put_contents("$app/composer.json", json_encode([
                'name' => 'acme/shop',
                'repositories' => [['type' => 'path', 'url' => realpath(__DIR__ . '/..')], ['packagist.org' => false]],
                // Laravel as the application has it, without fetching it
                'provide' => array_fill_keys(self::ILLUMINATE, $laravel),
                'require' => ['obx/laravel' => '^' . self::obxVersion()],     // stable only
            ], JSON_UNESCAPED_SLASHES));
            exec(sprintf('cd %s && COMPOSER_HOME=%s/home COMPOSER_CACHE_DIR=%s/cache %s update --no-install '
                . '--no-interaction --no-audit --no-plugins --no-scripts 2>&1',
                escapeshellarg($app), escapeshellarg($app), escapeshellarg($app), escapeshellarg($composer)), $out, $status);
            $this->assertSame(0, $status, "Laravel $laravel:\n" . implode("\n", $out));
            $lock = json_decode(file_get_contents("$app/composer.lock"), true);
            $this->assertSame([['obx/laravel', $version]],
                array_map(fn (array $p) => [$p['name'], $p['version']], $lock['packages']), "Laravel $laravel");
        }
        exec('rm -rf ' . escapeshellarg($app));
    }

    /** obx.control's default_version, e.g. 1.1. */
    private static function obxVersion(): string
    {
        preg_match("/^default_version\\s*=\\s*'([^']+)'/m", file_get_contents(__DIR__ . '/../../../obx.control'), $m);
        return $m[1];
    }

    private static function composer(): array
    {
        return json_decode(file_get_contents(__DIR__ . '/../composer.json'), true, 512, JSON_THROW_ON_ERROR);
    }
}
