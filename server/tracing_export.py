"""A worker's OpenTelemetry SDK: its provider, batch processor and OTLP/HTTP exporter, counted and flushed.

Made by `server.tracing.Tracing.open` in each worker after fork, never in the master (the batch
processor's thread and the exporter's connection pool must not cross fork), and imported only
then: this module and `server.tracing_spans` are the only ones that import OpenTelemetry.

The official SDK does the work: `TracerProvider` with a parent-based ratio sampler (a caller's
`traceparent` decides; the ratio decides for the traces started here), `BatchSpanProcessor`
(its `OTEL_BSP_*` variables apply), `OTLPSpanExporter` over HTTP/protobuf (requests, never
grpcio; its `OTEL_EXPORTER_OTLP_TRACES_*` headers, timeout, compression and certificates apply).
onnxpool adds only what an operator needs around it:

- **counts** (`onnxpool_trace_spans_total{outcome}`): spans exported, spans the exporter gave up
  on (collector down, refusing or slow: the SDK retries within its timeout, in the processor's
  thread, never in a request), and spans the processor's bounded queue dropped meanwhile;
- **a bounded exit**: `close` waits at most the flush timeout for the last spans; past it the
  exporter is shut, which stops its retries at once, and what is left is dropped and counted.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

from onnxpool import __version__
from onnxpool.server.tracing_plan import TracingPlan

Count = Callable[[str, int], None]
"""`server.metrics.observe_spans`: (outcome, spans)."""


class CountingExporter(SpanExporter):
    """The OTLP exporter, its outcomes counted; `cut` stops it (retries included) from any thread."""

    def __init__(self, exporter: SpanExporter, count: Count | None) -> None:
        self.exporter = exporter
        self.count = count
        self._shut = threading.Lock()
        self._is_shut = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.exporter.export(spans)
        except Exception:  # the SDK's exporter returns FAILURE; a bug of its own must not kill the thread
            result = SpanExportResult.FAILURE
        if self.count is not None:
            self.count("exported" if result is SpanExportResult.SUCCESS else "export_failed", len(spans))
        return result

    def cut(self) -> None:
        """Shut the exporter now: an export waiting between retries returns at once, later ones fail fast."""
        with self._shut:
            if self._is_shut:
                return
            self._is_shut = True
        self.exporter.shutdown()

    def shutdown(self) -> None:
        self.cut()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.exporter.force_flush(timeout_millis)


class CountingProcessor(BatchSpanProcessor):
    """The SDK's batch processor, plus a count of the spans its full queue drops.

    The processor keeps ended spans in a bounded deque that its thread empties; when the collector
    lags, a new span pushes the oldest out (the SDK logs "Queue full" once). That deque is the
    SDK's `_batch_processor._queue`: read here only for its length and bound, and if a later SDK
    moves it the count stays 0 rather than failing a request (tests/test_tracing_export.py
    notices).
    """

    def __init__(self, exporter: SpanExporter, count: Count | None, **options: int) -> None:
        super().__init__(exporter, **options)  # type: ignore[arg-type]
        self.count = count

    def on_end(self, span: ReadableSpan) -> None:
        if self.count is not None and span.context is not None and span.context.trace_flags.sampled:
            queue = getattr(getattr(self, "_batch_processor", None), "_queue", None)
            bound = getattr(queue, "maxlen", None)
            if queue is not None and bound is not None and len(queue) >= bound:
                self.count("queue_full", 1)
        super().on_end(span)


@dataclass
class Exporting:
    """A worker's provider and exporter, and the tracer the request spans are made with."""

    provider: TracerProvider
    exporter: CountingExporter
    tracer: trace.Tracer

    def close(self, timeout: float) -> None:
        """Flush and shut down, at most `timeout` seconds (then cut the exporter: the rest is dropped, counted).

        The provider's own shutdown waits for the processor's thread without a bound (an export can
        retry for the exporter's whole timeout, 10 s by default), so it runs in a thread of its own
        here and the worker waits for it only this long.
        """
        closing = threading.Thread(target=self.provider.shutdown, name="onnxpool-trace-flush", daemon=True)
        closing.start()
        closing.join(timeout)
        if closing.is_alive():
            self.exporter.cut()
            closing.join(1.0)


def resource_of(plan: TracingPlan) -> Resource:
    """service.name (the plan's), the model and this worker's pid; `OTEL_RESOURCE_ATTRIBUTES` adds to them."""
    return Resource.create(
        {
            "service.name": plan.service_name,
            "service.version": __version__,
            "onnxpool.model": plan.model,
            "onnxpool.task": plan.task,
            "process.pid": os.getpid(),
            "host.name": socket.gethostname(),
        }
    )


def start(plan: TracingPlan, count: Count | None, **processor_options: int) -> Exporting:
    """This worker's provider, processor and exporter (its thread starts now); also the global provider,
    so a task that uses the OpenTelemetry API itself has its spans in the request's trace."""
    provider = TracerProvider(
        sampler=ParentBased(TraceIdRatioBased(plan.sample_ratio)),
        resource=resource_of(plan),
        shutdown_on_exit=False,  # worker_exit flushes, bounded (`Exporting.close`); atexit would not be
    )
    exporter = CountingExporter(OTLPSpanExporter(endpoint=plan.endpoint), count)
    provider.add_span_processor(CountingProcessor(exporter, count, **processor_options))
    trace.set_tracer_provider(provider)
    if count is not None:
        from onnxpool.server import metrics

        metrics.tracing_opened()
    return Exporting(provider, exporter, provider.get_tracer("onnxpool", __version__))
