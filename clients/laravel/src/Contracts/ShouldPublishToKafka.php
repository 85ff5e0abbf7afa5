<?php

namespace Obx\Laravel\Contracts;

/**
 * A Laravel event that publishes itself to Kafka through obx's outbox.
 *
 * Dispatched with event(...) inside DB::transaction, it is enqueued in that
 * transaction by the package's listener: it reaches Kafka if and only if the
 * transaction commits.  Use the PublishesToKafka trait for the defaults of
 * everything but topic(), key() and payload().
 */
interface ShouldPublishToKafka
{
    /** The Kafka topic, e.g. "orders.placed.v1". */
    public function topic(): string;

    /** The Kafka key: the aggregate id; per-key order is kept. */
    public function key(): string;

    /**
     * The message value: an array or JsonSerializable that encodes to a JSON
     * object.  Build it field by field; never dump a model.
     *
     * @return array|\JsonSerializable
     */
    public function payload();

    /** The Kafka header event_type; null sends none. */
    public function type(): ?string;

    /** The event id (a uuid) to reuse on a retry; null lets obx pick one. */
    public function eventId(): ?string;

    /** The schema version, sent as the Kafka header schema_version; null sends none. */
    public function schemaVersion(): ?int;

    /** Extra Kafka headers, name => string value. */
    public function headers(): array;
}
