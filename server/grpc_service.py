"""`inference.GRPCInferenceService` over the worker's own WSGI app: gRPC is a transport, like REST.

Each call becomes the REST request that means the same (ModelInfer: POST /v2/models/<m>/infer
with binary tensors, `server.grpc_codec`; metadata and readiness: the v2 GETs) and runs through
the worker's app: the instrumentation (timer, request id, metrics with protocol "grpc",
Server-Timing, the trace), the gates (body size, API key, callers, admission), the data plane
and its response cache, exactly as a REST request would. The call's metadata are its headers
(`authorization`, `x-request-id`, `traceparent`, ...); its deadline (`grpc-timeout`) is
`X-Request-Timeout`; the moment it reached this worker is its `X-Request-Start`, so a call
that waited past `[limits] max_queue_ms` (or its own deadline) for the worker is shed as a
REST request is. The REST reply's status becomes the call's code and its error the message
(`STATUS_CODES`); `x-request-id`, `server-timing`, `traceparent` and `retry-after` go back as
trailing metadata, and a `retry-after` also as gRPC's `grpc-retry-pushback-ms`.

ModelInfer runs the model, so it is handed to the worker's main thread (`run_in_worker`:
`workers.handoff`), one at a time with the HTTP requests; the other calls read metadata and
answer from the calling thread, so a probe never waits behind an inference.
"""

from __future__ import annotations

import io
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from onnxpool.server import admission, request_start
from onnxpool.server.grpc_codec import infer_response, rest_body, tensor_metadata
from onnxpool.server.grpc_metadata import reply_metadata, request_headers
from onnxpool.server.grpc_proto import grpc_service_pb2 as pb
from onnxpool.server.grpc_proto import grpc_service_pb2_grpc as pb_grpc
from onnxpool.server.grpc_proto import model_config_pb2 as config_pb
from onnxpool.server.request_state import GRPC, PROTOCOL_KEY
from onnxpool.server.v2codec import BINARY_HEADER
from onnxpool.tasks import jsonfast
from onnxpool.tasks import server_routes as paths
from onnxpool.tasks.errors import OnnxpoolError

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIApplication, WSGIEnvironment


STATUS_CODES: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    405: grpc.StatusCode.UNIMPLEMENTED,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    415: grpc.StatusCode.INVALID_ARGUMENT,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
"""A REST status -> the gRPC code a Triton or KServe client expects for the same refusal."""


RunInWorker = Callable[[Callable[[], Any], "WSGIEnvironment"], Any]
"""Runs a call's request (the environ is the call's: its caller's lane is read from it) in the worker."""


@dataclass(frozen=True, slots=True)
class AppReply:
    """What the app answered: status, headers (lower-case names), body."""

    status: int
    headers: dict[str, str]
    body: bytes

    def error(self) -> str:
        """The reply's error message (`{"error": "..."}`, or OpenAI's `{"error": {"message": ...}}`)."""
        try:
            document = jsonfast.loads(self.body, "error reply")
        except OnnxpoolError:
            return self.body.decode("utf-8", "replace") or f"HTTP {self.status}"
        error = document.get("error") if isinstance(document, dict) else None
        if isinstance(error, dict):
            error = error.get("message")
        return str(error) if error else f"HTTP {self.status}"


def call_app(app: WSGIApplication, environ: WSGIEnvironment) -> AppReply:
    """Run one request through the WSGI app, in this thread; the reply and its close() (metrics, trace)."""
    started: list[Any] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], object]:
        started[:] = [int(status[:3]), headers]
        return lambda _data: None

    body = app(environ, start_response)
    try:
        data = b"".join(body)
    finally:
        close = getattr(body, "close", None)
        if close is not None:
            close()
    status, headers = started
    return AppReply(status, {name.lower(): value for name, value in headers}, data)


