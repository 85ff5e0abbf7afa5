<?php

namespace App\Listeners;

use Illuminate\Support\Facades\DB;
use InvalidArgumentException;
use Obx\Laravel\Work\LandedMessage;

/**
 * obx:work's listener for StockMoved on stock.moves.v1 (config/obx.php):
 * appends the move to inventory.stock_moves with the sku's new balance.
 * It writes through the connection obx:work runs on (--connection=inventory),
 * so the row commits with the message's completion, or not at all.
 */
class ApplyStockMove
{
    public function handle(LandedMessage $message): void
    {
        $move = $message->payload;
        if (!is_int($move['qty'] ?? null) || $move['qty'] <= 0) {
            throw new InvalidArgumentException("stock move {$message->eventId}: qty must be a positive integer");
        }
        DB::connection('inventory')->insert(
            'insert into inventory.stock_moves (event_id, sku, seq, qty, balance, prev_seq, worker_pid)
             select ?, ?, ?, ?, coalesce(last.balance, 0) + ?, last.seq, ?
               from (select 1) one
               left join lateral (select balance, seq from inventory.stock_moves
                                   where sku = ? order by id desc limit 1) last on true',
            [$message->eventId, $message->key, $move['seq'], $move['qty'], $move['qty'], getmypid(),
             $message->key]);
        self::dieHereForTests($message);
    }

    /**
     * t/050 kills one worker inside this listener, after its write and
     * before its commit: OBX_EXAMPLE_DIE_AT names the event, and the file
     * OBX_EXAMPLE_DIE_MARKER makes it happen once.
     */
    private static function dieHereForTests(LandedMessage $message): void
    {
        $marker = getenv('OBX_EXAMPLE_DIE_MARKER');
        if ($message->eventId === getenv('OBX_EXAMPLE_DIE_AT') && $marker && @mkdir($marker)) {
            posix_kill(getmypid(), SIGKILL);
        }
    }
}
