<?php

namespace Obx\Laravel;

use Illuminate\Database\ConnectionInterface;
use Illuminate\Database\ConnectionResolverInterface;
use Illuminate\Database\QueryException;
use InvalidArgumentException;
use LogicException;
use Obx\Laravel\Contracts\ShouldPublishToKafka;
use Obx\Laravel\Exceptions\InvalidEvent;
use Obx\Laravel\Exceptions\NotInTransaction;

/**
 * obx's SQL functions for a Laravel connection: the object behind the Obx
 * facade.  Every call is one statement with bound parameters on the
 * connection (config obx.connection, or the default one); enqueue runs in
 * the caller's transaction, if any.  No Kafka client is involved: obx's
 * relay, inside PostgreSQL, publishes after the commit.
 */
class Outbox
{
    public const REFUSE = 'refuse';
    public const OWN_TRANSACTION = 'own_transaction';

    public function __construct(
        protected ?ConnectionResolverInterface $db,
        protected ?string $connection = null,
        protected string $outsideTransaction = self::REFUSE,
    ) {
        if (!in_array($outsideTransaction, [self::REFUSE, self::OWN_TRANSACTION], true)) {
            throw new \InvalidArgumentException(sprintf(
                'obx.outside_transaction must be "%s" or "%s", not "%s"',
                self::REFUSE, self::OWN_TRANSACTION, $outsideTransaction));
        }
    }

    /** The same outbox on another connection (a database of its own). */
    public function connection(?string $name): static
    {
        $clone = clone $this;
        $clone->connection = $name;
        return $clone;
    }

