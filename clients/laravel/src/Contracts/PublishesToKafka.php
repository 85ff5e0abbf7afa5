<?php

namespace Obx\Laravel\Contracts;

/**
 * Defaults for ShouldPublishToKafka: the event type is the class's short
 * name, obx picks the event id, no schema version header, no extra headers.
 */
trait PublishesToKafka
{
    public function type(): ?string
    {
        return (new \ReflectionClass($this))->getShortName();
    }

    public function eventId(): ?string
    {
        return null;
    }

    public function schemaVersion(): ?int
    {
        return null;
    }

    public function headers(): array
    {
        return [];
    }
}
