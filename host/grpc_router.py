"""The host's one gRPC port: each call goes to the pool of the model it names, as raw bytes.

A host serving several models listens for gRPC on its `[server] grpc_bind`, once for every model
(docs/DEPLOYING.md, "gRPC"). The model is named inside the message (ModelInferRequest.model_name,
field 1), not in a header, so neither nginx nor a stock proxy can route it. This process, a
supervisord program of the host (host/supervisor.py), does:

- calls that name a model (ModelInfer, ModelMetadata, ModelReady, ModelConfig, ModelStatistics) are
  taken as bytes (no deserializer), the model's name read from field 1 alone (host/grpc_wire.py:
  the tensors behind it are never parsed), and forwarded as the same bytes with the call's metadata
  and what is left of its deadline to that model's pool, whose workers serve gRPC on a loopback port
  the host gave it (host.json's `grpc_address`); the pool's reply bytes, trailing metadata, code and
  message come back as they are. One channel per pool, made in this process.
- calls about the host (ServerLive, ServerReady, ServerMetadata, RepositoryIndex) and
  grpc.health.v1's Check are answered here from host.json, with the REST routes' rules
  (host/view.py): ready when every model the host waits for is READY; a model by name or alias.
- a model the host does not serve: NOT_FOUND naming the models it serves (REST's 404 text); one that
  is not serving (loading, failed, removed from the file): UNAVAILABLE with its state's reason.

It stamps `x-request-start` on a call that has none, so the pool's shedding ([limits] max_queue_ms)
counts the wait from the host's door, as nginx's stamp does for REST. grpc is imported by this
module only, in this process, which forks nothing (docs/ARCHITECTURE.md). `python -m
onnxpool.host.grpc_router` (the host's supervisord program `grpc`; in the zoo pod, the front door's
second child) reads the host's file ($ONNXPOOL_CONFIG) and its run folder ($ONNXPOOL_HOST_DIR).
"""

from __future__ import annotations

import argparse
import logging
import logging.config
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

import grpc

from onnxpool import __version__, logs
from onnxpool.config.loader import ENV_HOST_DIR, load_settings
from onnxpool.host.grpc_wire import WireError, first_string
from onnxpool.host.state import HostModel
from onnxpool.host.view import HostView, not_ready, unavailable
from onnxpool.server.grpc_proto import grpc_service_pb2 as pb
from onnxpool.server.grpc_proto import health_pb2
from onnxpool.server.grpc_server import SERVICE, message_limit
from onnxpool.server.model_states import READY, repository_index
from onnxpool.server.routes_v2 import EXTENSIONS, SERVER_NAME

log = logging.getLogger("onnxpool.host")

ROUTED = ("ModelInfer", "ModelMetadata", "ModelReady", "ModelConfig", "ModelStatistics")
"""The service's calls whose field 1 is the model's name."""
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
CALL_THREADS = 128
"""Calls in flight at once (each holds a thread while its pool answers; more wait in gRPC's queue). A
thread per call costs less CPU per call than grpc.aio's event loop here: ~390 against ~475 µs for an iris
call, measured in alternating runs (docs/BENCHMARKS.md, "gRPC on a several-models host")."""
CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
    # A pool that restarts is reachable again within a second, not after gRPC's default back-off (up to 2 min).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)
NO_DEADLINE_SECONDS = 10**7
"""A call with more time left than this (~4 months) has no deadline."""
_NOT_PASSED = ("grpc-", ":", "user-agent")
"""Metadata that is the transport's own: the channel to the pool writes its own."""

Behaviour = Callable[[bytes, Any], bytes]


