<?php

namespace Obx\Laravel\Tests;

use Illuminate\Support\Facades\DB;
use Illuminate\Support\Facades\Schema;
use Obx\Laravel\Exceptions\InvalidEvent;
use Obx\Laravel\Exceptions\NotInTransaction;
use Obx\Laravel\Facades\Obx;
use Obx\Laravel\Migrations\CreateObxExtension;
use Obx\Laravel\Tests\Fixtures\OrderPlaced;
use RuntimeException;

/**
 * The facade, the listener and the commands against a real PostgreSQL with
 * obx (TestDatabase): what lands in obx.outbox_events, and what does not.
 */
class DatabaseTest extends TestCase
{
    private const TOPIC = 'orders.placed.v1';

    private static bool $migrated = false;

    protected function databaseConfig(): array
    {
        return ['default' => 'app', 'connections' => ['app' => TestDatabase::connection()]];
    }

    protected function setUp(): void
    {
        parent::setUp();
        if (!self::$migrated) {
            // twice: CREATE EXTENSION IF NOT EXISTS
            (new CreateObxExtension())->up();
            (new CreateObxExtension('app'))->up();
            self::$migrated = true;
        }
        DB::statement('TRUNCATE obx.events, obx.claims, obx.records, obx.published_counts, obx.event_states,'
            . ' obx.processed_events');
    }

