"""Tracing (`[tracing]`): the switch each worker turns on after fork, and off as it exits.

Process rules (docs/ARCHITECTURE.md). OpenTelemetry's batch span processor owns a thread, a lock
and a queue, and its exporter an HTTP connection pool: none of them may cross fork (its own docs
say so: "fork process model"). So the master only plans (`server.tracing_plan`: the settings and
the `OTEL_*` variables it reads, validated with every other setting, once per generation) and
never imports OpenTelemetry at all; each worker makes its own provider, processor and exporter in
post_fork (`Tracing.open`, from `server.app.open_in_worker`) and flushes them in worker_exit
(`Tracing.close`: a HUP's replacement, TERM, max_requests), bounded by `flush_timeout_seconds`.

Free when off: with no endpoint the plan is None, `Tracing.tracer` stays None, and no module of
OpenTelemetry is ever imported (`server.tracing_export` and `server.tracing_spans` are the only
modules that import it, and only `Tracing.open` imports them: an import-linter contract). The
request path then pays one attribute test per request (`server.instrument`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from onnxpool.server.tracing_plan import TracingPlan

if TYPE_CHECKING:
    from onnxpool.server.tracing_export import Exporting
    from onnxpool.server.tracing_spans import RequestTracer

log = logging.getLogger("onnxpool.tracing")


class Tracing:
    """One generation's tracing: planned in the master with the app, started in each worker after fork."""

    def __init__(self, plan: TracingPlan | None, record_metrics: bool) -> None:
        self.plan = plan
        self.record_metrics = record_metrics
        self.tracer: RequestTracer | None = None
        """The worker's tracer once `open` ran with tracing on; None in the master and when off."""
        self._exporting: Exporting | None = None

    def open(self, threads: int) -> None:
        """Worker, post_fork: make this process's provider, processor and exporter (their thread starts here).

        A failure is one logged line and the worker serves untraced: tracing never stops a worker.
        """
        plan = self.plan
        if plan is None or self._exporting is not None:
            return
        # OpenTelemetry is imported here, in the worker, and only when tracing is on (the module doc).
        from onnxpool.server import tracing_export, tracing_spans

        count = None
        if self.record_metrics:
            from onnxpool.server import metrics  # the app loaded it already (after the metrics folder was set)

            count = metrics.observe_spans
        try:
            exporting = tracing_export.start(plan, count)
        except Exception as exc:
            log.error("tracing to %s not started, serving untraced: %s: %s", plan.endpoint, type(exc).__name__, exc)
            return
        self._exporting = exporting
        self.tracer = tracing_spans.RequestTracer(exporting.tracer, plan, threads)
        log.info(
            "tracing: spans to %s as service %r, %g of the traces started here recorded",
            plan.endpoint,
            plan.service_name,
            plan.sample_ratio,
        )

    def close(self) -> None:
        """Worker, worker_exit: send what is queued, at most `flush_timeout_seconds`; the rest is dropped."""
        exporting, self._exporting, self.tracer = self._exporting, None, None
        if exporting is not None and self.plan is not None:
            exporting.close(self.plan.flush_timeout)
