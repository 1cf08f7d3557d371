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
- Stop without losing a call. gRPC's `server.stop` sends each client a GOAWAY and cancels every
  call that has reached the server but no handler thread yet; and a client that starts a call
  while the GOAWAY is on its way loses it too (grpc's client fails such a call with a large
  message, "Stream removed", instead of retrying it: a 600 KB call in about 1.5 % of GOAWAYs,
  measured with plain grpcio). A HUP under load lost about one call in two hand-overs that way.
  So a worker leaves in four steps (`GrpcServer.stop`). (1) Its listening socket is closed
  (`_close_listeners`): the kernel gives new connections to the other workers on the port, a
  HUP's new ones included. (2) Replies are held (`ReplyGate`) for `SETTLE_SECONDS`: each call a
  client has sent reaches a handler thread meanwhile, and a client that waits for its replies
  (a synchronous backend, one call in flight per caller) sends no new call. (3) `server.stop`:
  the GOAWAY goes out while nobody is sending, and there is nothing unmatched to cancel. (4)
  Replies flow again, behind the GOAWAY on the same connection, so each client's next call
  goes to a new connection (another worker). The calls in flight finish within `[server]
  graceful_timeout`; the worker's main loop keeps running handed-off calls until they have
  (workers/handoff.py). A client that sends without waiting for replies (many async calls on
  one channel) can still race the GOAWAY; behind onnxpool's nginx every call has a connection
  of its own, and nothing can.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from concurrent import futures
from typing import TYPE_CHECKING, Any

import grpc

from onnxpool.config.settings import Settings
from onnxpool.server import grpc_health
from onnxpool.server.grpc_proto import grpc_service_pb2_grpc as pb_grpc
from onnxpool.server.grpc_proto import health_pb2
from onnxpool.server.grpc_service import InferenceService, RunInWorker

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIApplication

log = logging.getLogger("onnxpool.server")

SERVICE = "inference.GRPCInferenceService"
CALL_THREADS = 64
"""Threads that hold calls while they wait for the worker (and answer metadata calls): a call
holds one until its reply is written, so this bounds the calls one worker has in flight."""
SLACK_BYTES = 16 * 1024 * 1024
SETTLE_SECONDS = 0.1
"""Step (2) of a stop: long enough for calls already sent to reach a handler thread (a loopback call
of 20 MB is received in ~10 ms; a call is matched as its headers arrive)."""


def _listening_sockets(port: int) -> list[int]:
    """This process's listening TCP sockets on `port` (gRPC's, just made: gRPC does not say which fd)."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            probe = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        with probe:
            try:
                listening = probe.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
                bound = probe.getsockname()
            except OSError:
                continue
            if listening and probe.family in (socket.AF_INET, socket.AF_INET6) and bound[1] == port:
                found.append(fd)
    return found


def _close_listeners(fds: list[int]) -> None:
    """Close gRPC's listening sockets under it: an unbound socket takes each one's descriptor number
    (dup2), so the listener leaves the port's SO_REUSEPORT group and gRPC's poller (which watched the
    closed socket, not the number) never sees it again; gRPC's own close at the end closes the stand-in."""
    for fd in fds:
        with socket.socket() as stand_in:
            os.dup2(stand_in.fileno(), fd)


def message_limit(max_body_bytes: int) -> int:
    """gRPC's receive limit for a server whose data plane accepts `max_body_bytes` (see the module doc)."""
    return min(max(2 * max_body_bytes, max_body_bytes + SLACK_BYTES), 2**31 - 1)


class ReplyGate:
    """Holds every call's reply while a worker's gRPC server stops (step 2 of the module doc)."""

    def __init__(self) -> None:
        self._open = threading.Event()
        self._open.set()

    def hold(self) -> None:
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def wait(self) -> None:
        """A call's handler, before its reply: wait while replies are held."""
        self._open.wait()


class GrpcServer:
    """One worker's gRPC server (see the module doc)."""

    def __init__(
        self,
        server: Any,
        health_servicer: grpc_health.HealthServicer,
        gate: ReplyGate,
        grace: float,
        listeners: list[int],
    ) -> None:
        self._server = server
        self._health = health_servicer
        self._gate = gate
        self._grace = grace
        self._listeners = listeners

    def stop(self) -> threading.Event:
        """Leave in the four steps of the module doc; the event is set once the calls in flight are answered."""
        self._health.enter_graceful_shutdown()
        _close_listeners(self._listeners)
        self._gate.hold()
        time.sleep(SETTLE_SECONDS)
        stopped: threading.Event = self._server.stop(self._grace)
        self._gate.release()
        return stopped


def start(settings: Settings, app: WSGIApplication, run_in_worker: RunInWorker) -> GrpcServer:
    """Serve the Open Inference Protocol and grpc.health.v1 on `[server] grpc_bind`, in this worker."""
    server_settings, model = settings.server, settings.model
    limit = message_limit(server_settings.max_body_bytes)
    grace = float(server_settings.graceful_timeout)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=CALL_THREADS, thread_name_prefix="grpc-call"),
        options=[
            ("grpc.so_reuseport", 1),
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", -1),
        ],
    )
    gate = ReplyGate()
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(
        InferenceService(app, run_in_worker, model.name, model.version, gate.wait), server
    )
    health_servicer = grpc_health.HealthServicer()
    grpc_health.add_to_server(health_servicer, server)
    for name in ("", SERVICE, model.name, *model.aliases):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    port = server.add_insecure_port(server_settings.grpc_bind)
    if port == 0:
        raise OSError(f"gRPC could not listen on {server_settings.grpc_bind} ([server] grpc_bind)")
    server.start()
    return GrpcServer(server, health_servicer, gate, grace, _listening_sockets(port))