def _remote_addr(peer: str) -> str:
    """gRPC's peer string (`ipv4:127.0.0.1:5000`, `ipv6:[::1]:5000`, `unix:...`) -> the address alone."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]")
    return "127.0.0.1" if kind == "unix" else rest


def environ_for(
    method: str, path: str, context: Any, arrived: float, body: bytes = b"", header_length: int | None = None
) -> WSGIEnvironment:
    """The WSGI environ of the REST request a call means: its metadata as headers, its deadline and arrival."""
    environ: dict[str, Any] = {
        "REQUEST_METHOD": method,
        "SCRIPT_NAME": "",
        "PATH_INFO": path,
        "QUERY_STRING": "",
        "SERVER_NAME": "grpc",
        "SERVER_PORT": "0",
        "SERVER_PROTOCOL": "HTTP/2",
        "REMOTE_ADDR": _remote_addr(context.peer()),
        "CONTENT_LENGTH": str(len(body)),
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
        PROTOCOL_KEY: GRPC,
    }
    if body:
        environ["CONTENT_TYPE"] = "application/octet-stream" if header_length is not None else "application/json"
    if header_length is not None:
        environ["HTTP_" + BINARY_HEADER.upper().replace("-", "_")] = str(header_length)
    environ.update(request_headers(context.invocation_metadata()))
    # The moment the call reached this worker, unless a proxy (onnxpool's nginx) stamped it earlier.
    environ.setdefault(request_start.ENVIRON_KEY, f"t={arrived:.6f}")
    remaining = context.time_remaining()
    if remaining is not None:
        environ["HTTP_" + admission.TIMEOUT_HEADER.upper().replace("-", "_")] = f"{max(remaining, 0.000001):.6f}"
    return environ


class InferenceService(pb_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]  # generated, untyped
    """The Open Inference Protocol's gRPC service, answered by the worker's app (see the module doc)."""

    def __init__(
        self,
        app: WSGIApplication,
        run_in_worker: RunInWorker,
        model: str,
        version: str,
        before_reply: Callable[[], None] = lambda: None,
    ) -> None:
        self.app = app
        self.run_in_worker = run_in_worker
        self.model = model
        self.version = version
        self.before_reply = before_reply
        """Waits while the worker's gRPC server stops (server.grpc_server.ReplyGate)."""

    # -- calls that read -------------------------------------------------------------------------

    def _get(self, path: str, context: Any, *, ok: Iterable[int] = (200,)) -> dict[str, Any]:
        reply = call_app(self.app, environ_for("GET", path, context, time.time()))
        self._answer(reply, context, ok)
        document: dict[str, Any] = jsonfast.loads(reply.body, "reply")
        return document

    def ServerLive(self, request: Any, context: Any) -> Any:
        return pb.ServerLiveResponse(live=bool(self._get(paths.V2_LIVE, context).get("live")))

    def ServerReady(self, request: Any, context: Any) -> Any:
        return pb.ServerReadyResponse(ready=bool(self._get(paths.V2_READY, context, ok=(200, 503)).get("ready")))

    def ModelReady(self, request: Any, context: Any) -> Any:
        document = self._get(_model_path(request.name, request.version, "/ready"), context, ok=(200, 503))
        return pb.ModelReadyResponse(ready=bool(document.get("ready")))

    def ServerMetadata(self, request: Any, context: Any) -> Any:
        document = self._get(paths.V2_SERVER, context)
        return pb.ServerMetadataResponse(
            name=document["name"], version=document["version"], extensions=document["extensions"]
        )

    def ModelMetadata(self, request: Any, context: Any) -> Any:
        document = self._get(_model_path(request.name, request.version), context)
        return pb.ModelMetadataResponse(
            name=document["name"],
            versions=document["versions"],
            platform=document["platform"],
            inputs=tensor_metadata(document["inputs"]),
            outputs=tensor_metadata(document["outputs"]),
        )

    def ModelConfig(self, request: Any, context: Any) -> Any:
        """Triton's model configuration, as far as onnxpool has one: name, platform, tensors."""
        document = self._get(_model_path(request.name, request.version), context)
        config = config_pb.ModelConfig(name=document["name"], platform=document["platform"], backend="onnxruntime")
        for tensor in document["inputs"]:
            config.input.add(name=tensor["name"], data_type=_config_type(tensor["datatype"]), dims=tensor["shape"])
        for tensor in document["outputs"]:
            config.output.add(name=tensor["name"], data_type=_config_type(tensor["datatype"]), dims=tensor["shape"])
        return pb.ModelConfigResponse(config=config)

    def RepositoryIndex(self, request: Any, context: Any) -> Any:
        body = jsonfast.dumps({"ready": request.ready}) if request.ready else b""
        environ = environ_for("POST", paths.V2_REPOSITORY_INDEX, context, time.time(), body)
        reply = call_app(self.app, environ)
        self._answer(reply, context, (200,))
        models = jsonfast.loads(reply.body, "reply")
        return pb.RepositoryIndexResponse(
            models=[
                pb.RepositoryIndexResponse.ModelIndex(
                    name=m.get("name", ""),
                    version=m.get("version", ""),
                    state=m.get("state", ""),
                    reason=m.get("reason", ""),
                )
                for m in models
            ]
        )

    # -- the call that runs the model ------------------------------------------------------------

    def ModelInfer(self, request: Any, context: Any) -> Any:
        arrived = time.time()
        try:
            rest = rest_body(request)
        except OnnxpoolError as exc:
            context.abort(STATUS_CODES.get(exc.status, grpc.StatusCode.INVALID_ARGUMENT), exc.message)
        path = _model_path(request.model_name, request.model_version, "/infer")
        environ = environ_for("POST", path, context, arrived, rest.body, rest.header_length)
        reply: AppReply = self.run_in_worker(lambda: call_app(self.app, environ), environ)
        self._answer(reply, context, (200,))
        length = reply.headers.get(BINARY_HEADER.lower())
        return infer_response(reply.body, int(length) if length is not None else None)

    def _answer(self, reply: AppReply, context: Any, ok: Iterable[int]) -> None:
        """The reply's metadata to the caller; a status not in `ok` ends the call with its code and message.
        Every call's reply passes here, so here it waits while the server stops (`before_reply`)."""
        self.before_reply()
        trailing = reply_metadata(reply.headers)
        if trailing:
            context.set_trailing_metadata(trailing)
        if reply.status not in ok:
            message = reply.error()
            retry = reply.headers.get("retry-after")
            if retry is not None and "retry" not in message:
                message += f" (retry after {retry} s)"
            code = STATUS_CODES.get(reply.status, grpc.StatusCode.INTERNAL)
            context.abort(code, message)


def _model_path(name: str, version: str, suffix: str = "") -> str:
    """The v2 REST path of a model (and version) a call names."""
    versioned = f"/versions/{version}" if version else ""
    return f"/v2/models/{name}{versioned}{suffix}"


def _config_type(datatype: str) -> int:
    """A v2 datatype as Triton's model configuration enumerates it (BYTES is TYPE_STRING there)."""
    name = "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"
    return int(config_pb.DataType.Value(name)) if name in config_pb.DataType.keys() else 0
