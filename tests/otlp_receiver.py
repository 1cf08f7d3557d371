"""A real OTLP/HTTP trace receiver for tests: `POST /v1/traces`, decoded with the official protobuf classes.

It is what a collector is to onnxpool's exporter (Jaeger, Tempo and the OpenTelemetry Collector
take the same requests on their port 4318): a small HTTP server on 127.0.0.1 that parses each
body as `ExportTraceServiceRequest` (opentelemetry-proto, the protocol's own generated classes),
keeps every span with its resource, and answers `ExportTraceServiceResponse`. It runs in a thread
of the test process and is stopped by the test (`with otlp_receiver() as receiver:`).
"""

from __future__ import annotations

import contextlib
import gzip
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

TRACES_PATH = "/v1/traces"


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(item) for item in value.array_value.values]
    return getattr(value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs if isinstance(pair, KeyValue)}


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as the collector got it."""

    trace_id: str
    span_id: str
    parent_id: str
    """"" for a root span."""
    name: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status: int
    """`Status.STATUS_CODE_*`: 0 unset, 1 ok, 2 error."""
    status_message: str
    resource: dict[str, Any]
    trace_state: str = ""

    @property
    def ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6

    @property
    def is_server(self) -> bool:
        return self.kind == Span.SPAN_KIND_SERVER

    @property
    def is_error(self) -> bool:
        return self.status == Status.STATUS_CODE_ERROR


class Receiver:
    """The spans received so far, and the server receiving them."""

    def __init__(self, refuse: bool = False) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self.refuse = refuse
        """Answer every export with 503 (a collector that is overloaded): the exporter retries, then drops."""
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def endpoint(self) -> str:
        """The base URL `[tracing] endpoint` takes (the exporter appends /v1/traces)."""
        return f"http://127.0.0.1:{self.port}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                encoding = (self.headers.get("Content-Encoding") or "").lower()
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                if self.path != TRACES_PATH or self.headers.get("Content-Type") != "application/x-protobuf":
                    self.send_error(404 if self.path != TRACES_PATH else 415)
                    return
                if receiver.refuse:
                    self.send_error(503)
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver._keep(request)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:  # quiet: pytest shows failures, not traffic
                return

        return Handler

    def _keep(self, request: ExportTraceServiceRequest) -> None:
        got = []
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    got.append(
                        ReceivedSpan(
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            name=span.name,
                            kind=span.kind,
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                            attributes=_attributes(span.attributes),
                            status=span.status.code,
                            status_message=span.status.message,
                            resource=resource,
                            trace_state=span.trace_state,
                        )
                    )
        with self._lock:
            self.requests += 1
            self.spans.extend(got)

    def snapshot(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self.spans)

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        return [span for span in self.snapshot() if span.trace_id == trace_id]

    def wait_for(
        self, check: Callable[[list[ReceivedSpan]], bool], timeout: float = 10.0, what: str = "spans"
    ) -> list[ReceivedSpan]:
        """The spans once `check(spans)` holds (polled), else AssertionError with what arrived."""
        deadline = time.monotonic() + timeout
        while True:
            spans = self.snapshot()
            if check(spans):
                return spans
            if time.monotonic() > deadline:
                names = sorted({(s.name, s.trace_id[:8]) for s in spans})
                raise AssertionError(f"{what} not received after {timeout}s; got {len(spans)} spans: {names}")
            time.sleep(0.05)

    def start(self) -> Receiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


@contextlib.contextmanager
def otlp_receiver(refuse: bool = False) -> Iterator[Receiver]:
    receiver = Receiver(refuse).start()
    try:
        yield receiver
    finally:
        receiver.stop()
