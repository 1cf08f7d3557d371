"""The worker's gRPC server: made after fork, one per worker, all on `[server] grpc_bind`.

gRPC's core keeps threads, pollers and sockets that must not cross fork (grpc's fork-support
doc), so nothing here runs in the master: `start` is called in each worker once it is warm
(post_worker_init), and this module is imported only there. Every worker listens on the
same address with SO_REUSEPORT (`grpc.so_reuseport`, the pattern of grpc's own
multiprocessing example): the kernel spreads new connections over the workers, and a HUP's
new workers bind beside the old ones before those stop, so the port never closes.

- Message size: gRPC's own limit is set well above `[server] max_body_bytes` (twice it, and at
  least 16 MiB more) so that a call over the limit reaches the data plane's body-size gate and
  gets its RESOURCE_EXHAUSTED naming the setting; only a message past gRPC's bound gets gRPC's
  own "larger than max" refusal without reading it whole.
- Health: `grpc.health.v1.Health` says SERVING for the server (""), the service, and the model
  under its name and aliases; NOT_SERVING from the moment the worker starts to stop.
- Stop: `stop` takes no new calls and returns an event set when the calls in flight are
  answered (within `[server] graceful_timeout`); the worker's main loop keeps running their
  inferences until then (workers/handoff.py).
"""

from __future__ import annotations

import logging
import threading
from concurrent import futures
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from onnxpool.config.settings import Settings
from onnxpool.server.grpc_proto import grpc_service_pb2_grpc as pb_grpc
from onnxpool.server.grpc_service import InferenceService, RunInWorker

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIApplication

log = logging.getLogger("onnxpool.server")

SERVICE = "inference.GRPCInferenceService"
CALL_THREADS = 64
"""Threads that hold calls while they wait for the worker (and answer metadata calls): a call
holds one until its reply is written, so this bounds the calls one worker has in flight."""
SLACK_BYTES = 16 * 1024 * 1024


def message_limit(max_body_bytes: int) -> int:
    """gRPC's receive limit for a server whose data plane accepts `max_body_bytes` (see the module doc)."""
    return min(max(2 * max_body_bytes, max_body_bytes + SLACK_BYTES), 2**31 - 1)


class GrpcServer:
    """One worker's gRPC server (see the module doc)."""

    def __init__(self, server: Any, health_servicer: Any, grace: float) -> None:
        self._server = server
        self._health = health_servicer
        self._grace = grace

    def stop(self) -> threading.Event:
        self._health.enter_graceful_shutdown()
        stopped: threading.Event = self._server.stop(self._grace)
        return stopped


def start(settings: Settings, app: WSGIApplication, run_in_worker: RunInWorker) -> GrpcServer:
    """Serve the Open Inference Protocol and grpc.health.v1 on `[server] grpc_bind`, in this worker."""
    server_settings, model = settings.server, settings.model
    limit = message_limit(server_settings.max_body_bytes)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=CALL_THREADS, thread_name_prefix="grpc-call"),
        options=[
            ("grpc.so_reuseport", 1),
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", -1),
        ],
    )
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(
        InferenceService(app, run_in_worker, model.name, model.version), server
    )
    health_servicer = health.HealthServicer(experimental_non_blocking=True)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ("", SERVICE, model.name, *model.aliases):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    if server.add_insecure_port(server_settings.grpc_bind) == 0:
        raise OSError(f"gRPC could not listen on {server_settings.grpc_bind} ([server] grpc_bind)")
    server.start()
    return GrpcServer(server, health_servicer, float(server_settings.graceful_timeout))
