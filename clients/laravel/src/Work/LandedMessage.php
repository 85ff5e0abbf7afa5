<?php

namespace Obx\Laravel\Work;

/**
 * One Kafka message as obx:work hands it to a listener: what obx's
 * consumer landed in obx.landed (docs/sql.md), with the payload decoded:
 * an array for a JSON object (any JSON value is accepted upstream), null
 * for a tombstone (a deletion of $key).  $attempt counts from 1; a message
 * retried after a failure comes again with the next one.
 */
final class LandedMessage
{
    public function __construct(
        public readonly int $id,
        public readonly string $consumer,
        public readonly string $eventId,
        public readonly ?string $eventType,
        public readonly string $topic,
        public readonly int $partition,
        public readonly int $offset,
        public readonly ?string $key,
        public readonly array $headers,
        public readonly mixed $payload,
        public readonly ?string $kafkaTimestamp,
        public readonly int $attempt,
    ) {
    }

    /**
     * From a row of obx.claim_landed (jsonb columns as text), decoded as
     * deep as PHP's parser goes.
     *
     * @throws Undecodable when PHP cannot decode the payload or headers
     */
    public static function fromRow(object $row): self
    {
        try {
            return self::make($row, true);
        } catch (\JsonException $e) {
            throw new Undecodable(sprintf('the message could not be decoded as JSON by PHP: %s',
                $e->getMessage()), 0, $e);
        }
    }

    /** The same row with neither payload nor headers, to record its failure. */
    public static function undecoded(object $row): self
    {
        return self::make($row, false);
    }

    private static function make(object $row, bool $decode): self
    {
        $json = fn (?string $text) => $text === null || !$decode ? null
            : json_decode($text, true, 2147483647, JSON_THROW_ON_ERROR);
        return new self(
            (int) $row->id,
            $row->consumer_name,
            $row->event_id,
            $row->event_type,
            $row->topic,
            (int) $row->kafka_partition,
            (int) $row->kafka_offset,
            $row->event_key,
            (array) ($json($row->headers) ?? []),
            $json($row->payload),
            $row->kafka_timestamp,
            (int) $row->attempts + 1,
        );
    }

    /** "topic[partition]@offset", as logs name a message. */
    public function where(): string
    {
        return sprintf('%s[%d]@%d', $this->topic, $this->partition, $this->offset);
    }
}