    public function testEnqueueStoresTheEventInTheOutbox(): void
    {
        $hostile = "x'); DELETE FROM obx.outbox_events; --";
        $id = Obx::enqueue(self::TOPIC, 'ord_1', ['orderId' => 'ord_1', 'note' => $hostile, 'total' => 12.0],
            type: 'OrderPlaced', headers: ['trace_id' => 'a1b2']);
        $given = Obx::enqueue(self::TOPIC, $hostile, ['orderId' => 'ord_2'],
            id: '0190f5c2-8a4e-7cc1-9b7e-2f0d5e6a1c33');

        $this->assertSame('0190f5c2-8a4e-7cc1-9b7e-2f0d5e6a1c33', $given);
        $rows = DB::select('select id::text, topic, event_key, payload::text, event_type, headers::text
                              from obx.outbox_events order by seq');
        $this->assertEquals([
            (object) ['id' => $id, 'topic' => self::TOPIC, 'event_key' => 'ord_1',
                      'payload' => DB::selectOne('select ?::jsonb::text as t', [json_encode(
                          ['orderId' => 'ord_1', 'note' => $hostile, 'total' => 12.0], JSON_PRESERVE_ZERO_FRACTION)])->t,
                      'event_type' => 'OrderPlaced', 'headers' => '{"trace_id": "a1b2"}'],
            (object) ['id' => $given, 'topic' => self::TOPIC, 'event_key' => $hostile,
                      'payload' => '{"orderId": "ord_2"}', 'event_type' => null, 'headers' => null],
        ], $rows);
    }

    public function testMigrateFreshKeepsTheExtension(): void
    {
        DB::statement('CREATE TABLE IF NOT EXISTS app_table (id int)');
        Schema::dropAllTables();          // what migrate:fresh, and so RefreshDatabase, does first
        $this->assertSame(0, (int) DB::selectOne(
            "select count(*) as n from pg_tables where schemaname = 'public' and tablename = 'app_table'")->n);
        (new CreateObxExtension())->up();
        $this->assertMatchesRegularExpression('/^[0-9a-f-]{36}$/', Obx::enqueue(self::TOPIC, 'ord_1', ['n' => 1]));
        $this->assertSame(1, $this->count_());
    }

    public function testARolledBackTransactionEnqueuesNothing(): void
    {
        $inside = null;
        try {
            DB::transaction(function () use (&$inside) {
                $inside = Obx::enqueue(self::TOPIC, 'ord_1', ['orderId' => 'ord_1']);
                $this->assertSame(1, $this->count_($inside), 'visible inside the transaction');
                throw new RuntimeException('payment declined');
            });
            $this->fail('the transaction did not throw');
        } catch (RuntimeException $e) {
            $this->assertSame('payment declined', $e->getMessage());
        }
        $this->assertNotNull($inside);
        $this->assertSame(0, $this->count_($inside));
        $this->assertSame(0, $this->count_());

        $kept = DB::transaction(fn () => Obx::enqueue(self::TOPIC, 'ord_2', ['orderId' => 'ord_2']));
        $this->assertSame(1, $this->count_($kept));
    }

    public function testTheCurrentOpenTelemetrySpanGoesWithTheEvent(): void
    {
        require_once __DIR__ . '/Fixtures/OpenTelemetry/Span.php';
        $span = \OpenTelemetry\API\Trace\Span::class;
        $context = \OpenTelemetry\API\Trace\SpanContext::class;
        try {
            $span::$current = null;     // no span: no header
            $none = Obx::enqueue(self::TOPIC, 'ord_1', ['n' => 1]);
            $span::$current = new $context('4bf92f3577b34da6a3ce929d0e0e4736', '00f067aa0ba902b7', true,
                'congo=t61rcWkgMzE');
            $traced = Obx::enqueue(self::TOPIC, 'ord_1', ['n' => 2], headers: ['x' => 'y']);
            $mine = Obx::enqueue(self::TOPIC, 'ord_1', ['n' => 3], headers: [
                'traceparent' => '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00']);
            $many = Obx::enqueueMany(self::TOPIC, ['ord_2'], [['n' => 4]]);
            $span::$current = new $context('0af7651916cd43dd8448eb211c80319c', 'b7ad6b7169203331', false);
            $unsampled = Obx::enqueue(self::TOPIC, 'ord_1', ['n' => 5]);
        } finally {
            $span::$current = null;
        }
        $headers = fn (string $id) => DB::selectOne('select headers::text as h from obx.outbox_events where id = ?::uuid',
            [$id])->h;
        $this->assertNull($headers($none));
        $this->assertSame('{"x": "y", "tracestate": "congo=t61rcWkgMzE", '
            . '"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}', $headers($traced));
        $this->assertSame('{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"}',
            $headers($mine), 'the caller\'s traceparent wins');
        $this->assertSame('{"tracestate": "congo=t61rcWkgMzE", '
            . '"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}', $headers($many[0]));
        $this->assertSame('{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"}',
            $headers($unsampled));
    }

    public function testARefusedPayloadRunsNoSql(): void
    {
        DB::enableQueryLog();
        foreach (['{"orderId": "ord_1"}', [1, 2, 3], 7, null, new \stdClass()] as $payload) {
            try {
                Obx::enqueue(self::TOPIC, 'ord_1', $payload);
                $this->fail('payload accepted: ' . var_export($payload, true));
            } catch (InvalidEvent $e) {
                $this->assertStringContainsString('obx event payload must', $e->getMessage());
            }
        }
        $this->assertSame([], DB::getQueryLog());
        $this->assertSame(0, $this->count_());

        // obx's own checks still stand behind the package's
        $this->expectExceptionMessage('obx topic name must not be empty');
        Obx::enqueue('', 'ord_1', ['orderId' => 'ord_1']);
    }

    public function testPayloadsJsonbCannotHoldAreRefusedBeforeSql(): void
    {
        $model = new class extends \Illuminate\Database\Eloquent\Model {
            protected $guarded = [];
        };
        $model->fill(['id' => 7, 'password' => 'secret']);
        DB::enableQueryLog();
        foreach ([
            [$model, [], 'got the model'],
            [['note' => "a\0b"], [], 'payload contains a NUL character'],
            [['ok' => 1], ['trace' => "x\0"], 'headers contains a NUL character'],
        ] as [$payload, $headers, $message]) {
            try {
                Obx::enqueue(self::TOPIC, 'ord_1', $payload, headers: $headers);
                $this->fail("accepted: $message");
            } catch (InvalidEvent $e) {
                $this->assertStringContainsString($message, $e->getMessage());
            }
        }
        $this->assertSame([], DB::getQueryLog());

        // A backslash followed by "u0000" is text, not a NUL: stored as given.
        $id = DB::transaction(fn () => Obx::enqueue(self::TOPIC, 'ord_1',
            ['note' => '\u0000', 'model' => $model->only(['id'])]));
        $this->assertSame('{"note": "\\\\u0000", "model": {"id": 7}}', DB::selectOne(
            'select payload::text as p from obx.outbox_events where id = ?::uuid', [$id])->p);
    }

    public function testANonPostgresConnectionIsRefusedClearly(): void
    {
        $this->app['config']->set('database.connections.legacy', ['driver' => 'mysql', 'database' => 'shop']);
        $this->expectException(\LogicException::class);
        $this->expectExceptionMessage('obx needs a PostgreSQL connection, and connection "legacy" uses mysql');
        Obx::connection('legacy')->enqueue(self::TOPIC, 'ord_1', ['orderId' => 'ord_1']);
    }

    public function testProcessOnceAppliesAnEffectOncePerEvent(): void
    {
        DB::statement('CREATE TABLE IF NOT EXISTS public.invoices (event_id text)');
        DB::statement('TRUNCATE public.invoices');
        $invoice = fn (string $id) => fn () => DB::insert('insert into public.invoices values (?)', [$id]);
        $invoices = fn () => array_column(DB::select('select event_id from public.invoices order by 1'), 'event_id');

        try {
            Obx::markProcessed('billing', 'ev-1');
            $this->fail('markProcessed outside a transaction was accepted');
        } catch (NotInTransaction $e) {
            $this->assertStringContainsString('outside a database transaction', $e->getMessage());
        }
        $this->assertSame(0, (int) DB::selectOne('select count(*) as n from obx.processed_events')->n,
            'and it marked nothing');

        $this->assertTrue(Obx::processOnce('billing', 'ev-1', $invoice('ev-1')));
        $this->assertFalse(Obx::processOnce('billing', 'ev-1', $invoice('ev-1')), 'a redelivery');
        $this->assertTrue(Obx::processOnce('audit', 'ev-1', fn () => null), 'another consumer');

        try {
            Obx::processOnce('billing', 'ev-2', function () use ($invoice) {
                $invoice('ev-2')();
                throw new RuntimeException('card declined');
            });
            $this->fail('the effect did not throw');
        } catch (RuntimeException $e) {
            $this->assertSame('card declined', $e->getMessage());
        }
        $this->assertSame(['ev-1'], $invoices(), 'the failed effect was rolled back');
        $this->assertTrue(Obx::processOnce('billing', 'ev-2', $invoice('ev-2')), 'with its mark');

        DB::transaction(function () {
            $this->assertTrue(Obx::markProcessed('billing', 'ev-3'));
            $this->assertFalse(Obx::markProcessed('billing', 'ev-3'));
        });
        $this->assertSame(['ev-1', 'ev-2'], $invoices());
    }

    public function testAnEventDispatchedInATransactionIsEnqueuedInIt(): void
    {
        $committed = '0190f5c2-8a4e-7cc1-9b7e-000000000001';
        $rolledBack = '0190f5c2-8a4e-7cc1-9b7e-000000000002';
        DB::transaction(function () use ($committed) {
            event(new OrderPlaced('ord_1', 990, $committed));
            $this->assertSame(1, $this->count_($committed), 'enqueued by the listener, in the transaction');
        });
        try {
            DB::transaction(function () use ($rolledBack) {
                event(new OrderPlaced('ord_2', 1290, $rolledBack));
                $this->assertSame(1, $this->count_($rolledBack));
                throw new RuntimeException('rolled back');
            });
        } catch (RuntimeException $e) {
        }

        $this->assertEquals([(object) ['id' => $committed, 'event_key' => 'ord_1', 'event_type' => 'OrderPlaced',
                                       'payload' => '{"orderId": "ord_1", "totalMinor": 990}',
                                       'headers' => '{"schema_version": "2"}']],
            DB::select('select id::text, event_key, event_type, payload::text, headers::text
                          from obx.outbox_events'));
    }

    public function testAnEventDispatchedOutsideATransactionIsRefused(): void
    {
        try {
            event(new OrderPlaced('ord_1', 990));
            $this->fail('dispatched outside a transaction, and not refused');
        } catch (NotInTransaction $e) {
            $this->assertStringContainsString('outside a database transaction', $e->getMessage());
        }
        $this->assertSame(0, $this->count_());
    }

    public function testOwnTransactionModeEnqueuesOutsideATransaction(): void
    {
        $this->app = self::makeApp(['outside_transaction' => 'own_transaction'], $this->databaseConfig());
        event(new OrderPlaced('ord_1', 990, '0190f5c2-8a4e-7cc1-9b7e-000000000003'));
        $this->assertSame(1, $this->count_('0190f5c2-8a4e-7cc1-9b7e-000000000003'));
        $this->assertSame(0, DB::transactionLevel());
    }

    public function testEnqueueManyIsAllOrNothing(): void
    {
        $ids = Obx::enqueueMany(self::TOPIC, ['a', 'b', 'c'], [['n' => 1], ['n' => 2], ['n' => 3]], 'Counted');
        $this->assertSame($ids, array_map(fn ($r) => $r->id, DB::select(
            'select id::text from obx.outbox_events order by seq')));

        DB::statement('TRUNCATE obx.events, obx.claims, obx.records, obx.event_states');
        try {
            Obx::enqueueMany(self::TOPIC, ['a', 'b'], [['n' => 1], 'two']);
            $this->fail('a bad payload was accepted');
        } catch (InvalidEvent $e) {
        }
        try {
            Obx::enqueueMany(self::TOPIC, ['a', ''], [['n' => 1], ['n' => 2]]);
            $this->fail('an empty key was accepted');
        } catch (\Illuminate\Database\QueryException $e) {
            $this->assertStringContainsString('obx event key must not be empty', $e->getMessage());
        }
        $this->assertSame(0, $this->count_());
    }

    public function testSubscribeWrapsObxSubscribe(): void
    {
        DB::unprepared('CREATE OR REPLACE FUNCTION public.handle_order(e obx.inbound_event)
                        RETURNS void LANGUAGE plpgsql AS $$ BEGIN END $$');
        Obx::subscribe('billing', ['orders.placed.v1', 'orders.cancelled.v1'], 'public.handle_order',
            ['start' => 'earliest', 'kafka' => ['session.timeout.ms' => '6000']]);
        $this->assertEquals((object) [
            'topics' => '{orders.placed.v1,orders.cancelled.v1}',
            'handler' => 'public.handle_order(obx.inbound_event)',
            'options' => '{"kafka": {"session.timeout.ms": "6000"}, "start": "earliest"}',
        ], DB::selectOne("select topics::text, handler::text, options::text
                            from obx.subscriptions where consumer_name = 'billing'"));
        $this->assertTrue(Obx::unsubscribe('billing'));
        $this->assertFalse(Obx::unsubscribe('billing'));
    }

    public function testTheArtisanCommands(): void
    {
        [$quarantined, $other, $published] = array_map(
            fn ($k) => Obx::enqueue(self::TOPIC, $k, ['k' => $k]), ['q1', 'q2', 'p1']);
        // Quarantined and published, as obx's relay records them (docs/internals.md).
        DB::select('select obx._hold(array[?, ?]::uuid[])', [$quarantined, $other]);
        DB::update("update obx.event_states
                       set quarantined_at = now(), last_error = 'MSG_SIZE_TOO_LARGE: too large',
                           last_error_class = 'permanent'
                     where id = any(array[?, ?]::uuid[])", [$quarantined, $other]);
        DB::insert("insert into obx.records (lease_id, max_seq, ids, partitions, offsets, published_at)
                    select nextval('obx.lease_seq'), seq, array[id], array[0], array[0::bigint], array[now()]
                      from obx.events where id = ?::uuid", [$published]);
        DB::insert("insert into obx.published_counts (generation, topic, published, last_published_at)
                    select currval('obx.lease_seq') >> 40, topic, 1, now()
                      from obx.events where id = ?::uuid", [$published]);

        [$code, $out] = $this->artisan('obx:status');
        $this->assertSame(0, $code);
        $this->assertMatchesRegularExpression('/\| orders\.placed\.v1 \| 0 +\| 0 +\| 1 +\| 2 +\|/', $out);
        $this->assertStringContainsString('| problem', $out);
        [$code, $out] = $this->artisan('obx:status', ['--json' => true]);
        $status = json_decode($out, true, 512, JSON_THROW_ON_ERROR);
        $this->assertSame([self::TOPIC, 0, 1, 2], [$status['topics'][0]['topic'], $status['topics'][0]['pending'],
            $status['topics'][0]['published'], $status['topics'][0]['quarantined']]);
        $this->assertSame('no relay serves this database: obx.workers is 0', $status['topics'][0]['problem']);

        [$code, $out] = $this->artisan('obx:quarantine', ['--topic' => self::TOPIC]);
        $this->assertSame(0, $code);
        $this->assertStringContainsString("| $quarantined | orders.placed.v1 | q1 ", $out);
        $this->assertStringContainsString('MSG_SIZE_TOO_LARGE', $out);
        $this->assertStringNotContainsString($published, $out);

        [$code, $out] = $this->artisan('obx:retry', ['id' => [$quarantined, $published]]);
        $this->assertSame(1, $code, 'one id was not quarantined');
        $this->assertStringContainsString("| $quarantined | retried ", $out);
        $this->assertStringContainsString("| $published | not quarantined", $out);
        $this->assertSame([$other], $this->quarantinedIds());

        [$code, $out] = $this->artisan('obx:skip', ['id' => [$other]]);
        $this->assertSame(2, $code, 'no --reason');
        [$code, $out] = $this->artisan('obx:skip', ['id' => [$other], '--reason' => 'too large for ever']);
        $this->assertSame(0, $code);
        $this->assertStringContainsString("| $other | skipped ", $out);
        $this->assertSame([], $this->quarantinedIds());
        $this->assertSame('too large for ever', DB::selectOne(
            'select skip_reason from obx.skipped_events where id = ?::uuid', [$other])->skip_reason);

        // In production the replay asks first; without an answer nothing is replayed.
        $this->app->instance('env', 'production');
        [$code, $out] = $this->artisan('obx:replay', ['id' => [$published], '--no-interaction' => true]);
        $this->assertSame(1, $code);
        $this->assertSame(1, (int) DB::selectOne('select count(*) as n from obx.outbox_events
                                                   where published_at is not null')->n);
        [$code, $out] = $this->artisan('obx:replay', ['id' => [$published, $quarantined], '--force' => true]);
        $this->assertSame(0, $code);
        $this->assertMatchesRegularExpression('/\| replayed \|\s+\+-+\+\s+\| 1 +\|/', $out);
        $this->assertSame(0, (int) DB::selectOne('select count(*) as n from obx.outbox_events
                                                   where published_at is not null')->n);

        // Every event published again, through its state (docs/internals.md).
        DB::select('select obx._hold(array(select id from obx.outbox_events where published_at is null))');
        DB::update('update obx.event_states set published_at = now(), quarantined_at = null
                     where skipped_at is null');
        [$code, $out] = $this->artisan('obx:replay', ['--topic' => self::TOPIC, '--since' => '-infinity',
                                                     '--force' => true]);
        $this->assertMatchesRegularExpression('/\| 2 +\|/', $out);

        DB::update('update obx.event_states set quarantined_at = now(), published_at = null
                     where skipped_at is null');
        [$code, $out] = $this->artisan('obx:retry', ['--all' => true]);
        $this->assertStringContainsString('2 quarantined event(s)', $out);
        $this->assertSame([], $this->quarantinedIds());
    }

    /** How many outbox rows (with that id), as this session sees them. */
    private function count_(?string $id = null): int
    {
        return (int) DB::selectOne('select count(*) as n from obx.outbox_events where ?::uuid is null or id = ?::uuid',
            [$id, $id])->n;
    }

    private function quarantinedIds(): array
    {
        return array_map(fn ($r) => $r->id, DB::select('select id::text from obx.quarantine order by id'));
    }
}
