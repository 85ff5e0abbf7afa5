<?php

namespace Obx\Laravel\Tests;

use Illuminate\Support\Facades\DB;
use Obx\Laravel\Facades\Obx;
use Obx\Laravel\Migrations\CreateObxExtension;
use Obx\Laravel\Tests\Fixtures\RecordEffect;

/**
 * obx:work against a real PostgreSQL with obx (TestDatabase).  Messages are
 * landed as obx.land lands them (the test cluster runs no consumer; t/050
 * lands them from Kafka), or by obx.replay_dead_letter, which calls
 * obx.land itself.  The listener is RecordEffect.
 */
class WorkTest extends TestCase
{
    private const TOPIC = 'orders.placed.v1';
    private const CONSUMER = 'php-shop';

    private string $dir;

    protected function obxConfig(): array
    {
        return ['work' => ['consumer' => self::CONSUMER, 'tries' => 3, 'backoff' => [0],
            'listeners' => [self::TOPIC => ['OrderPlaced' => RecordEffect::class, 'Ping' => null]]]];
    }

    protected function databaseConfig(): array
    {
        return ['default' => 'app', 'connections' => ['app' => TestDatabase::connection()]];
    }

    protected function setUp(): void
    {
        parent::setUp();
        (new CreateObxExtension())->up();
        DB::statement('DROP TABLE IF EXISTS work_effects');
        DB::statement('CREATE TABLE work_effects (seq bigserial PRIMARY KEY, event_id text NOT NULL,
            event_key text, n int NOT NULL, prev_seen int, pid int NOT NULL, attempt int NOT NULL)');
        DB::statement('TRUNCATE obx.landed, obx.landed_starts, obx.dead_letters, obx.processed_events');
        DB::statement('DELETE FROM obx.subscriptions');
        Obx::subscribe(self::CONSUMER, [self::TOPIC], 'obx.land');
        $this->dir = sys_get_temp_dir() . '/obx-work-test.' . getmypid();
        @mkdir($this->dir);
        array_map('unlink', glob("$this->dir/*"));
        RecordEffect::$failDir = $this->dir;
    }

    protected function tearDown(): void
    {
        array_map('unlink', glob("$this->dir/*"));
        @rmdir($this->dir);
        parent::tearDown();
    }

