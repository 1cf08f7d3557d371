"""grpc.health.v1 over onnxpool's own stubs (server/grpc_health.py), called as grpc_health_probe and kubelet do.

An in-process gRPC server on a loopback port: Check, List, Watch (the status now, then each change,
without holding a call thread) and the graceful shutdown (NOT_SERVING for good).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from onnxpool.server.grpc_health import HealthServicer, add_to_server
from onnxpool.server.grpc_proto import health_pb2, health_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture
def health() -> Iterator[tuple[HealthServicer, health_pb2_grpc.HealthStub]]:
    # One call thread: a Watch that held it would leave no thread for the Checks that follow.
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    servicer = HealthServicer()
    add_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield servicer, health_pb2_grpc.HealthStub(channel)
    finally:
        channel.close()
        server.stop(None).wait()


def test_check_and_list(health: tuple[HealthServicer, health_pb2_grpc.HealthStub]) -> None:
    servicer, stub = health
    servicer.set("model", SERVING)
    assert stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status == SERVING
    assert stub.Check(health_pb2.HealthCheckRequest(service="model"), timeout=5).status == SERVING
    with pytest.raises(grpc.RpcError) as refused:
        stub.Check(health_pb2.HealthCheckRequest(service="other"), timeout=5)
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    statuses = stub.List(health_pb2.HealthListRequest(), timeout=5).statuses
    assert {name: reply.status for name, reply in statuses.items()} == {"": SERVING, "model": SERVING}


def test_watch_streams_changes_and_the_shutdown(health: tuple[HealthServicer, health_pb2_grpc.HealthStub]) -> None:
    servicer, stub = health
    watch = stub.Watch(health_pb2.HealthCheckRequest(service="model"), timeout=10)
    assert next(watch).status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
    servicer.set("model", SERVING)
    assert next(watch).status == SERVING
    # The watch holds no call thread: a Check is answered by the server's only one meanwhile.
    assert stub.Check(health_pb2.HealthCheckRequest(service="model"), timeout=5).status == SERVING
    servicer.enter_graceful_shutdown()
    assert next(watch).status == NOT_SERVING
    servicer.set("model", SERVING)  # ignored from now on
    assert stub.Check(health_pb2.HealthCheckRequest(service="model"), timeout=5).status == NOT_SERVING
    assert stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status == NOT_SERVING
    watch.cancel()
