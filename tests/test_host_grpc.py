"""A several-models host's one gRPC port ([server] grpc_bind of the host file): its router sends each call to
the pool of the model it names (host/grpc_router.py), read from the message's field 1 (host/grpc_wire.py).

Through a real host (supervisord, a gunicorn pool per model, the router) with tritonclient.grpc unchanged.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb  # onnxpool's own protos would clash with its in one process
from tritonclient.utils import InferenceServerException

from onnxpool.server.grpc_proto import health_pb2, health_pb2_grpc
from tests.harness import free_port
from tests.host_harness import (
    HOST_TEST_MARKS,
    SETOSA,
    Host,
    image_table,
    iris_table,
    one_worker,
    start_host,
    states,
    write_settings,
)
from tests.tiny_models import build_tiny_model

pytestmark = HOST_TEST_MARKS

# --- through a real host -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def grpc_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Host, str]]:
    folder = tmp_path_factory.mktemp("host-grpc")
    address = f"127.0.0.1:{free_port()}"
    config = write_settings(
        folder / "host.toml",
        iris_table("iris", one_worker(0.5) + 'aliases = ["flowers"]\n'),
        image_table("tiny", build_tiny_model(folder / "tiny.onnx", bias=0.0), one_worker(0.5)),
        # Listed, never served: its file is missing (optional, so the others serve and the host is ready).
        f'[models.gone]\npath = "{folder / "missing.onnx"}"\ntask = "tabular"\noptional = true\n',
        server=f'grpc_bind = "{address}"\n',
    )
    host = start_host(folder, config)
    try:
        yield host, address
    finally:
        host.stop()
    assert host.left == [], f"the host left behind: {host.left}"


def _iris(client: grpcclient.InferenceServerClient, name: str = "iris") -> np.ndarray:
    tensor = grpcclient.InferInput("input", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.array([SETOSA], dtype=np.float32))
    probabilities: np.ndarray | None = client.infer(name, [tensor]).as_numpy("probabilities")
    assert probabilities is not None
    return probabilities


def _tiny(client: grpcclient.InferenceServerClient) -> np.ndarray:
    metadata = client.get_model_metadata("tiny")
    tensor = grpcclient.InferInput(metadata.inputs[0].name, [1, 3, 224, 224], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 3, 224, 224), np.float32))
    result = client.infer("tiny", [tensor])
    output: np.ndarray | None = result.as_numpy(metadata.outputs[0].name)
    assert output is not None
    return output


def test_every_model_by_name_on_the_hosts_one_port(grpc_host: tuple[Host, str]) -> None:
    host, address = grpc_host
    client = grpcclient.InferenceServerClient(address)
    assert client.is_server_live() and client.is_server_ready()
    assert client.get_server_metadata().name == "onnxpool"
    assert int(np.argmax(_iris(client))) == 0 and int(np.argmax(_iris(client, "flowers"))) == 0  # by alias too
    assert _tiny(client).shape[0] == 1
    assert client.is_model_ready("iris") and client.is_model_ready("tiny")
    assert client.get_model_config("iris").config.name == "iris"
    index = {model.name: model.state for model in client.get_model_repository_index().models}
    assert index == {"iris": "READY", "tiny": "READY", "gone": "UNAVAILABLE"}
    with pytest.raises(InferenceServerException) as unknown:
        client.get_model_metadata("nope")
    assert unknown.value.status() == "StatusCode.NOT_FOUND"
    assert unknown.value.message() == "unknown model 'nope'; this host serves: iris, tiny, gone"
    with pytest.raises(InferenceServerException) as unknown_infer:
        _iris(client, "nope")
    assert "this host serves: iris, tiny, gone" in unknown_infer.value.message()
    # A model the host lists but does not serve: UNAVAILABLE with its reason; ModelReady says false.
    assert not client.is_model_ready("gone")
    with pytest.raises(InferenceServerException) as gone:
        _iris(client, "gone")
    assert gone.value.status() == "StatusCode.UNAVAILABLE"
    assert "model gone is UNAVAILABLE" in gone.value.message() and "missing.onnx" in gone.value.message()
    # Each pool's own gRPC port is a loopback one, in host.json for whoever routes.
    pools = host.host_json()
    assert all(str(pools[name]["grpc_address"]).startswith("127.0.0.1:") for name in ("iris", "tiny"))
    assert "gRPC: the router on" in host.log()


def test_grpc_health_answers_for_the_host_and_each_model(grpc_host: tuple[Host, str]) -> None:
    _, address = grpc_host
    with grpc.insecure_channel(address) as channel:
        check = health_pb2_grpc.HealthStub(channel).Check
        serving = health_pb2.HealthCheckResponse.SERVING
        for service in ("", "inference.GRPCInferenceService", "iris", "flowers", "tiny"):
            assert check(health_pb2.HealthCheckRequest(service=service), timeout=5).status == serving, service
        not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
        assert check(health_pb2.HealthCheckRequest(service="gone"), timeout=5).status == not_serving
        with pytest.raises(grpc.RpcError) as unknown:
            check(health_pb2.HealthCheckRequest(service="nope"), timeout=5)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND


def test_metadata_and_deadline_go_through_the_router(grpc_host: tuple[Host, str]) -> None:
    _, address = grpc_host
    with grpc.insecure_channel(address) as channel:
        ready = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelReady",
            request_serializer=pb.ModelReadyRequest.SerializeToString,
            response_deserializer=pb.ModelReadyResponse.FromString,
        )
        reply, call = ready.with_call(
            pb.ModelReadyRequest(name="iris"), metadata=(("x-request-id", "routed-1"),), timeout=5
        )
        assert reply.ready and ("x-request-id", "routed-1") in call.trailing_metadata()
        stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        with pytest.raises(grpc.RpcError) as unimplemented:
            list(stream(iter([b""]), timeout=5))
        assert unimplemented.value.code() == grpc.StatusCode.UNIMPLEMENTED


@contextmanager
def looping_on_iris(address: str) -> Iterator[tuple[list[int], list[str]]]:
    """A tritonclient.grpc client on a channel of its own, calling iris through the host's port until the block
    ends: (answers, failures)."""
    answers: list[int] = []
    failures: list[str] = []
    stop = threading.Event()

    def run() -> None:
        with grpcclient.InferenceServerClient(address) as client:
            while not stop.is_set():
                try:
                    answers.append(int(np.argmax(_iris(client))))
                except InferenceServerException as exc:
                    failures.append(f"{time.time():.3f} {exc.status()}: {exc.message()}")

    thread = threading.Thread(target=run)
    thread.start()
    try:
        yield answers, failures
    finally:
        stop.set()
        thread.join(30)


def test_a_pool_restart_and_a_hup_keep_its_grpc_port(grpc_host: tuple[Host, str]) -> None:
    """Last of the module: kills a worker of tiny, then tiny's pool master, then HUPs the host, while a client
    loops on iris through the same port: it loses nothing."""
    host, address = grpc_host
    with looping_on_iris(address) as (answers, failures):
        _tiny_killed_and_back(host, address)
        time.sleep(1.0)
    print(f"\niris over gRPC while tiny's worker and master were killed and the host HUPed: "
          f"{len(answers)} answered, {len(failures)} failed")  # fmt: skip
    assert failures == [], failures[:5]
    assert len(answers) > 50 and set(answers) == {0}


def answers_tiny(client: grpcclient.InferenceServerClient) -> bool:
    try:
        return bool(_tiny(client).shape[0] == 1)
    except InferenceServerException:
        return False


def _tiny_killed_and_back(host: Host, address: str) -> None:
    client = grpcclient.InferenceServerClient(address)
    before = host.host_json()["tiny"]["grpc_address"]
    (worker,) = host.workers("tiny")
    os.kill(worker, signal.SIGKILL)
    host.wait_for("tiny's worker replaced", lambda: bool(host.workers("tiny")) and worker not in host.workers("tiny"))
    # Its one worker was tiny's only gRPC listener (each worker listens on the port, SO_REUSEPORT): a call
    # in between is refused UNAVAILABLE, which DEPLOYING's retrying channel retries.
    host.wait_for("tiny on gRPC again", lambda: answers_tiny(client))
    master = host.masters()["tiny"]
    os.kill(master, signal.SIGKILL)
    unavailable_seen = False
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            if host.masters().get("tiny", master) != master and states(host)["tiny"] == "READY":
                _tiny(client)
                break
        except InferenceServerException as exc:
            unavailable_seen |= exc.status() == "StatusCode.UNAVAILABLE"
        except (KeyError, ValueError, OSError):
            pass
        time.sleep(0.2)
    else:
        raise AssertionError(f"tiny not back on gRPC after its pool's restart\n{host.log()[-3000:]}")
    assert host.host_json()["tiny"]["grpc_address"] == before
    mark = len(host.log())
    host.server.signal(signal.SIGHUP)
    host.wait_for("the reload", lambda: "reload: applied" in host.log()[mark:])
    assert host.host_json()["tiny"]["grpc_address"] == before
    assert _tiny(client).shape[0] == 1 and int(np.argmax(_iris(client))) == 0
