<?php

namespace Obx\Laravel;

use Illuminate\Database\Eloquent\Model;
use JsonException;
use JsonSerializable;
use Obx\Laravel\Exceptions\InvalidEvent;

/**
 * The checks and the encoding obx.enqueue's arguments go through before any
 * SQL runs, shared by the real outbox and the fake: the payload must be an
 * array or JsonSerializable that encodes to a JSON object; headers must map
 * non-empty names to strings.
 */
final class Payload
{
    private const FLAGS = JSON_THROW_ON_ERROR | JSON_UNESCAPED_SLASHES
        | JSON_UNESCAPED_UNICODE | JSON_PRESERVE_ZERO_FRACTION;

    /** The payload's JSON text, always an object; InvalidEvent otherwise. */
    public static function encode($payload): string
    {
        if ($payload instanceof Model) {
            throw new InvalidEvent(sprintf(
                'obx event payload must be the fields of the event, got the model %s; '
                . 'pass $model->only([...]) or an array of what consumers need, not the whole row',
                get_class($payload)));
        }
        if (!is_array($payload) && !$payload instanceof JsonSerializable) {
            throw new InvalidEvent(sprintf(
                'obx event payload must be an array or JsonSerializable, got %s; '
                . 'pass the fields, not a JSON string or a model',
                get_debug_type($payload)));
        }
        $data = $payload instanceof JsonSerializable ? $payload->jsonSerialize() : $payload;
        if ($data === []) {
            return '{}';
        }
        if (is_array($data) && array_is_list($data)) {
            throw new InvalidEvent('obx event payload must encode to a JSON object, not a list: '
                . 'give its fields names');
        }
        if (!is_array($data) && !is_object($data)) {
            throw new InvalidEvent(sprintf(
                'obx event payload must encode to a JSON object, %s::jsonSerialize() returned %s',
                get_class($payload), get_debug_type($data)));
        }
        try {
            $json = json_encode($data, self::FLAGS);
        } catch (JsonException $e) {
            throw new InvalidEvent('obx event payload cannot be encoded as JSON: ' . $e->getMessage(), 0, $e);
        }
        if ($json[0] !== '{') {
            throw new InvalidEvent('obx event payload must encode to a JSON object, got ' . substr($json, 0, 40));
        }
        self::refuseNul($json, 'payload');
        return $json;
    }

    /** The headers' JSON text, or null for none; InvalidEvent if not a map of strings. */
    public static function headers(array $headers): ?string
    {
        if ($headers === []) {
            return null;
        }
        foreach ($headers as $name => $value) {
            if (!is_string($name) || $name === '') {
                throw new InvalidEvent('obx event header names must be non-empty strings');
            }
            if (!is_string($value)) {
                throw new InvalidEvent(sprintf('obx event header "%s" must be a string, got %s',
                    $name, get_debug_type($value)));
            }
        }
        try {
            $json = json_encode($headers, self::FLAGS);
        } catch (JsonException $e) {
            throw new InvalidEvent('obx event headers cannot be encoded as JSON: ' . $e->getMessage(), 0, $e);
        }
        self::refuseNul($json, 'headers');
        return $json;
    }

    /**
     * PostgreSQL's jsonb cannot hold a NUL character (\u0000): refused here,
     * before the statement would fail and abort the caller's transaction.
     * In the encoded text a NUL can only be the escape, and a backslash
     * before it is itself escaped.
     */
    private static function refuseNul(string $json, string $what): void
    {
        if (preg_match('/(?<!\\\\)(?:\\\\\\\\)*\\\\u0000/', $json)) {
            throw new InvalidEvent("obx event $what contains a NUL character (\\u0000), which PostgreSQL's jsonb cannot store");
        }
    }
}
