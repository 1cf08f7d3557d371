"""grpc.health.v1's `Health` service for a worker's gRPC server, over the stubs in server/grpc_proto.

Its stubs are generated with the Open Inference Protocol's (tools/generate_grpc.py) rather than
taken from grpcio-health-checking, whose every release pins protobuf to a single major version
(and so would narrow onnxpool's range to it). The servicer keeps the reference one's behaviour
(grpc_health.v1.health.HealthServicer): Check answers a known service's status and NOT_FOUND for
another; Watch streams the status now and each change (SERVICE_UNKNOWN for a service not set),
without holding a call thread (grpc's `experimental_non_blocking` handler); the graceful shutdown
makes every service NOT_SERVING for good. List answers every service's status.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import grpc

from onnxpool.server.grpc_proto import health_pb2, health_pb2_grpc

Status = health_pb2.HealthCheckResponse.ServingStatus
Send = Callable[[Any], None]
"""grpc's callback for a non-blocking stream: a message to send, or None to end the stream."""


class HealthServicer(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._status: dict[str, Status] = {"": health_pb2.HealthCheckResponse.SERVING}
        self._watchers: dict[str, set[Send]] = {}
        self._shutting_down = False

    def Check(self, request: Any, context: Any) -> Any:
        with self._lock:
            status = self._status.get(request.service)
        if status is None:
            context.set_code(grpc.StatusCode.NOT_FOUND)
            return health_pb2.HealthCheckResponse()
        return health_pb2.HealthCheckResponse(status=status)

    def List(self, request: Any, context: Any) -> Any:
        with self._lock:
            statuses = dict(self._status)
        reply = health_pb2.HealthListResponse()
        for service, status in statuses.items():
            reply.statuses[service].status = status
        return reply

    def Watch(self, request: Any, context: Any, send_response_callback: Send) -> None:
        service, send = request.service, send_response_callback
        with self._lock:
            status = self._status.get(service, health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)
            send(health_pb2.HealthCheckResponse(status=status))
            self._watchers.setdefault(service, set()).add(send)

        def forget() -> None:
            with self._lock:
                self._watchers[service].discard(send)
            send(None)

        context.add_callback(forget)

    # grpc calls a handler so marked with a send callback and returns its thread at once.
    Watch.experimental_non_blocking = True  # type: ignore[attr-defined]
    Watch.experimental_thread_pool = None  # type: ignore[attr-defined]

    def set(self, service: str, status: Status) -> None:
        """Set a service's status and tell its watchers; ignored once the graceful shutdown began."""
        with self._lock:
            if not self._shutting_down:
                self._set(service, status)

    def enter_graceful_shutdown(self) -> None:
        """Every service NOT_SERVING, for good (the worker is leaving)."""
        with self._lock:
            for service in list(self._status):
                self._set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
            self._shutting_down = True

    def _set(self, service: str, status: Status) -> None:
        self._status[service] = status
        for send in self._watchers.get(service, ()):
            send(health_pb2.HealthCheckResponse(status=status))


def add_to_server(servicer: HealthServicer, server: Any) -> None:
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
