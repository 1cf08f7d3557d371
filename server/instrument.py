"""Wires timing, request ids and metrics into the app.

- A WSGI middleware around `app.wsgi_app` sees each request first and last:
  it makes the request's state (`server.request_state`) with its phase timer
  (parsing `X-Request-Start`, once, for the queue wait and for admission control),
  settles the request id, adds `X-Request-ID` and `Server-Timing` to the reply
  headers and records the request in Prometheus as the reply leaves the app
  (total = from the proxy's X-Request-Start, or our first look at the request,
  to the reply; the same total as in Server-Timing); the request id is cleared
  when the server closes the reply, after its access line was written.
- An after_request hook hands the middleware Flask's view of the request (the
  route template and the model) as bounded metric labels; the data plane
  (`server.dataplane`) sets them itself for the requests it answers. The task's name
  and whether the reply was a cache hit are labels too (`task`, `cache`).
- Inferences are timed (`infer`) and their batch sizes counted by the data plane's
  per-request runner (`server.runner`), the only way to the session.
- GET /metrics serves the Prometheus text (not itself counted).
- With tracing on (`server.tracing`, in a worker after fork), each request but probes and
  scrapes gets a server span (`server.tracing_spans`), in the caller's trace when it sent a
  `traceparent`: started as the state is made, its `traceparent` added to the reply beside
  X-Request-ID, ended with its phase spans after the reply, at the very reading Server-Timing's
  total was taken at. Off, a request pays one test (`tracing.tracer is None`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from flask import Flask, Response, request
from werkzeug.wsgi import ClosingIterator

from onnxpool.config.settings import Settings
from onnxpool.server import metrics, request_id, request_start, timing
from onnxpool.server.request_state import RequestState
from onnxpool.server.tracing import Tracing
from onnxpool.server.tracing_plan import UNTRACED_PREFIXES
from onnxpool.tasks.server_routes import METRICS

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

UNMATCHED = "<unmatched>"
TRACEPARENT = "traceparent"
"""Reply header of a traced request: the trace (and server span) it is in, W3C Trace Context's format."""
UNKNOWN_MODEL = "<unknown>"


class Instrumentation:
    """WSGI middleware: timer, request id, reply headers, request metrics (see the module doc)."""

    def __init__(
        self, app: WSGIApplication, *, task: str, record_metrics: bool, server_timing: bool, tracing: Tracing
    ) -> None:
        self.app = app
        self.task = task
        self.record_metrics = record_metrics
        self.server_timing = server_timing
        self.tracing = tracing

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        timer = timing.RequestTimer.arriving(request_start.parse_request_start(environ.get(request_start.ENVIRON_KEY)))
        rid = request_id.from_header(environ.get(request_id.ENVIRON_KEY))
        state = RequestState.arriving(environ, timer, rid)
        request_id.set_current(rid)
        path = environ.get("PATH_INFO", "")
        pending = [self.record_metrics and path != METRICS]
        task = self.task
        tracer = self.tracing.tracer
        traced = None
        if tracer is not None and not path.startswith(UNTRACED_PREFIXES):
            traced = tracer.start(environ, state)
        replied_at, replied_status = 0.0, 500  # when the reply left the app (perf_counter), and its status

        def record(status: int, total: float) -> None:
            if pending[0]:
                pending[0] = False
                _record_request(state, task, status, total)

        def reply(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            nonlocal replied_at, replied_status
            replied_at = time.perf_counter()
            replied_status = int(status[:3])
            total = timer.total(replied_at)  # one total for the header, the metrics and the server span
            headers.append((request_id.HEADER, rid))
            if traced is not None and traced.traceparent is not None:
                headers.append((TRACEPARENT, traced.traceparent))
            if self.server_timing:
                headers.append(("Server-Timing", timer.server_timing(total)))
            # Recorded here, as the reply leaves the app, not after the body is sent: a
            # client that has its answer then always finds it counted on /metrics.
            record(replied_status, total)
            return start_response(status, headers, exc_info)

        def finish() -> None:
            record(500, timer.total())  # counts only if the app failed before replying
            if traced is not None:
                traced.finish(state, replied_status, replied_at or time.perf_counter())
            request_id.set_current(None)

        if pending[0]:
            metrics.IN_FLIGHT.inc()
        try:
            body = self.app(environ, reply)
        except BaseException:
            finish()
            raise
        return ClosingIterator(body, finish)


def _record_request(state: RequestState, task: str, status: int, total: float) -> None:
    model, endpoint = state.labels or ("", UNMATCHED)
    metrics.IN_FLIGHT.dec()
    metrics.observe_request(model, endpoint, task, state.cache, status, total, state.timer.breakdown(), state.protocol)
    if state.caller is not None:
        metrics.observe_caller(state.caller, model, status, total)


def metric_labels(model_name: str, rule: str, asked: str | None, aliases: tuple[str, ...] = ()) -> tuple[str, str]:
    """The bounded (model, endpoint) labels of a Flask route `rule` that named model `asked` (or none)."""
    if asked is None:
        return "", rule
    return (model_name if asked == model_name or asked in aliases else UNKNOWN_MODEL), rule


def _stash_labels(model_name: str, aliases: tuple[str, ...]) -> Any:
    """after_request hook: bounded labels for the middleware (route template, model)."""

    def hook(response: Response) -> Response:
        url_rule = request.url_rule
        if url_rule is None:
            labels = ("", UNMATCHED)
        else:
            labels = metric_labels(model_name, url_rule.rule, (request.view_args or {}).get("model"), aliases)
        RequestState.of(request.environ).labels = labels
        return response

    return hook


def _metrics_view() -> Response:
    body, content_type = metrics.render()
    return Response(body, content_type=content_type)


def install(app: Flask, settings: Settings, task: str, tracing: Tracing) -> None:
    """Add the middleware, the label hook and (when metrics are on) GET /metrics to `app`.

    The middleware is installed whatever the metrics settings: its timer carries the
    parsed `X-Request-Start` that admission control sheds by. `tracing` is the generation's
    (`ServerContext.tracing`): its tracer exists only in a worker, after fork.
    """
    enabled = settings.metrics.enabled
    app.after_request(_stash_labels(settings.model.name, settings.model.aliases))
    if enabled:
        app.add_url_rule(METRICS, "metrics", _metrics_view, methods=["GET"])
    app.wsgi_app = Instrumentation(  # type: ignore[method-assign]
        app.wsgi_app,
        task=task,
        record_metrics=enabled,
        server_timing=settings.metrics.server_timing,
        tracing=tracing,
    )