    /**
     * Stores one event in obx.outbox_events, in the connection's current
     * transaction, and returns its id (a uuid).  $id: reuse one to make a
     * retried business action idempotent.  $headers: extra Kafka headers,
     * name => string; the current OpenTelemetry span's traceparent is added
     * when there is one and $headers has none (TraceContext).
     *
     * @param array|\JsonSerializable $payload
     * @throws InvalidEvent before any SQL, for a payload or headers obx would refuse
     */
    public function enqueue(string $topic, string $key, $payload, ?string $type = null,
                            ?string $id = null, array $headers = [], ?string $aggregateId = null): string
    {
        $json = Payload::encode($payload);
        $headersJson = Payload::headers(TraceContext::headers($headers));

        $row = $this->db()->selectOne(
            'select obx.enqueue(topic => ?, event_key => ?, payload => ?::jsonb,
                                aggregate_id => ?, event_type => ?, headers => ?::jsonb,
                                event_id => ?::uuid) as id',
            [$topic, $key, $json, $aggregateId, $type, $headersJson, $id]
        );
        return $row->id;
    }

    /**
     * Enqueues one event per key/payload pair with one call of
     * obx.enqueue_many (one statement: all or nothing), in the connection's
     * current transaction, and returns their ids in order.
     *
     * @param string[] $keys
     * @param array[]|\JsonSerializable[] $payloads
     * @return string[]
     */
    public function enqueueMany(string $topic, array $keys, array $payloads, ?string $type = null,
                                array $headers = []): array
    {
        if (count($keys) !== count($payloads)) {
            throw new InvalidEvent(sprintf('obx enqueueMany needs as many keys as payloads (%d keys, %d payloads)',
                count($keys), count($payloads)));
        }
        $encoded = array_map([Payload::class, 'encode'], array_values($payloads));
        $n = count($encoded);
        $row = $this->db()->selectOne(
            'select pg_catalog.array_to_json(obx.enqueue_many(
                 topic => ?,
                 event_keys => array(select k from pg_catalog.jsonb_array_elements_text(?::jsonb)
                                     with ordinality as t(k, n) order by n),
                 payloads => array(select p from pg_catalog.jsonb_array_elements(?::jsonb)
                                   with ordinality as t(p, n) order by n),
                 event_types => pg_catalog.array_fill(?::text, array[?::int]),
                 headers => pg_catalog.array_fill(?::jsonb, array[?::int])))::text as ids',
            [$topic, json_encode(array_values($keys)), '[' . implode(',', $encoded) . ']',
             $type, $n, Payload::headers(TraceContext::headers($headers)), $n]
        );
        return json_decode($row->ids, true) ?? [];
    }

    /**
     * Enqueues a ShouldPublishToKafka event (what the listener calls).
     * Outside a transaction it throws NotInTransaction, unless
     * obx.outside_transaction is "own_transaction"; dispatched after a
     * commit (AfterCommit) it throws DispatchedAfterCommit in either mode.
     */
    public function publish(ShouldPublishToKafka $event): string
    {
        $enqueue = fn () => $this->enqueue($event->topic(), $event->key(), $event->payload(),
            $event->type(), $event->eventId(), self::eventHeaders($event));

        return $this->inTransactionFor($event) ? $enqueue() : $this->db()->transaction($enqueue);
    }

    /** The event's headers, with schema_version when it has one. */
    protected static function eventHeaders(ShouldPublishToKafka $event): array
    {
        $headers = $event->headers();
        if ($event->schemaVersion() !== null) {
            $headers['schema_version'] = (string) $event->schemaVersion();
        }
        return $headers;
    }

    /**
     * Whether $event can be enqueued in the caller's transaction: true in
     * one, false outside one in "own_transaction" mode; otherwise throws
     * before any SQL, DispatchedAfterCommit for an event dispatched after
     * a commit (it can no longer be atomic with the writes it reports),
     * NotInTransaction for one dispatched outside any transaction.
     */
    protected function inTransactionFor(ShouldPublishToKafka $event): bool
    {
        AfterCommit::refuseDeferredEvent($event);
        if ($this->transactionLevel() > 0) {
            return true;
        }
        AfterCommit::refuseInCallback($event);
        if ($this->outsideTransaction === self::OWN_TRANSACTION) {
            return false;
        }
        throw new NotInTransaction(sprintf(
            'obx event %s dispatched outside a database transaction on connection "%s"; '
            . 'dispatch it inside DB::transaction with the writes it reports '
            . '(or set obx.outside_transaction to "own_transaction")',
            get_class($event), $this->connectionName()));
    }

    /** How many transactions are open on obx's connection. */
    protected function transactionLevel(): int
    {
        return $this->db()->transactionLevel();
    }

    /** The name of obx's connection. */
    protected function connectionName(): string
    {
        return $this->db()->getName();
    }

    /** CREATE EXTENSION IF NOT EXISTS obx (needs a superuser, once per database). */
    public function createExtension(): void
    {
        $this->db()->statement('CREATE EXTENSION IF NOT EXISTS obx');
    }

    /**
     * Installs obx from $sqlFile, the SQL-only install (obx-sql-only.sql,
     * from `make obx-sql-only.sql`) for a PostgreSQL that cannot load obx's
     * library: once per database, as its owner (which needs CREATEROLE if
     * the roles obx_worker and obx_handler_caller do not exist yet).  Inside a transaction, such
     * as a migration's, it runs without the file's BEGIN and COMMIT, which
     * would commit that transaction half way, and is all or nothing with
     * it; outside one the file is its own transaction.
     * PostgreSQL's refusals (obx there already, no CREATEROLE) throw a
     * QueryException and install nothing.
     *
     * @throws InvalidArgumentException before any SQL, for a file that is not that install
     */
    public function install(string $sqlFile): void
    {
        $db = $this->db();
        [$whole, $statements] = self::readSqlOnlyInstall($sqlFile);
        if ($db->transactionLevel() > 0) {
            $db->unprepared($statements);
            return;
        }
        try {
            $db->unprepared($whole);
        } catch (QueryException $e) {
            // An error after the file's BEGIN leaves the session in that
            // transaction, aborted: end it, or every later query fails.
            if ($db->getPdo()->inTransaction()) {
                $db->getPdo()->exec('ROLLBACK');
            }
            throw $e;
        }
    }

    /**
     * The SQL-only install in $sqlFile: the whole file, and its statements
     * between its BEGIN and COMMIT lines.  Checks what tools/gen-sql-only
     * promises: a header comment that names it, BEGIN; as the first line
     * after that, COMMIT; as the last non-empty one (a truncated copy has
     * none).
     *
     * @return array{string, string}
     */
    private static function readSqlOnlyInstall(string $sqlFile): array
    {
        $refuse = fn (string $why) => new InvalidArgumentException("obx install: $sqlFile $why");
        if (!is_file($sqlFile)) {
            throw $refuse(file_exists($sqlFile) ? 'is not a file' : 'does not exist');
        }
        $sql = is_readable($sqlFile) ? file_get_contents($sqlFile) : false;
        if ($sql === false) {
            throw $refuse('is not readable');
        }
        $refuse = fn (string $why) => $refuse("is not obx's SQL-only install as `make obx-sql-only.sql` writes it: $why");
        if (!preg_match('~\A\s*/\*(.*?)\*/\h*\r?\n~s', $sql, $header)
            || !preg_match('/\bobx\b.*\bSQL-only install\b/s', $header[1])) {
            throw $refuse('it does not start with a comment that says "SQL-only install"');
        }
        $rest = substr($sql, strlen($header[0]));
        if (!preg_match('/\A\s*^BEGIN;\h*\r?$/m', $rest, $begin)) {
            throw $refuse('its first statement is not BEGIN;');
        }
        if (!preg_match('/^COMMIT;\s*\z/m', $rest, $commit, PREG_OFFSET_CAPTURE)) {
            throw $refuse('its last line is not COMMIT; (a truncated copy?)');
        }
        $start = strlen($begin[0]);
        return [$sql, substr($rest, $start, $commit[0][1] - $start)];
    }

    /**
     * obx.subscribe: obx's consumer workers call $handler, a function taking
     * one obx.inbound_event ("inventory.reserve_stock" or its full
     * signature), once per new event of $topics, as consumer group
     * $consumer.  $options: start, kafka, retry_sqlstates,
     * handler_timeout_ms, max_attempts (docs/sql.md).
     */
    public function subscribe(string $consumer, array|string $topics, string $handler, array $options = []): void
    {
        if (!str_contains($handler, '(')) {
            $handler .= '(obx.inbound_event)';
        }
        $this->db()->select(
            'select obx.subscribe(?, array(select jsonb_array_elements_text(?::jsonb)),
                                  ?::text::regprocedure, ?::jsonb)',
            [$consumer, json_encode(array_values((array) $topics), JSON_THROW_ON_ERROR), $handler,
             json_encode((object) $options, JSON_THROW_ON_ERROR)]
        );
    }

    /**
     * obx.mark_processed for a hand-written consumer: true the first time
     * $consumer marks $eventId, false for a duplicate.  Only inside a
     * transaction (NotInTransaction otherwise): the mark must commit or roll
     * back with the effect it guards, or a crash between the two loses the
     * effect or applies it twice.  processOnce does both.
     */
    public function markProcessed(string $consumer, string $eventId): bool
    {
        if ($this->transactionLevel() === 0) {
            throw new NotInTransaction(sprintf(
                'obx markProcessed("%s", "%s") outside a database transaction on connection "%s"; '
                . 'call it in the transaction that applies the event, or use processOnce',
                $consumer, $eventId, $this->connectionName()));
        }
        return (bool) $this->db()->selectOne('select obx.mark_processed(?, ?) as new', [$consumer, $eventId])->new;
    }

    /**
     * Applies $effect once per event: in one transaction, marks $eventId
     * processed for $consumer and, if the mark is new, calls $effect.  A
     * redelivered event returns false without calling it; an exception
     * from $effect rolls the mark back with the effect, so the event can be
     * handled again.  Inside an outer transaction it runs in a savepoint.
     */
    public function processOnce(string $consumer, string $eventId, callable $effect): bool
    {
        return $this->db()->transaction(function () use ($consumer, $eventId, $effect) {
            if (!$this->markProcessed($consumer, $eventId)) {
                return false;
            }
            $effect();
            return true;
        });
    }

    /** obx.unsubscribe: true if the subscription existed. */
    public function unsubscribe(string $consumer): bool
    {
        return (bool) $this->db()->selectOne('select obx.unsubscribe(?) as ok', [$consumer])->ok;
    }

    /** obx.status: one row per topic. */
    public function status(): array
    {
        return $this->db()->select(
            'select topic, pending, leased, published, quarantined, failing,
                    oldest_pending_age::text as oldest_pending_age, last_error, problem
               from obx.status order by topic');
    }

    /** obx.consumers: one row per subscription of this database. */
    public function consumers(): array
    {
        return $this->db()->select(
            'select consumer_name, processed, duplicates, dead_lettered, retries, lag,
                    dead_letters_pending
               from obx.consumers order by consumer_name');
    }

    /** obx.landed_status: what waits for obx:work, per consumer. */
    public function landedStatus(): array
    {
        return $this->db()->select(
            'select consumer_name, landed, failing, backing_off,
                    oldest_landed_age::text as oldest_landed_age
               from obx.landed_status order by consumer_name');
    }

    /** The consumers' dead letters not replayed yet, oldest first, optionally of one consumer. */
    public function deadLetters(?string $consumer = null): array
    {
        return $this->db()->select(
            'select id, consumer_name, topic, kafka_partition, kafka_offset, event_id, error_class,
                    left(error_message, 200) as error_message, failed_at, replay_attempts
               from obx.dead_letters
              where replayed_at is null and (? :: text is null or consumer_name = ?)
              order by failed_at, id',
            [$consumer, $consumer]);
    }

    /**
     * obx.replay_dead_letter: applies dead letters again with their
     * subscription's current handler (obx:work's land them again); by ids,
     * or every one of a consumer not replayed yet.  Returns how many
     * succeeded.
     */
    public function replayDeadLetters(array $ids = [], ?string $consumer = null): int
    {
        return $ids !== []
            ? (int) $this->db()->selectOne('select obx.replay_dead_letter(?::bigint[]) as n',
                ['{' . implode(',', array_map('intval', $ids)) . '}'])->n
            : (int) $this->db()->selectOne('select obx.replay_dead_letter(?::text) as n', [$consumer])->n;
    }

    /** obx.quarantine, oldest first, optionally of one topic. */
    public function quarantine(?string $topic = null): array
    {
        return $this->db()->select(
            'select id, topic, event_key, event_type, attempts, last_error_class, last_error,
                    quarantined_at
               from obx.quarantine
              where ? :: text is null or topic = ?
              order by quarantined_at, id',
            [$topic, $topic]);
    }

    /** obx.retry: true if the event was quarantined or backing off. */
    public function retry(string $id): bool
    {
        return (bool) $this->db()->selectOne('select obx.retry(?::uuid) as ok', [$id])->ok;
    }

    /** obx.retry_quarantined: how many quarantined events were made publishable. */
    public function retryQuarantined(?string $topic = null): int
    {
        return (int) $this->db()->selectOne('select obx.retry_quarantined(?) as n', [$topic])->n;
    }

    /** obx.skip: gives up on a quarantined event for good; true if it was one. */
    public function skip(string $id, string $reason): bool
    {
        return (bool) $this->db()->selectOne('select obx.skip(?::uuid, ?) as ok', [$id, $reason])->ok;
    }

    /**
     * obx.replay of published events by id: how many were reset.
     *
     * @param string[] $ids
     */
    public function replay(array $ids): int
    {
        return (int) $this->db()->selectOne(
            'select obx.replay(array(select jsonb_array_elements_text(?::jsonb)::uuid)) as n',
            [json_encode(array_values($ids), JSON_THROW_ON_ERROR)])->n;
    }

    /** obx.replay of a topic's published events with $since <= occurred_at < $until. */
    public function replayTopic(string $topic, string $since, ?string $until = null): int
    {
        return (int) $this->db()->selectOne(
            "select obx.replay(?, ?::timestamptz, coalesce(?::timestamptz, 'infinity')) as n",
            [$topic, $since, $until])->n;
    }

    /** The connection obx's functions are called on: PostgreSQL's only. */
    public function db(): ConnectionInterface
    {
        if ($this->db === null) {
            throw new LogicException('this obx outbox has no database (Obx::fake() fakes enqueue, '
                . 'publish, enqueueMany, markProcessed, processOnce, createExtension and subscribe only)');
        }
        $connection = $this->db->connection($this->connection);
        if (method_exists($connection, 'getDriverName') && $connection->getDriverName() !== 'pgsql') {
            throw new LogicException(sprintf(
                'obx needs a PostgreSQL connection, and connection "%s" uses %s; '
                . 'set config obx.connection (OBX_CONNECTION) to the pgsql connection that holds your tables',
                $connection->getName(), $connection->getDriverName()));
        }
        return $connection;
    }
}
