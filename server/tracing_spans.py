"""One request's spans: the caller's trace context in, a server span, a child span per timed phase.

Used by the instrumentation middleware (`server.instrument`) in a worker whose tracing is on
(`server.tracing`), and imported only there and then (it imports OpenTelemetry's API).

- **In**: the W3C `traceparent`/`tracestate` (OpenTelemetry's global propagator, so
  `OTEL_PROPAGATORS` applies) read from the WSGI environ: the server span is the caller's
  span's child, recorded as the caller sampled it (a parent-based sampler); without one the
  server starts a trace, recorded at `[tracing] sample_ratio`.
- **The server span** (HTTP semantic conventions: `http.request.method`, `http.route`,
  `http.response.status_code`, `url.path`...; and `onnxpool.model`, `.task`, `.request_id`,
  `.caller`, `.cache`, `.batch_size`) starts when nginx received the request (its
  `X-Request-Start`: the queue wait is inside it) and ends when the reply left the app: its
  duration is Server-Timing's `total`. It is the current span while the app runs, so a task
  that uses the OpenTelemetry API itself nests its spans under it; its trace id goes to the
  request's log lines and, as a `traceparent`, to the reply.
- **The children** are made once the reply has left, from the request timer's own readings
  (`server.timing`): `queue`, `decode`, `cache`, `infer` (batch size, threads), `encode`, and
  the task's steps (`Runner.span`), each nested in the block it ran in. Nothing is timed twice.
  A request the sampler drops records no phase and makes no child.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagate import extract
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace import SpanKind, StatusCode, format_trace_id
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from onnxpool.server import request_id
from onnxpool.server.request_state import GRPC, RequestState
from onnxpool.server.timing import Attributes, RequestTimer
from onnxpool.server.tracing_plan import TracingPlan

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIEnvironment

PHASE_SPANS = frozenset({"queue", "decode", "cache", "infer", "encode"})
"""Spans that are Server-Timing's fields (`onnxpool.phase`); a task's own steps are not."""
RESPONSE_HEADER = "traceparent"


class EnvironGetter(Getter["WSGIEnvironment"]):
    """Request headers as the WSGI environ spells them (`traceparent` is `HTTP_TRACEPARENT`)."""

    def get(self, carrier: WSGIEnvironment, key: str) -> list[str] | None:
        value = carrier.get("HTTP_" + key.upper().replace("-", "_"))
        return [value] if isinstance(value, str) else None

    def keys(self, carrier: WSGIEnvironment) -> list[str]:
        return [name[5:].lower().replace("_", "-") for name in carrier if name.startswith("HTTP_")]


GETTER = EnvironGetter()
W3C = TraceContextTextMapPropagator()


class RequestTracer:
    """A worker's maker of request traces (one per worker, over its provider's tracer)."""

    def __init__(self, tracer: trace.Tracer, plan: TracingPlan, threads: int) -> None:
        self.tracer = tracer
        self.plan = plan
        self.threads = threads

    def start(self, environ: WSGIEnvironment, state: RequestState) -> RequestTrace:
        """The server span of a request seen now (current in this thread until `RequestTrace.finish`)."""
        parent = extract(environ, getter=GETTER)
        timer = state.timer
        method = str(environ.get("REQUEST_METHOD", "GET"))
        attributes: Attributes = {
            "http.request.method": method,
            "url.path": str(environ.get("PATH_INFO", "")),
            "url.scheme": str(environ.get("HTTP_X_FORWARDED_PROTO") or environ.get("wsgi.url_scheme", "http")),
            "onnxpool.model": self.plan.model,
            "onnxpool.task": self.plan.task,
            "onnxpool.request_id": state.request_id,
        }
        client = _client_address(environ)
        if client:
            attributes["client.address"] = client
        agent = environ.get("HTTP_USER_AGENT")
        if agent:
            attributes["user_agent.original"] = str(agent)
        protocol = str(environ.get("SERVER_PROTOCOL", ""))
        if protocol.startswith("HTTP/"):
            attributes["network.protocol.version"] = protocol[5:]
        if state.protocol == GRPC:  # a gRPC call, as the v2 REST request it means (server.grpc_service)
            attributes["rpc.system"] = "grpc"
            attributes["rpc.service"] = "inference.GRPCInferenceService"
        span = self.tracer.start_span(
            method,
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attributes,
            start_time=_arrival_ns(timer),
        )
        if span.is_recording():  # sampled: the timer keeps its readings for the children
            timer.spans = []
            timer.attributes = {}
        context = trace.set_span_in_context(span, parent)
        token = otel_context.attach(context)
        reply: dict[str, str] = {}
        W3C.inject(reply, context)
        trace_id = format_trace_id(span.get_span_context().trace_id)
        request_id.set_trace(trace_id)
        return RequestTrace(self, span, token, reply.get(RESPONSE_HEADER))


class RequestTrace:
    """One request's server span, from `RequestTracer.start` to `finish`."""

    __slots__ = ("_token", "span", "traceparent", "tracer")

    def __init__(self, tracer: RequestTracer, span: trace.Span, token: object, traceparent: str | None) -> None:
        self.tracer = tracer
        self.span = span
        self._token = token
        self.traceparent = traceparent
        """The reply's `traceparent`: the trace id and the server span's id (and whether it was recorded)."""

    def finish(self, state: RequestState, status: int, end: float) -> None:
        """End the server span at `end` (the perf_counter reading Server-Timing's total was taken at), with
        its children; leave the request's context."""
        try:
            span = self.span
            timer = state.timer
            if span.is_recording():
                self._describe(state, status)
                self._children(timer)
            span.end(end_time=timer.epoch_ns(end))
        finally:
            otel_context.detach(self._token)  # type: ignore[arg-type]

    def _describe(self, state: RequestState, status: int) -> None:
        span = self.span
        route = state.labels[1] if state.labels is not None else None
        attributes: Attributes = {"http.response.status_code": status, "onnxpool.cache": state.cache}
        if route and not route.startswith("<"):  # a route template, not `<unmatched>`
            attributes["http.route"] = route
            span.update_name(f"{span.name} {route}")  # type: ignore[attr-defined]  # the SDK's Span has `name`
        if state.caller is not None:
            attributes["onnxpool.caller"] = state.caller
        batches = [a["onnxpool.batch_size"] for n, _, _, a in state.timer.spans or () if n == "infer" and a]
        if batches:
            attributes["onnxpool.batch_size"] = sum(batches)
        attributes.update(state.timer.attributes or {})
        if status >= 500:  # HTTP server spans: only 5xx are the server's errors (semantic conventions)
            attributes["error.type"] = str(status)
            shed = attributes.get("onnxpool.shed")
            span.set_status(StatusCode.ERROR, f"shed: waited past {shed}" if shed else None)
        span.set_attributes(attributes)

    def _children(self, timer: RequestTimer) -> None:
        """The queue wait, then each timed block as a span under the innermost block that holds it."""
        tracer = self.tracer.tracer
        server = trace.set_span_in_context(self.span)
        if timer.queue is not None:
            queue = tracer.start_span(
                "queue", server, attributes={"onnxpool.phase": "queue"}, start_time=_arrival_ns(timer)
            )
            queue.end(end_time=timer.wall_ns)
        held: list[tuple[float, otel_context.Context]] = []  # (end, context) of the blocks around the next one
        for name, begin, end, extra in sorted(timer.spans or (), key=lambda block: (block[1], -block[2])):
            while held and end > held[-1][0]:
                held.pop()
            attributes: dict[str, Any] = {"onnxpool.phase": name} if name in PHASE_SPANS else {}
            if name == "infer":
                attributes["onnxpool.threads"] = self.tracer.threads
            attributes.update(extra or {})
            child = tracer.start_span(
                name, held[-1][1] if held else server, attributes=attributes, start_time=timer.epoch_ns(begin)
            )
            child.end(end_time=timer.epoch_ns(end))
            held.append((end, trace.set_span_in_context(child)))


def _arrival_ns(timer: RequestTimer) -> int:
    """When nginx received the request (its X-Request-Start, as the queue wait measured it), else now."""
    return timer.wall_ns - round((timer.queue or 0.0) * 1e9)


def _client_address(environ: WSGIEnvironment) -> str:
    """The client as nginx saw it (the first X-Forwarded-For hop), else the socket's peer."""
    forwarded = environ.get("HTTP_X_FORWARDED_FOR")
    if isinstance(forwarded, str) and forwarded:
        return forwarded.split(",", 1)[0].strip()
    return str(environ.get("REMOTE_ADDR") or "")