    /** Lands messages as obx.land would: [key, n, payload extras, event type]. */
    private function land(array $messages): void
    {
        static $offset = 0;
        foreach ($messages as [$key, $n, $extra, $type]) {
            $offset++;
            DB::insert('insert into obx.landed (consumer_name, event_id, event_type, topic, kafka_partition,
                          kafka_offset, event_key, headers, payload)
                        values (?, ?, ?, ?, 0, ?, ?, ?::jsonb, ?::jsonb)',
                [self::CONSUMER, "evt-$key-$n", $type ?? 'OrderPlaced', self::TOPIC, $offset, $key,
                 json_encode(['event_id' => "evt-$key-$n"]), json_encode(['n' => $n] + ($extra ?? []))]);
        }
    }

    /** An obx:work process of the consumer (Fixtures/work.php), its output in out and err. */
    private function worker(array $args)
    {
        return proc_open(array_merge(['php', __DIR__ . '/Fixtures/work.php', 'obx:work', self::CONSUMER], $args),
            [0 => ['file', '/dev/null', 'r'], 1 => ['file', "$this->dir/out", 'w'],
             2 => ['file', "$this->dir/err", 'w']], $pipes, null,
            ['OBX_WORK_TEST_DB' => json_encode(TestDatabase::connection()), 'PATH' => getenv('PATH')]);
    }

    /** The effects, once there are $n of them or $seconds have passed. */
    private function awaitEffects(int $n, float $seconds): array
    {
        $until = microtime(true) + $seconds;
        while (count($this->effects()) < $n && microtime(true) < $until) {
            usleep(20000);
        }
        return $this->effects();
    }

    private function effects(): array
    {
        return array_map(fn ($r) => "$r->event_id/$r->attempt",
            DB::select('select event_id, attempt from work_effects order by seq'));
    }

    public function testEachMessageRunsItsListenerOnceAndIsCompletedWithItsEffect(): void
    {
        $this->land([['ord_1', 1, null, null], ['ord_2', 1, null, null], ['ord_1', 2, null, null],
                     ['ord_1', 3, null, 'Ping']]);
        [$code, $out] = $this->artisan('obx:work', ['--stop-when-empty' => true]);

        $this->assertSame(0, $code, $out);
        $this->assertSame(['evt-ord_1-1/1', 'evt-ord_2-1/1', 'evt-ord_1-2/1'], $this->effects());
        $this->assertSame(0, (int) DB::selectOne('select count(*) as n from obx.landed')->n);
        $this->assertStringContainsString('orders.placed.v1[0]@', $out);
        $this->assertStringContainsString('SKIPPED', $out, 'a type mapped to null is skipped');
        $this->assertSame(0, (int) DB::selectOne('select count(*) as n from obx.dead_letters')->n);
    }

    public function testAnyJsonValueAndATombstoneReachTheListener(): void
    {
        foreach (['"hello"' => 'ord_s', '[1, 2]' => 'ord_l', null => 'ord_t'] as $payload => $key) {
            DB::insert("insert into obx.landed (consumer_name, event_id, event_type, topic, kafka_partition,
                          kafka_offset, event_key, payload)
                        values (?, ?, 'Ping', ?, 0, 1, ?, ?::jsonb)",
                [self::CONSUMER, "evt-$key", self::TOPIC, $key, $payload === '' ? null : $payload]);
        }
        $this->app->instance('seen', new \ArrayObject());
        $this->app['config']->set('obx.work.listeners', [self::TOPIC => ['Ping' => Fixtures\SeePayload::class]]);
        [$code] = $this->artisan('obx:work', ['--stop-when-empty' => true]);
        $this->assertSame(0, $code);
        $this->assertSame(['evt-ord_s' => 'hello', 'evt-ord_l' => [1, 2], 'evt-ord_t' => null],
            $this->app['seen']->getArrayCopy());
        $this->assertSame(0, (int) DB::selectOne('select count(*) as n from obx.landed')->n);
    }

    public function testAnEventClassIsDispatchedToItsLaravelListenersInTheTransaction(): void
    {
        $this->land([['ord_1', 1, null, null], ['ord_1', 2, null, null]]);
        $this->app['config']->set('obx.work.listeners',
            [self::TOPIC => ['OrderPlaced' => Fixtures\KafkaOrderPlaced::class]]);
        $failed = false;
        $this->app['events']->listen(Fixtures\KafkaOrderPlaced::class,
            function (Fixtures\KafkaOrderPlaced $e) use (&$failed) {
                DB::insert('insert into work_effects (event_id, event_key, n, pid, attempt) values (?, ?, ?, 0, 1)',
                    [$e->eventId, $e->orderId, $e->n]);
                if ($e->n === 2 && !$failed) {
                    $failed = true;
                    throw new \RuntimeException('a listener of the event failed');
                }
            });
        [$code, $out] = $this->artisan('obx:work', ['--stop-when-empty' => true]);

        $this->assertSame(0, $code);
        $this->assertStringContainsString('a listener of the event failed', $out);
        $this->assertSame(['evt-ord_1-1/1', 'evt-ord_1-2/1'], $this->effects(),
            'the failed listener\'s write rolled back with the message; the retry wrote once');
    }

    /**
     * An event class that no Laravel listener listens to (a typo in the
     * mapping or the listener's registration) is no success: the message
     * is dead-lettered at once with the reason, and its key goes on.
     */
    public function testAnEventClassWithoutListenersIsDeadLetteredAtOnce(): void
    {
        $this->land([['ord_1', 1, null, null], ['ord_1', 2, null, 'Ping']]);
        $this->app['config']->set('obx.work.listeners',
            [self::TOPIC => ['OrderPlaced' => Fixtures\KafkaOrderPlaced::class, 'Ping' => RecordEffect::class]]);
        [$code, $out] = $this->artisan('obx:work', ['--stop-when-empty' => true]);

        $this->assertSame(0, $code, $out);
        $this->assertSame(['evt-ord_1-2/1'], $this->effects());
        $dead = DB::select('select event_id, error_message from obx.dead_letters');
        $this->assertCount(1, $dead);
        $this->assertSame('evt-ord_1-1', $dead[0]->event_id);
        $this->assertStringContainsString('no Laravel listener for the event class', $dead[0]->error_message);
    }

    /**
     * Laravel's conventions, as queue:work keeps them: MessageProcessing
     * before the listener, MessageProcessed after the commit,
     * MessageFailed once a failure is recorded (retry, then dead letter),
     * and every failure reported to the exception handler.
     */
    public function testFailuresAreReportedAndEachMessageFiresItsEvents(): void
    {
        $this->land([['ord_1', 1, null, null], ['ord_2', 1, ['fail' => 'always'], null]]);
        $reported = new \ArrayObject();
        $this->app->instance(\Illuminate\Contracts\Debug\ExceptionHandler::class,
            new class($reported) implements \Illuminate\Contracts\Debug\ExceptionHandler {
                public function __construct(private \ArrayObject $reported)
                {
                }

                public function report(\Throwable $e)
                {
                    $this->reported[] = $e->getMessage();
                }

                public function shouldReport(\Throwable $e)
                {
                    return true;
                }

                public function render($request, \Throwable $e)
                {
                    throw $e;
                }

                public function renderForConsole($output, \Throwable $e)
                {
                }
            });
        $seen = [];
        $this->app['events']->listen(\Obx\Laravel\Work\Events\MessageProcessing::class,
            function ($e) use (&$seen) { $seen[] = "processing {$e->message->eventId}"; });
        $this->app['events']->listen(\Obx\Laravel\Work\Events\MessageProcessed::class,
            function ($e) use (&$seen) { $seen[] = "processed {$e->message->eventId} $e->outcome"; });
        $this->app['events']->listen(\Obx\Laravel\Work\Events\MessageFailed::class,
            function ($e) use (&$seen) {
                $seen[] = "failed {$e->message->eventId} $e->outcome: {$e->exception->getMessage()}";
            });
        $this->artisan('obx:work', ['--stop-when-empty' => true]);

        $this->assertSame([
            'processing evt-ord_1-1', 'processed evt-ord_1-1 done',
            'processing evt-ord_2-1', 'failed evt-ord_2-1 retry: listener refused evt-ord_2-1',
            'processing evt-ord_2-1', 'failed evt-ord_2-1 retry: listener refused evt-ord_2-1',
            'processing evt-ord_2-1', 'failed evt-ord_2-1 dead_letter: listener refused evt-ord_2-1',
        ], $seen);
        $this->assertSame(array_fill(0, 3, 'listener refused evt-ord_2-1'), $reported->getArrayCopy());
    }

    /**
     * The artisan side of consumer dead letters and the obx:work backlog:
     * obx:status --consumers shows what waits for obx:work, obx:dead-letters
     * lists a dead letter, and --replay lands it again for obx:work, which
     * then applies it.
     */
    public function testDeadLettersAreListedAndReplayedAndTheBacklogShown(): void
    {
        $this->land([['ord_1', 1, ['fail' => 'once'], null], ['ord_2', 1, null, null]]);
        [, $out] = $this->artisan('obx:status', ['--consumers' => true]);
        $this->assertMatchesRegularExpression('/\|\s*php-shop\s*\|\s*2\s*\|/', $out,
            'obx:status --consumers shows the 2 messages waiting for obx:work');
        $this->artisan('obx:work', ['--stop-when-empty' => true, '--tries' => '1']);
        $this->assertSame(['evt-ord_2-1/1'], $this->effects(), 'the failing message was dead-lettered');

        [$code, $out] = $this->artisan('obx:dead-letters', ['consumer' => self::CONSUMER]);
        $this->assertSame(0, $code);
        $this->assertStringContainsString('evt-ord_1-1', $out);
        $this->assertStringContainsString('listener refused evt-ord_1-1', $out);

        [$code, $out] = $this->artisan('obx:dead-letters', ['consumer' => self::CONSUMER, '--replay' => true]);
        $this->assertSame(0, $code, $out);
        $this->assertMatchesRegularExpression('/\|\s*1\s*\|/', $out, 'one dead letter replayed');
        $this->artisan('obx:work', ['--stop-when-empty' => true]);
        $this->assertSame(['evt-ord_2-1/1', 'evt-ord_1-1/1'], $this->effects(),
            'the replayed message ran once its listener no longer fails');
        [, $out] = $this->artisan('obx:dead-letters', ['consumer' => self::CONSUMER]);
        $this->assertStringNotContainsString('evt-ord_1-1', $out, 'a replayed dead letter is no longer listed');
    }

    public function testOnceAndMaxJobsStopEarly(): void
    {
        $this->land([['ord_1', 1, null, null], ['ord_2', 1, null, null], ['ord_3', 1, null, null]]);
        $this->artisan('obx:work', ['--once' => true]);
        $this->assertCount(1, $this->effects());
        $this->artisan('obx:work', ['--max-jobs' => 1, '--sleep' => 0]);
        $this->assertCount(2, $this->effects());
        $this->artisan('obx:work', ['consumer' => self::CONSUMER, '--stop-when-empty' => true]);
        $this->assertCount(3, $this->effects());
    }

    public function testAFailingListenerRollsBackItsEffectRetriesThenDeadLettersAndItsKeyWaits(): void
    {
        $this->land([['ord_1', 1, ['fail' => 'once'], null], ['ord_1', 2, ['fail' => 'always'], null],
                     ['ord_1', 3, null, null], ['ord_2', 1, null, null]]);
        [$code, $out] = $this->artisan('obx:work', ['--stop-when-empty' => true]);

        $this->assertSame(0, $code);
        // Each failed attempt's effect rolled back; ord_1 in order, 2 dead-lettered after 3 tries.
        $this->assertSame(['evt-ord_1-1/2', 'evt-ord_1-3/1', 'evt-ord_2-1/1'], $this->effects());
        $this->assertStringContainsString('FAILED, will retry', $out);
        $this->assertStringContainsString('FAILED, dead-lettered', $out);
        $dead = DB::select('select event_id, event_key, error_class, error_message, replayed_at
                              from obx.dead_letters');
        $this->assertCount(1, $dead);
        $this->assertSame(['evt-ord_1-2', 'ord_1', 'handler'],
            [$dead[0]->event_id, $dead[0]->event_key, $dead[0]->error_class]);
        $this->assertStringContainsString('RuntimeException: listener refused evt-ord_1-2 (listener '
            . RecordEffect::class . ') (attempt 3 of max_attempts 3)', $dead[0]->error_message);

        // obx.replay_dead_letter lands it again (obx.land, as the subscription's handler).
        DB::update("update obx.dead_letters set payload = payload - 'fail'");
        $this->assertSame(1, (int) DB::selectOne('select obx.replay_dead_letter(?) as n', [self::CONSUMER])->n);
        $this->assertSame(1, (int) DB::selectOne('select count(*) as n from obx.landed')->n);
        $this->artisan('obx:work', ['--stop-when-empty' => true]);
        $this->assertSame(['evt-ord_1-1/2', 'evt-ord_1-3/1', 'evt-ord_2-1/1', 'evt-ord_1-2/1'], $this->effects());
    }

    public function testABackingOffMessageHoldsItsKeyOnly(): void
    {
        $this->land([['ord_1', 1, ['fail' => 'once'], null], ['ord_1', 2, null, null], ['ord_2', 1, null, null]]);
        $this->artisan('obx:work', ['--stop-when-empty' => true, '--backoff' => '3600']);
        $this->assertSame(['evt-ord_2-1/1'], $this->effects(), 'ord_1 waits for its first message');
        $this->assertSame(['evt-ord_1-1', 'evt-ord_1-2'], array_column(
            DB::select('select event_id from obx.landed order by id'), 'event_id'));
    }

    public function testAnUnmappedMessageIsDeadLetteredAtOnce(): void
    {
        $this->land([['ord_1', 1, null, 'OrderCancelled'], ['ord_1', 2, null, null]]);
        $this->artisan('obx:work', ['--stop-when-empty' => true]);
        $this->assertSame(['evt-ord_1-2/1'], $this->effects());
        $this->assertStringContainsString('no obx:work listener for event type "OrderCancelled"',
            DB::selectOne('select error_message from obx.dead_letters')->error_message);
    }

    /**
     * A payload nested as deep as PHP's JSON parser goes (600 levels)
     * reaches its listener; one nested deeper (5,000 levels: valid jsonb,
     * which PHP cannot decode) is dead-lettered at once, with the reason,
     * and never stops the worker: the next message of its key runs.
     */
    public function testAPayloadPhpCannotDecodeIsDeadLetteredAtOnceAndItsKeyGoesOn(): void
    {
        foreach ([['ord_1', 1, 5000], ['ord_1', 2, 1], ['ord_2', 1, 600]] as [$key, $n, $depth]) {
            DB::insert("insert into obx.landed (consumer_name, event_id, event_type, topic, kafka_partition,
                          kafka_offset, event_key, payload)
                        values (?, ?, 'OrderPlaced', ?, 0, ?, ?,
                                ('{\"n\": ' || ? || ', \"deep\": ' || repeat('[', ?) || repeat(']', ?) || '}')::jsonb)",
                [self::CONSUMER, "evt-$key-$n", self::TOPIC, $n, $key, $n, $depth, $depth]);
        }
        [$code, $out] = $this->artisan('obx:work', ['--stop-when-empty' => true]);

        $this->assertSame(0, $code, $out);
        $this->assertEqualsCanonicalizing(['evt-ord_1-2/1', 'evt-ord_2-1/1'], $this->effects());
        $dead = DB::select('select event_id, error_message from obx.dead_letters');
        $this->assertCount(1, $dead);
        $this->assertSame('evt-ord_1-1', $dead[0]->event_id);
        $this->assertStringContainsString('could not be decoded as JSON by PHP', $dead[0]->error_message);
        $this->assertSame(0, (int) DB::selectOne('select count(*) as n from obx.landed')->n);
    }

    /**
     * A message whose listener kills its worker every time: each death
     * counts as an attempt (obx.start_landed, on another connection), and
     * at the last try it is dead-lettered without running again; its key
     * goes on.
     */
    public function testAMessageThatKillsItsWorkerEveryTimeIsDeadLettered(): void
    {
        $this->land([['ord_1', 1, ['kill' => 'always'], null], ['ord_1', 2, null, null]]);
        $env = ['OBX_WORK_TEST_DB' => json_encode(TestDatabase::connection()), 'OBX_WORK_TEST_DIR' => $this->dir,
                'PATH' => getenv('PATH')];
        $ends = [];
        for ($i = 0; $i < 3; $i++) {
            $proc = proc_open(['php', __DIR__ . '/Fixtures/work.php', 'obx:work', self::CONSUMER, '--tries=2',
                               '--stop-when-empty'],
                [0 => ['file', '/dev/null', 'r'], 1 => ['file', "$this->dir/out$i", 'w'],
                 2 => ['file', "$this->dir/err$i", 'w']], $pipes, null, $env);
            do {
                usleep(20000);
                $status = proc_get_status($proc);
            } while ($status['running']);
            proc_close($proc);
            $ends[] = $status['signaled'] ? 'signal ' . $status['termsig'] : 'exit ' . $status['exitcode'];
        }
        $this->assertSame(['signal 9', 'signal 9', 'exit 0'], $ends, 'two deaths, then the third run goes on');
        $this->assertSame(['evt-ord_1-2/1'], $this->effects(), 'the killer left no effect; its key went on');
        $dead = DB::selectOne('select event_id, error_message from obx.dead_letters');
        $this->assertSame('evt-ord_1-1', $dead->event_id);
        $this->assertStringContainsString('the obx:work process died while running this message (2 of 2 starts',
            $dead->error_message);
        $this->assertSame(0, (int) DB::selectOne('select count(*) as n from obx.landed_starts')->n);
    }

    /**
     * A worker with nothing to do waits --sleep seconds, but a landing
     * (here by obx.replay_dead_letter, which calls obx.land) wakes it at
     * once: obx._land notifies the consumer's channel at commit.
     */
    public function testALandingWakesAWaitingWorker(): void
    {
        $this->land([['ord_1', 1, null, null]]);
        DB::insert("insert into obx.dead_letters (consumer_name, event_id, event_type, topic, kafka_partition,
                      kafka_offset, event_key, payload, error_class, error_message)
                    values (?, 'evt-ord_1-2', 'OrderPlaced', ?, 0, 999, 'ord_1', '{\"n\": 2}', 'handler', 'x')",
            [self::CONSUMER, self::TOPIC]);
        $proc = $this->worker(['--sleep=60', '--max-jobs=2']);
        try {
            $this->assertSame(['evt-ord_1-1/1'], $this->awaitEffects(1, 30), 'the worker runs, then waits');
            usleep(300000);
            $landed = microtime(true);
            $this->assertSame(1, (int) DB::selectOne('select obx.replay_dead_letter(?) as n', [self::CONSUMER])->n);
            while (count($this->effects()) < 2 && microtime(true) < $landed + 5) {
                usleep(20000);
            }
            $this->assertSame(['evt-ord_1-1/1', 'evt-ord_1-2/1'], $this->effects(),
                'the landed message ran within 5 s, not after --sleep=60');
            while (proc_get_status($proc)['running'] && microtime(true) < $landed + 10) {
                usleep(20000);
            }
            $this->assertFalse(proc_get_status($proc)['running'], '--max-jobs=2: it exits after two messages');
        } finally {
            if (proc_get_status($proc)['running']) {
                posix_kill(proc_get_status($proc)['pid'], SIGTERM);
            }
            proc_close($proc);
        }
    }

    /**
     * A database restart under a running obx:work (waiting for landings,
     * with --sleep=60): it reconnects, LISTENs again, and a message landed
     * after the restart runs at once; the process never exits.
     */
    public function testAWorkerOutlivesADatabaseRestartAndListensAgain(): void
    {
        $this->land([['ord_1', 1, null, null]]);
        $proc = $this->worker(['--sleep=60']);
        try {
            $this->assertSame(['evt-ord_1-1/1'], $this->awaitEffects(1, 30), 'the worker runs, then waits');
            TestDatabase::restart();
            DB::reconnect();
            $until = microtime(true) + 30;
            while (!str_contains((string) @file_get_contents("$this->dir/out"), 'reconnected')
                   && microtime(true) < $until) {
                usleep(20000);
            }
            $this->assertStringContainsString('reconnected', file_get_contents("$this->dir/out"),
                'the worker reconnected: ' . file_get_contents("$this->dir/err"));
            $this->land([['ord_1', 2, null, null]]);
            DB::statement('NOTIFY obx_landed_' . md5(self::CONSUMER));   // as obx._land notifies
            $this->assertSame(['evt-ord_1-1/1', 'evt-ord_1-2/1'], $this->awaitEffects(2, 10),
                'a message landed after the restart ran within 10 s, not after --sleep=60');
            $this->assertTrue(proc_get_status($proc)['running'], 'the worker is still running');
        } finally {
            if (proc_get_status($proc)['running']) {
                posix_kill(proc_get_status($proc)['pid'], SIGTERM);
            }
            proc_close($proc);
        }
    }

    /**
     * Three obx:work processes on 120 messages of 2 keys: one is killed
     * (SIGKILL) inside a listener, after writing its effect; the others
     * stop on SIGTERM once everything is done.  Every message's effect is
     * there once, and each key's effects ran one after another, in order:
     * every effect saw its key's previous one committed (prev_seen = n - 1).
     */
    public function testSeveralWorkersKeepPerKeyOrderAndAKilledOneLosesNothing(): void
    {
        $keys = 2;      // fewer keys than workers: a worker finds a busy key's later messages
        $each = 60;
        $messages = [];
        for ($n = 1; $n <= $each; $n++) {
            for ($k = 1; $k <= $keys; $k++) {
                $extra = ['sleep_ms' => 2];
                if ($k === 2 && $n === 5) {
                    $extra['kill'] = true;
                }
                $messages[] = ["ord_$k", $n, $extra, null];
            }
        }
        $this->land($messages);

        $env = ['OBX_WORK_TEST_DB' => json_encode(TestDatabase::connection()), 'OBX_WORK_TEST_DIR' => $this->dir,
                'PATH' => getenv('PATH')];
        $procs = [];
        for ($i = 0; $i < 3; $i++) {
            $procs[] = proc_open(['php', __DIR__ . '/Fixtures/work.php', 'obx:work', self::CONSUMER, '--sleep=0.05'],
                [0 => ['file', '/dev/null', 'r'], 1 => ['file', "$this->dir/out$i", 'w'],
                 2 => ['file', "$this->dir/err$i", 'w']], $pipes, null, $env);
        }
        $deadline = time() + 120;
        while ((int) DB::selectOne('select count(*) as n from obx.landed')->n > 0 && time() < $deadline) {
            usleep(100000);
        }
        $statuses = [];
        foreach ($procs as $i => $proc) {
            // proc_get_status tells the exit status once: keep the first "not running".
            $status = proc_get_status($proc);
            if ($status['running']) {
                posix_kill($status['pid'], SIGTERM);
            }
            while ($status['running']) {
                usleep(20000);
                $status = proc_get_status($proc);
            }
            $statuses[] = $status['signaled'] ? 'signal ' . $status['termsig'] : 'exit ' . $status['exitcode'];
            if ($status['signaled']) {
                $killed = $status['pid'];
            }
            proc_close($proc);
        }
        sort($statuses);

        $this->assertSame(0, (int) DB::selectOne('select count(*) as n from obx.landed')->n, 'all completed');
        $this->assertSame(['exit 0', 'exit 0', 'signal 9'], $statuses,
            'one worker was killed in its listener; the others stopped on SIGTERM');
        $this->assertFileExists("$this->dir/evt-ord_2-5");
        $rows = DB::select('select event_id, count(*) as n from work_effects group by event_id having count(*) <> 1');
        $this->assertSame([], $rows, 'every effect once: the killed listener\'s write rolled back');
        $this->assertSame($keys * $each, (int) DB::selectOne('select count(*) as n from work_effects')->n);
        $this->assertSame(0, (int) DB::selectOne(
            'select count(*) as n from work_effects where prev_seen is distinct from nullif(n - 1, 0)')->n,
            'per key, each message ran after the previous one committed');
        $this->assertSame(0, (int) DB::selectOne('select count(*) as n from (
            select n, lag(n) over (partition by event_key order by seq) as before from work_effects) x
            where before is not null and before <> n - 1')->n, 'per key, in landing order');
        $this->assertGreaterThanOrEqual(2, (int) DB::selectOne(
            'select count(distinct pid) as n from work_effects')->n, 'the workers shared the messages');
        $this->assertNotEquals($killed, (int) DB::selectOne(
            "select pid from work_effects where event_id = 'evt-ord_2-5'")->pid,
            'the killed worker\'s effect rolled back; another worker ran the message again');
        $this->assertSame(2, (int) DB::selectOne(
            "select attempt from work_effects where event_id = 'evt-ord_2-5'")->attempt,
            'the killed start counted as the first attempt');
    }
}
