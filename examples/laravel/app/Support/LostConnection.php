<?php

namespace App\Support;

use Throwable;

/**
 * Whether an exception means the database connection is gone or refused
 * (server restart, crash recovery, network), as opposed to an error of the
 * statement itself.  After one, the outcome of an open transaction's COMMIT
 * is unknown and must be looked up, never guessed.
 */
final class LostConnection
{
    private const MESSAGES = [
        'server closed the connection unexpectedly',
        'no connection to the server',
        'terminating connection',
        'the database system is',   // starting up, in recovery mode, shutting down
        'Connection refused',
        'No such file or directory', // the Unix socket is not there yet
        'could not connect',
        'connection to server',
        'Lost connection',
        'reset by peer',
        'Broken pipe',
        'SSL SYSCALL error',
    ];

    public static function causedBy(Throwable $e): bool
    {
        for (; $e !== null; $e = $e->getPrevious()) {
            if ($e instanceof \Illuminate\Database\LostConnectionException) {
                return true;
            }
            $state = $e instanceof \PDOException ? (string) ($e->errorInfo[0] ?? $e->getCode()) : '';
            // class 08: connection exception; 57P0x: admin/crash shutdown,
            // cannot connect now
            if (str_starts_with($state, '08') || str_starts_with($state, '57P0')) {
                return true;
            }
            foreach (self::MESSAGES as $m) {
                if (stripos($e->getMessage(), $m) !== false) {
                    return true;
                }
            }
        }
        return false;
    }
}
