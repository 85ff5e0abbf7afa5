<?php

namespace App\Console\Commands;

use App\Actions\PlaceOrder;
use App\Exceptions\PaymentDeclined;
use App\Models\Order;
use App\Support\LostConnection;
use Illuminate\Console\Command;
use Illuminate\Database\DatabaseManager;
use Illuminate\Support\Str;
use RuntimeException;
use Throwable;

/**
 * Places random orders, one transaction each, and prints one line per order
 * on stdout:  <committed|rolled_back> TAB <order id> TAB <event id>.
 *
 * If the connection is lost (a server restart, crash recovery), the order's
 * fate is looked up once the database answers again: found, it committed;
 * not found, it is placed again with the same order id and event id.  So
 * every line tells the truth, and no order is placed twice.
 */
class PlaceOrders extends Command
{
    protected $signature = 'place-orders
        {--count=10 : how many orders to place}
        {--rollback-every=0 : decline the payment of every K-th order after its event is enqueued, rolling it back (0: never)}
        {--schema-version= : OrderPlaced schemaVersion to emit, 1 or 2 (default: config shop.schema_version)}
        {--pause-ms=0 : pause between two orders}
        {--hold-after=0 : after this many orders, wait until the --resume-file exists (0: never)}
        {--resume-file= : the file whose existence ends the hold}';

    protected $description = 'Place orders, each saved with its OrderPlaced event in one transaction';

    private const RECONNECT_FOR_SECONDS = 120;
    private const HOLD_FOR_SECONDS = 300;

    public function handle(DatabaseManager $db): int
    {
        $count = (int) $this->option('count');
        $every = (int) $this->option('rollback-every');
        $version = (int) ($this->option('schema-version') ?? config('shop.schema_version'));
        $pause = (int) $this->option('pause-ms');
        $holdAfter = (int) $this->option('hold-after');
        $resumeFile = (string) $this->option('resume-file');
        if ($holdAfter > 0 && $resumeFile === '') {
            $this->error('--hold-after needs --resume-file');
            return 1;
        }
        $place = new PlaceOrder(config('shop.orders_topic'), $version);

        for ($i = 1; $i <= $count; $i++) {
            $data = $this->randomOrder($version);
            $eventId = (string) Str::orderedUuid();
            $decline = $every > 0 && $i % $every === 0;

            $outcome = $this->placeOnce($db, $place, $data, $eventId, $decline);
            $this->line("$outcome\t{$data['id']}\t$eventId");

            if ($pause > 0) {
                usleep($pause * 1000);
            }
            if ($i === $holdAfter) {
                $this->holdUntilExists($resumeFile);
            }
        }
        return 0;
    }

    /**
     * Places the order, retrying across lost connections; returns
     * 'committed' or 'rolled_back'.
     */
    private function placeOnce(DatabaseManager $db, PlaceOrder $place, array $data,
                               string $eventId, bool $decline): string
    {
        $declinePayment = $decline
            ? function (Order $order) {
                throw new PaymentDeclined("payment for order {$order->id} declined");
            }
            : null;
        $deadline = microtime(true) + self::RECONNECT_FOR_SECONDS;

        while (true) {
            try {
                $place($data, $eventId, $declinePayment);
                return 'committed';
            } catch (PaymentDeclined $e) {
                return 'rolled_back';
            } catch (Throwable $e) {
                if (!LostConnection::causedBy($e) || microtime(true) > $deadline) {
                    throw $e;
                }
                $this->stderr("order {$data['id']}: connection lost ({$this->firstLine($e)}), looking it up");
            }

            // Did the lost transaction commit?  Ask once the database is back.
            if ($this->committedAfterReconnect($db, $data['id'], $deadline)) {
                $this->stderr("order {$data['id']}: had committed");
                return 'committed';
            }
            $this->stderr("order {$data['id']}: had not committed, placing it again");
        }
    }

    private function committedAfterReconnect(DatabaseManager $db, string $orderId, float $deadline): bool
    {
        for ($wait = 50_000; ; $wait = min(2 * $wait, 1_000_000)) {
            // A fresh Connection: the old one may think a transaction is open.
            $db->purge('shop');
            usleep($wait);
            try {
                return Order::whereKey($orderId)->exists();
            } catch (Throwable $e) {
                if (!LostConnection::causedBy($e) || microtime(true) > $deadline) {
                    throw $e;
                }
            }
        }
    }

    /**
     * Waits until $file exists, so that a test can act while every producer
     * is part-way through its orders; gives up after HOLD_FOR_SECONDS.
     */
    private function holdUntilExists(string $file): void
    {
        $deadline = microtime(true) + self::HOLD_FOR_SECONDS;
        clearstatcache();
        while (!file_exists($file)) {
            if (microtime(true) > $deadline) {
                throw new RuntimeException("$file did not appear within " . self::HOLD_FOR_SECONDS . ' s');
            }
            usleep(20_000);
            clearstatcache();
        }
    }

    /** A customer buys 1 to 3 different skus, 1 to 5 of each. */
    private function randomOrder(int $version): array
    {
        $catalog = config('shop.catalog');
        $skus = array_rand($catalog, random_int(1, 3));
        $lines = [];
        foreach ((array) $skus as $sku) {
            $lines[] = ['sku' => $sku, 'qty' => random_int(1, 5), 'unit_price_minor' => $catalog[$sku]];
        }
        $warehouses = array_merge([null], config('shop.warehouses'));

        return [
            'id' => 'ord_' . bin2hex(random_bytes(6)),
            'customer_id' => 'cus_' . random_int(1, 500),
            'currency' => config('shop.currency'),
            // Only schemaVersion 2 carries the customer's pick of warehouse.
            'warehouse' => $version >= 2 ? $warehouses[array_rand($warehouses)] : null,
            'lines' => $lines,
        ];
    }

    private function firstLine(Throwable $e): string
    {
        return strtok($e->getMessage(), "\n");
    }

    private function stderr(string $message): void
    {
        fwrite(STDERR, "place-orders: $message\n");
    }
}
