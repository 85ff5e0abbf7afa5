<?php

namespace Obx\Laravel\Tests;

use RuntimeException;

/**
 * A throwaway PostgreSQL cluster with the installed obx preloaded, started
 * once for the run and stopped at exit: no relay or consumer workers (the
 * tests check what is enqueued, not what reaches Kafka; t/050_laravel.pl
 * covers that), a Unix socket only, in a temporary directory.
 */
final class TestDatabase
{
    private static ?array $config = null;
    private static ?string $dir = null;

    /** The Laravel connection config of the cluster's database "postgres". */
    public static function connection(): array
    {
        return self::$config ??= self::start();
    }

    private static function start(): array
    {
        $bin = self::bindir();
        $dir = sys_get_temp_dir() . '/obx-laravel-phpunit.' . getmypid();
        self::run(['rm', '-rf', $dir]);
        mkdir($dir, 0700, true);
        $port = 20000 + getmypid() % 20000;
        $user = posix_getpwuid(posix_geteuid())['name'];

        self::run(["$bin/initdb", '-D', "$dir/data", '-A', 'trust', '-U', $user, '-N']);
        file_put_contents("$dir/data/postgresql.conf", implode("\n", [
            "listen_addresses = ''",
            "unix_socket_directories = '$dir'",
            "port = $port",
            "shared_preload_libraries = 'obx'",
            'obx.workers = 0',
            'obx.consumer_workers = 0',
            'fsync = off',
            '',
        ]), FILE_APPEND);
        self::run(["$bin/pg_ctl", '-D', "$dir/data", '-l', "$dir/postgres.log", '-w', '-t', '120', 'start']);
        self::$dir = $dir;
        register_shutdown_function(function () use ($bin, $dir) {
            self::run(["$bin/pg_ctl", '-D', "$dir/data", '-m', 'immediate', '-w', 'stop']);
            self::run(['rm', '-rf', $dir]);
        });

        return [
            'driver' => 'pgsql',
            'host' => $dir,
            'port' => $port,
            'database' => 'postgres',
            'username' => $user,
            'password' => '',
            'charset' => 'utf8',
            'prefix' => '',
            'schema' => 'public',
        ];
    }

    /**
     * Restarts the cluster as a failover or a restart does (fast: every
     * session is cut), and returns once it accepts connections again.
     */
    public static function restart(): void
    {
        self::connection();
        self::run([self::bindir() . '/pg_ctl', '-D', self::$dir . '/data', '-l', self::$dir . '/postgres.log',
                   '-m', 'fast', '-w', '-t', '120', 'restart']);
    }

    /** PostgreSQL's server binaries: PG_CONFIG's, else initdb on PATH, else Debian's 15. */
    private static function bindir(): string
    {
        $pgConfig = getenv('PG_CONFIG');
        if ($pgConfig && is_executable($pgConfig)) {
            return trim(shell_exec(escapeshellarg($pgConfig) . ' --bindir'));
        }
        $initdb = trim((string) shell_exec('command -v initdb'));
        return $initdb !== '' ? dirname($initdb) : '/usr/lib/postgresql/15/bin';
    }

    private static function run(array $argv): void
    {
        $cmd = implode(' ', array_map('escapeshellarg', $argv)) . ' 2>&1';
        exec($cmd, $out, $status);
        if ($status !== 0) {
            throw new RuntimeException("$cmd failed ($status):\n" . implode("\n", $out));
        }
    }
}
