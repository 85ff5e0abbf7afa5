<?php

namespace Obx\Laravel\Tests\Fixtures;

use Illuminate\Support\Facades\DB;
use Obx\Laravel\Work\LandedMessage;
use RuntimeException;

/**
 * The listener of WorkTest: writes one row to work_effects through the
 * obx connection, with the number of the key's last effect it could see
 * (prev_seen: n - 1 when the key's messages ran one after another, in
 * order).  A payload may ask it to fail ("fail": "always", or "once" while
 * the file $FAIL_DIR/<event id> does not exist), or to kill its own
 * process with SIGKILL after writing ("kill": true the first time, as
 * "once"; "always").
 */
class RecordEffect
{
    public static string $failDir = '/nonexistent';

    public function handle(LandedMessage $message): void
    {
        $p = $message->payload ?? [];
        DB::insert(
            'insert into work_effects (event_id, event_key, n, prev_seen, pid, attempt)
             select ?, ?, ?, (select max(n) from work_effects where event_key = ?), ?, ?',
            [$message->eventId, $message->key, $p['n'] ?? 0, $message->key, getmypid(), $message->attempt]);
        if (isset($p['sleep_ms'])) {
            usleep($p['sleep_ms'] * 1000);
        }
        $once = (getenv('OBX_WORK_TEST_DIR') ?: self::$failDir) . '/' . $message->eventId;
        if (($p['kill'] ?? null) === 'always' || (($p['kill'] ?? false) && !file_exists($once))) {
            touch($once);
            posix_kill(getmypid(), SIGKILL);
            sleep(10);
        }
        if (($p['fail'] ?? null) === 'always'
            || (($p['fail'] ?? null) === 'once' && !file_exists($once) && touch($once))) {
            throw new RuntimeException("listener refused {$message->eventId}");
        }
    }
}