class Router(grpc.GenericRpcHandler):  # type: ignore[misc]  # grpc is untyped
    """Routes by the model a call names, answers for the host (see the module doc)."""

    def __init__(self, view: HostView) -> None:
        self.view = view
        self._channels: dict[str, Any] = {}
        self._lock = threading.Lock()
        handlers: dict[str, Behaviour] = {f"/{SERVICE}/{name}": self._forwarder(name) for name in ROUTED}
        handlers.update(
            {
                f"/{SERVICE}/ServerLive": self.server_live,
                f"/{SERVICE}/ServerReady": self.server_ready,
                f"/{SERVICE}/ServerMetadata": self.server_metadata,
                f"/{SERVICE}/RepositoryIndex": self.repository_index,
                HEALTH_CHECK: self.health_check,
            }
        )
        # No (de)serializers: requests and replies stay bytes.
        self._handlers = {method: grpc.unary_unary_rpc_method_handler(call) for method, call in handlers.items()}

    def service(self, handler_call_details: Any) -> Any:
        return self._handlers.get(handler_call_details.method)  # None: UNIMPLEMENTED

    # -- calls that name a model ---------------------------------------------------------------

    def _forwarder(self, name: str) -> Behaviour:
        method = f"/{SERVICE}/{name}"

        def forward(request: bytes, context: Any) -> bytes:
            arrived = time.time()
            try:
                model_name = first_string(request)
            except WireError as exc:
                _end(context, grpc.StatusCode.INVALID_ARGUMENT, f"the request is not a {name}Request: {exc}")
            model = self._served(model_name, context, ready_call=name == "ModelReady")
            if model is None:  # ModelReady of a model that is not serving: Triton's answer, not an error
                return bytes(pb.ModelReadyResponse(ready=False).SerializeToString())
            call = self._channel(model.grpc_address).unary_unary(method)
            try:
                reply, outcome = call.with_call(
                    request, timeout=_deadline(context), metadata=_passed_on(context, arrived)
                )
            except grpc.RpcError as exc:
                context.set_trailing_metadata(exc.trailing_metadata() or ())
                _end(context, exc.code(), exc.details() or f"model {model.name}: {exc.code().name}")
            context.set_trailing_metadata(outcome.trailing_metadata() or ())
            return bytes(reply)

        return forward

    def _served(self, name: str, context: Any, ready_call: bool = False) -> HostModel | None:
        """The model `name` (or alias) names, if it is serving; else the call ends NOT_FOUND (not served) or
        UNAVAILABLE (loading, failed, removed); `ready_call`: None for one that is not serving."""
        model = self.view.find(name)
        if model is None:
            _end(context, grpc.StatusCode.NOT_FOUND, self.view.unknown(name))
        if model.state == READY and model.grpc_address:
            return model
        if ready_call:
            return None
        why = unavailable(model) if model.state != READY else f"model {model.name} serves no gRPC here (no address)"
        _end(context, grpc.StatusCode.UNAVAILABLE, why)

    def _channel(self, address: str) -> Any:
        with self._lock:
            channel = self._channels.get(address)
            if channel is None:
                channel = self._channels[address] = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
            return channel

    # -- calls about the host ------------------------------------------------------------------

    def server_live(self, request: bytes, context: Any) -> bytes:
        return bytes(pb.ServerLiveResponse(live=True).SerializeToString())

    def server_ready(self, request: bytes, context: Any) -> bytes:
        return bytes(pb.ServerReadyResponse(ready=not not_ready(self.view.models())).SerializeToString())

    def server_metadata(self, request: bytes, context: Any) -> bytes:
        reply = pb.ServerMetadataResponse(name=SERVER_NAME, version=__version__, extensions=EXTENSIONS)
        return bytes(reply.SerializeToString())

    def repository_index(self, request: bytes, context: Any) -> bytes:
        ready = pb.RepositoryIndexRequest.FromString(request).ready
        listed = repository_index(self.view.models(), b'{"ready": true}' if ready else b"")
        entries = [pb.RepositoryIndexResponse.ModelIndex(**entry) for entry in listed]
        return bytes(pb.RepositoryIndexResponse(models=entries).SerializeToString())

    def health_check(self, request: bytes, context: Any) -> bytes:
        """grpc.health.v1: the host ("" or the service) as its readiness; a model (name or alias) as its state."""
        service = health_pb2.HealthCheckRequest.FromString(request).service
        if service in ("", SERVICE):
            serving = not not_ready(self.view.models())
        else:
            model = self.view.find(service)
            if model is None:
                _end(context, grpc.StatusCode.NOT_FOUND, self.view.unknown(service))
            serving = model.state == READY
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        return bytes(health_pb2.HealthCheckResponse(status=status).SerializeToString())

    def close(self) -> None:
        with self._lock:
            for channel in self._channels.values():
                channel.close()


def _end(context: Any, code: grpc.StatusCode, message: str) -> NoReturn:
    """End the call with `code` and `message` (grpc's abort raises; this says so to the type checker)."""
    context.abort(code, message)
    raise AssertionError("grpc's abort returned")


def _deadline(context: Any) -> float | None:
    """What is left of the call's deadline, for the call to the pool; None when it has none (grpc then says
    the time left until its "infinite future", which as a timeout would overflow into one already past)."""
    remaining: float = context.time_remaining()
    return remaining if remaining < NO_DEADLINE_SECONDS else None


def _passed_on(context: Any, arrived: float) -> list[tuple[str, str | bytes]]:
    """The call's metadata for the pool, and when it reached the host (unless a proxy stamped it earlier)."""
    metadata = [(key, value) for key, value in context.invocation_metadata() if not key.startswith(_NOT_PASSED)]
    if not any(key == "x-request-start" for key, _ in metadata):
        metadata.append(("x-request-start", f"t={arrived:.6f}"))
    return metadata


def serve(bind: str, run_dir: Path, max_body_bytes: int, grace: float) -> int:
    """Route calls on `bind` until SIGTERM / SIGINT; then the calls in flight finish (at most `grace` s)."""
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            return  # nothing to re-read: host.json is read per call
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, on_signal)
    router = Router(HostView(run_dir))
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=CALL_THREADS, thread_name_prefix="grpc-route"),
        handlers=[router],
        options=[
            ("grpc.so_reuseport", 0),  # one router: a second process on the port is a mistake, not a peer
            ("grpc.max_receive_message_length", message_limit(max_body_bytes)),
            ("grpc.max_send_message_length", -1),
        ],
    )
    if server.add_insecure_port(bind) == 0:
        log.error("gRPC router: cannot listen on %s ([server] grpc_bind)", bind)
        return 1
    server.start()
    log.info("gRPC router: listening on %s for every model of the host", bind)
    stop.wait()
    server.stop(grace).wait()
    router.close()
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m onnxpool.host.grpc_router")
    parser.add_argument("--bind", help="HOST:PORT (default: the file's [server] grpc_bind)")
    args = parser.parse_args(argv)
    settings = load_settings(pool="").settings  # the host's file ($ONNXPOOL_CONFIG), as the host read it
    logging.config.dictConfig(logs.logconfig_dict(settings.logging))
    run_dir = Path(os.environ[ENV_HOST_DIR])
    server = settings.server
    bind = args.bind or server.grpc_bind
    if not bind:
        raise SystemExit("onnxpool: error: no [server] grpc_bind: nothing to listen on")
    raise SystemExit(serve(bind, run_dir, server.max_body_bytes, float(server.graceful_timeout)))


if __name__ == "__main__":
    main()
