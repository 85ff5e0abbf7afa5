<?php

namespace Obx\Laravel;

/**
 * The W3C trace context of the current OpenTelemetry span, as the
 * traceparent (and tracestate) headers obx.enqueue stores with an event.
 * Used only when the OpenTelemetry API (open-telemetry/api) is installed and
 * a span is current; headers the caller gave win, and obx validates what
 * goes in.
 */
final class TraceContext
{
    private const SPAN = 'OpenTelemetry\\API\\Trace\\Span';

    /** $headers with the current span's trace context added, if there is one. */
    public static function headers(array $headers): array
    {
        if (isset($headers['traceparent']) || isset($headers['tracestate'])
            || !class_exists(self::SPAN)) {
            return $headers;
        }
        $context = (self::SPAN)::getCurrent()->getContext();
        if (!$context->isValid()) {
            return $headers;
        }
        $headers['traceparent'] = sprintf('00-%s-%s-%s', $context->getTraceId(),
            $context->getSpanId(), $context->isSampled() ? '01' : '00');
        $state = $context->getTraceState();
        if ($state !== null && (string) $state !== '') {
            $headers['tracestate'] = (string) $state;
        }
        return $headers;
    }
}
