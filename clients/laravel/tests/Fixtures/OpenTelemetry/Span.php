<?php

/*
 * A stand-in for the part of the OpenTelemetry PHP API (open-telemetry/api,
 * not a Debian package) that TraceContext calls: Span::getCurrent() and its
 * span context.  TraceContextTest loads it and sets the current span.
 */

namespace OpenTelemetry\API\Trace;

final class SpanContext
{
    public function __construct(private string $traceId, private string $spanId,
                                private bool $sampled, private ?string $traceState = null)
    {
    }

    public function getTraceId(): string { return $this->traceId; }
    public function getSpanId(): string { return $this->spanId; }
    public function isSampled(): bool { return $this->sampled; }
    public function isValid(): bool
    {
        return $this->traceId !== str_repeat('0', 32) && $this->spanId !== str_repeat('0', 16);
    }
    public function getTraceState(): ?string { return $this->traceState; }
}

final class Span
{
    public static ?SpanContext $current = null;

    private function __construct(private SpanContext $context)
    {
    }

    public static function getCurrent(): self
    {
        return new self(self::$current ?? new SpanContext(str_repeat('0', 32), str_repeat('0', 16), false));
    }

    public function getContext(): SpanContext { return $this->context; }
}
