"""gRPC (`[server] grpc_bind`): the Open Inference Protocol's other transport, against real servers.

tritonclient.grpc unchanged (sync and asyncio), KServe's own stubs (from KServe's proto, in a process
of their own), grpc.health.v1; FP32 and BYTES tensors; the REST rules on gRPC: API keys, a call over
the body limit, a shed call, a call in flight during SIGTERM, a HUP under a gRPC load, a worker
killed under a gRPC load (with the client retry policy DEPLOYING recommends).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as tgrpc
import tritonclient.grpc.aio as tgrpc_aio
import tritonclient.http as thttp
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from onnxpool.server.grpc_proto import health_pb2, health_pb2_grpc
from tests.harness import MODEL_NAME, REPO, Server, free_port, proc_status, running_server
from tests.otlp_receiver import otlp_receiver
from tests.slow_model import build_slow_model, server_settings
from tests.text_models import build_text_model_folder, text_settings_file

pytestmark = pytest.mark.slow

KEY = "grpc-test-key-0123456789abcdef"
IMAGE_SHAPE = [1, 3, 224, 224]


def grpc_settings(extra: dict[str, str] | None = None) -> tuple[str, dict[str, str]]:
    """A free loopback address for gRPC and the settings that serve it (cache off unless `extra` says)."""
    address = f"127.0.0.1:{free_port()}"
    return address, {"ONNXPOOL_SERVER__GRPC_BIND": address, "ONNXPOOL_CACHE__ENABLED": "false", **(extra or {})}


def wait_for_grpc(server: Server, address: str, workers: int, timeout: float = 30.0) -> None:
    """Every worker's gRPC listening (its log line), and the server answering ServerReady."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.log().count("gRPC: worker pid=") >= workers:
            with tgrpc.InferenceServerClient(address) as client:
                if client.is_server_ready():
                    return
        time.sleep(0.1)
    raise TimeoutError(f"gRPC on {address} not ready:\n{server.log()[-3000:]}")


def image_input(seed: int = 0, batch: int = 1) -> tuple[np.ndarray, tgrpc.InferInput]:
    image = np.random.default_rng(seed).random([batch, *IMAGE_SHAPE[1:]], dtype=np.float32)
    tensor = tgrpc.InferInput("input", list(image.shape), "FP32")
    tensor.set_data_from_numpy(image)
    return image, tensor


def rest_logits(server: Server, image: np.ndarray) -> np.ndarray:
    """The same tensor through v2 REST with binary tensors (tritonclient.http): the reference."""
    with thttp.InferenceServerClient(server.url.removeprefix("http://")) as client:
        tensor = thttp.InferInput("input", list(image.shape), "FP32")
        tensor.set_data_from_numpy(image, binary_data=True)
        output = thttp.InferRequestedOutput("logits", binary_data=True)
        logits: np.ndarray = client.infer(MODEL_NAME, [tensor], outputs=[output]).as_numpy("logits")
        return logits


@pytest.fixture(scope="module")
def image_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str]]:
    # A 20 MB tensor (batch 35) is within these limits; the text server below keeps the default 16 MiB.
    address, settings = grpc_settings(
        {"ONNXPOOL_SERVER__WORKERS": "2", "ONNXPOOL_SERVER__MAX_BODY_BYTES": str(32 << 20),
         "ONNXPOOL_LIMITS__MAX_BATCH": "64"}
    )  # fmt: skip
    folder = tmp_path_factory.mktemp("grpc-image")
    config = folder / "onnxpool.toml"  # the HUP test changes a setting in it
    config.write_text("[server]\ngraceful_timeout = 10\n", encoding="utf-8")
    with running_server(folder, settings, workers=2, config=config) as server:
        wait_for_grpc(server, address, 2)
        yield server, address


def test_tritonclient_grpc_unchanged(image_server: tuple[Server, str]) -> None:
    server, address = image_server
    with tgrpc.InferenceServerClient(address) as client:
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(MODEL_NAME)
        metadata = client.get_model_metadata(MODEL_NAME, as_json=True)
        assert metadata["name"] == MODEL_NAME and metadata["platform"] == "onnxruntime_onnx"
        assert metadata["inputs"] == [{"name": "input", "datatype": "FP32", "shape": ["-1", "3", "224", "224"]}]
        config = client.get_model_config(MODEL_NAME, as_json=True)["config"]
        assert config["input"][0]["data_type"] == "TYPE_FP32" and config["output"][0]["name"] == "logits"
        index = client.get_model_repository_index(as_json=True)["models"]
        assert index == [{"name": MODEL_NAME, "version": "1", "state": "READY"}]
        assert client.get_server_metadata().name == "onnxpool"
        image, tensor = image_input(1)
        result = client.infer(MODEL_NAME, [tensor], request_id="call-1")
        assert result.get_response().id == "call-1"
        assert np.allclose(result.as_numpy("logits"), rest_logits(server, image), atol=1e-5)
        # Asking for one output by name, with a request-level parameter, as REST takes them (`timeout`:
        # tritonclient's own argument; its newer releases refuse it in `parameters`, a reserved name).
        result = client.infer(MODEL_NAME, [tensor], outputs=[tgrpc.InferRequestedOutput("logits")], timeout=10_000_000)
        assert result.as_numpy("logits").shape == (1, 1000)
        # The classification extension, as REST answers it: the top classes with their labels.
        top = client.infer(MODEL_NAME, [tensor], outputs=[tgrpc.InferRequestedOutput("logits", class_count=3)])
        with thttp.InferenceServerClient(server.url.removeprefix("http://")) as rest:
            rest_tensor = thttp.InferInput("input", list(image.shape), "FP32")
            rest_tensor.set_data_from_numpy(image, binary_data=True)
            classes = thttp.InferRequestedOutput("logits", class_count=3)
            rest_top = rest.infer(MODEL_NAME, [rest_tensor], outputs=[classes])
        assert top.as_numpy("logits").tolist() == rest_top.as_numpy("logits").tolist()
        assert top.as_numpy("logits").shape == (1, 3) and top.as_numpy("logits")[0, 0].count(b":") == 2


def test_async_client(image_server: tuple[Server, str]) -> None:
    server, address = image_server
    images = [image_input(seed) for seed in range(4)]

    async def calls() -> list[np.ndarray]:
        async with tgrpc_aio.InferenceServerClient(address) as client:
            assert await client.is_model_ready(MODEL_NAME)
            replies = await asyncio.gather(*(client.infer(MODEL_NAME, [tensor]) for _, tensor in images))
            return [reply.as_numpy("logits") for reply in replies]

    for (image, _), logits in zip(images, asyncio.run(calls()), strict=True):
        assert np.allclose(logits, rest_logits(server, image), atol=1e-5)


def test_errors_carry_the_rest_message_and_the_right_code(image_server: tuple[Server, str]) -> None:
    _, address = image_server
    _, tensor = image_input()
    with tgrpc.InferenceServerClient(address) as client:
        with pytest.raises(InferenceServerException) as unknown:
            client.infer("no-such-model", [tensor])
        assert unknown.value.status() == "StatusCode.NOT_FOUND"
        assert f"this server serves: {MODEL_NAME}" in unknown.value.message()
        wrong = tgrpc.InferInput("pixels", IMAGE_SHAPE, "FP32")
        wrong.set_data_from_numpy(np.zeros(IMAGE_SHAPE, np.float32))
        with pytest.raises(InferenceServerException) as bad:
            client.infer(MODEL_NAME, [wrong])
        assert bad.value.status() == "StatusCode.INVALID_ARGUMENT" and "pixels" in bad.value.message()
    short = service_pb2.ModelInferRequest(model_name=MODEL_NAME)  # bytes for another shape
    short.inputs.add(name="input", datatype="FP32", shape=IMAGE_SHAPE)
    short.raw_input_contents.append(np.zeros([1, 3, 224, 223], np.float32).tobytes())
    with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as cut:
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(short)
    assert cut.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "input" in (cut.value.details() or "")
    # The workers lived through all of it.
    assert image_server[0].log().count("Exception in worker") == 0


def test_request_id_timing_and_metrics(image_server: tuple[Server, str]) -> None:
    server, address = image_server
    request = service_pb2.ModelInferRequest(model_name=MODEL_NAME)
    request.inputs.add(name="input", datatype="FP32", shape=IMAGE_SHAPE)
    request.raw_input_contents.append(np.zeros(IMAGE_SHAPE, np.float32).tobytes())
    with grpc.insecure_channel(address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        _, call = stub.ModelInfer.with_call(request, metadata=[("x-request-id", "grpc-rid-7")])
    trailing = dict(call.trailing_metadata())
    assert trailing["x-request-id"] == "grpc-rid-7"
    assert "infer;dur=" in trailing["server-timing"]
    metrics = requests.get(server.url + "/metrics", timeout=5).text
    assert any(
        line.startswith("onnxpool_requests_total{") and 'protocol="grpc"' in line and 'status="200"' in line
        for line in metrics.splitlines()
    )


def test_grpc_health_for_the_server_and_the_model(image_server: tuple[Server, str]) -> None:
    _, address = image_server
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", MODEL_NAME, "inference.GRPCInferenceService"):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, service
        with pytest.raises(grpc.RpcError) as unknown:
            health.Check(health_pb2.HealthCheckRequest(service="no-such-model"))
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND


def test_kserve_stubs(image_server: tuple[Server, str]) -> None:
    _, address = image_server
    script = REPO / "tests" / "kserve_stub_client.py"
    done = subprocess.run([sys.executable, str(script), address, MODEL_NAME], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    answers = json.loads(done.stdout)
    assert answers["live"] and answers["ready"] and answers["model_ready"]
    assert answers["server"] == "onnxpool" and answers["platform"] == "onnxruntime_onnx"
    typed, raw = answers["infer"]["typed"], answers["infer"]["raw"]
    assert typed["id"] == "typed" and raw["id"] == "raw"
    assert typed["shape"] == raw["shape"] == [1, 1000] and typed["argmax"] == raw["argmax"]
    assert typed["first"] == pytest.approx(raw["first"], abs=1e-6)
    assert answers["unknown_model"].startswith("NOT_FOUND: unknown model 'no-such-model'")


def test_a_20_mb_tensor_within_the_limit(image_server: tuple[Server, str]) -> None:
    _, address = image_server
    image, tensor = image_input(3, batch=35)
    assert image.nbytes > 20_000_000
    with tgrpc.InferenceServerClient(address) as client:
        assert client.infer(MODEL_NAME, [tensor]).as_numpy("logits").shape == (35, 1000)


@dataclass
class Loop:
    """What closed-loop clients got: answers, and each failure's status and message."""

    answered: list[int] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


@contextmanager
def looping_clients(address: str, clients: int, channel_args: list[tuple[str, Any]] | None = None) -> Iterator[Loop]:
    """`clients` tritonclient.grpc clients, each on its own channel, calling the image model until the block ends."""
    loop, stop = Loop(), threading.Event()

    def run(seed: int) -> None:
        _, tensor = image_input(seed)
        with tgrpc.InferenceServerClient(address, channel_args=channel_args) as client:
            while not stop.is_set():
                try:
                    client.infer(MODEL_NAME, [tensor])
                    loop.answered.append(1)
                except InferenceServerException as exc:
                    loop.failures.append(f"{exc.status()}: {exc.message()}")

    threads = [threading.Thread(target=run, args=(seed,)) for seed in range(clients)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(1.0)
        yield loop
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)


def test_hup_under_a_grpc_load_loses_nothing(image_server: tuple[Server, str]) -> None:
    server, address = image_server
    before = set(server.ready_workers())
    with looping_clients(address, 3) as loop:
        config = Path(server.env["ONNXPOOL_CONFIG"])
        config.write_text("[server]\ngraceful_timeout = 11\n", encoding="utf-8")  # a changed setting: new workers
        server.signal(signal.SIGHUP)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (
            server.log().count("gRPC: worker pid=") < 4 or before & set(server.workers())
        ):
            time.sleep(0.1)
        assert not before & set(server.workers()), "the old workers were not replaced"
        time.sleep(2.0)
    assert not loop.failures, loop.failures[:5]
    assert len(loop.answered) > 20


RETRY_POLICY = {
    "methodConfig": [
        {
            "name": [{"service": "inference.GRPCInferenceService"}],
            "retryPolicy": {
                "maxAttempts": 5,
                "initialBackoff": "0.05s",
                "maxBackoff": "1s",
                "backoffMultiplier": 2,
                "retryableStatusCodes": ["UNAVAILABLE"],
            },
        }
    ]
}
RETRYING_CHANNEL = [
    ("grpc.max_send_message_length", 2**31 - 1),  # tritonclient's own defaults, which channel_args replace
    ("grpc.max_receive_message_length", 2**31 - 1),
    ("grpc.enable_retries", 1),
    ("grpc.service_config", json.dumps(RETRY_POLICY)),
    # grpc retries only a call it still holds whole; its default 256 KiB would not hold one image (602 KB)
    ("grpc.per_rpc_retry_buffer_size", 16 << 20),
    ("grpc.retry_buffer_size", 64 << 20),
]
"""The client channel docs/DEPLOYING.md ("gRPC", a worker that dies) recommends."""


def test_a_killed_worker_costs_a_retrying_client_nothing(image_server: tuple[Server, str]) -> None:
    """kill -9 of a worker under a 4-client load: its calls in flight fail UNAVAILABLE and are retried elsewhere.

    Without the retry policy the same kills failed 13-16 calls in 3 kills (measured by hand): the
    calls on the dead worker's connections, within ~15 ms of each kill.
    """
    server, address = image_server
    with looping_clients(address, 4, RETRYING_CHANNEL) as loop:
        for _ in range(2):
            victim, listening = server.ready_workers()[0], server.log().count("gRPC: worker pid=")
            os.kill(victim, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and (
                victim in server.workers() or server.log().count("gRPC: worker pid=") <= listening
            ):
                time.sleep(0.1)
            assert victim not in server.workers() and server.log().count("gRPC: worker pid=") > listening
            time.sleep(1.0)  # the load goes on over the new worker
        answered_before_end = len(loop.answered)
        time.sleep(1.0)
        assert len(loop.answered) > answered_before_end, "the clients stopped being answered"
    assert not loop.failures, loop.failures[:5]


@pytest.fixture(scope="module")
def text_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str]]:
    """A text-embedding model (strings in: BYTES), with an API key and the default 16 MiB body limit."""
    folder = build_text_model_folder(tmp_path_factory.mktemp("grpc-text") / "model")
    address, settings = grpc_settings({"ONNXPOOL_SERVER__WORKERS": "1"})
    config = text_settings_file(folder, "text-embedding", KEY)
    with running_server(folder, settings, config=config, workers=1) as server:
        wait_for_grpc(server, address, 1)
        yield server, address


def test_bytes_tensors_and_api_keys(text_server: tuple[Server, str]) -> None:
    server, address = text_server
    texts = np.array([b"hello world", b"the cat sat on the mat"], dtype=object)
    auth = {"authorization": f"Bearer {KEY}"}
    with thttp.InferenceServerClient(server.url.removeprefix("http://")) as rest:
        text = thttp.InferInput("text", [2], "BYTES")
        text.set_data_from_numpy(texts, binary_data=True)
        expected = rest.infer("tiny-text", [text], headers={"Authorization": f"Bearer {KEY}"}).as_numpy("embedding")
    with tgrpc.InferenceServerClient(address) as client:
        tensor = tgrpc.InferInput("text", [2], "BYTES")
        tensor.set_data_from_numpy(texts)
        assert np.allclose(client.infer("tiny-text", [tensor], headers=auth).as_numpy("embedding"), expected, atol=1e-6)
        for headers in ({}, {"authorization": "Bearer wrong-key"}):
            with pytest.raises(InferenceServerException) as refused:
                client.infer("tiny-text", [tensor], headers=headers)
            assert refused.value.status() == "StatusCode.UNAUTHENTICATED", headers
            assert "API key" in refused.value.message()
        with pytest.raises(InferenceServerException) as metadata:
            client.get_model_metadata("tiny-text")
        assert metadata.value.status() == "StatusCode.UNAUTHENTICATED"
        assert client.get_model_metadata("tiny-text", headers=auth).inputs[0].datatype == "BYTES"
        assert client.is_server_ready()  # readiness stays open, as /v2/health/ready does
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service="tiny-text"))
        assert health.status == health_pb2.HealthCheckResponse.SERVING


def test_a_20_mb_tensor_over_the_limit_is_refused_by_name(text_server: tuple[Server, str]) -> None:
    _, address = text_server
    big = np.array([b"x" * (20 << 20)], dtype=object)
    with tgrpc.InferenceServerClient(address) as client:
        tensor = tgrpc.InferInput("text", [1], "BYTES")
        tensor.set_data_from_numpy(big)
        with pytest.raises(InferenceServerException) as refused:
            client.infer("tiny-text", [tensor], headers={"authorization": f"Bearer {KEY}"})
    assert refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert "[server] max_body_bytes" in refused.value.message() and str(16 << 20) in refused.value.message()


SLOW_ITERATIONS = 50_000  # ~50 ms an inference


def slow_request(iterations: int) -> list[tgrpc.InferInput]:
    n = tgrpc.InferInput("n", [1], "INT64")
    n.set_data_from_numpy(np.array([iterations], np.int64))
    x = tgrpc.InferInput("x", [1], "FP32")
    x.set_data_from_numpy(np.zeros(1, np.float32))
    return [n, x]


def test_shed_calls_and_a_call_in_flight_during_sigterm(tmp_path: Path) -> None:
    model = build_slow_model(tmp_path / "slow.onnx")
    address, settings = grpc_settings(
        server_settings(model) | {"ONNXPOOL_SERVER__WORKERS": "1", "ONNXPOOL_LIMITS__MAX_QUEUE_MS": "100"}
    )
    with running_server(tmp_path, settings, workers=1) as server:
        wait_for_grpc(server, address, 1)
        codes: list[str] = []
        messages: list[str] = []
        lock = threading.Lock()

        def call() -> None:
            with tgrpc.InferenceServerClient(address) as client:
                try:
                    client.infer("slow", slow_request(SLOW_ITERATIONS))
                    outcome, message = "OK", ""
                except InferenceServerException as exc:
                    outcome, message = str(exc.status()), exc.message() or ""
            with lock:
                codes.append(outcome)
                messages.append(message)

        # 12 calls at once on one worker, ~50 ms each: those that waited past 100 ms are shed.
        threads = [threading.Thread(target=call) for _ in range(12)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert set(codes) <= {"OK", "StatusCode.UNAVAILABLE"}, codes
        assert "OK" in codes and "StatusCode.UNAVAILABLE" in codes, codes
        shed = [m for m, c in zip(messages, codes, strict=True) if c == "StatusCode.UNAVAILABLE"]
        assert all("request shed" in m and "max_queue_ms" in m for m in shed), shed[:2]
        # A call whose own deadline is shorter than its wait is shed by that deadline.
        with tgrpc.InferenceServerClient(address) as client:
            busy = threading.Thread(target=lambda: client.infer("slow", slow_request(SLOW_ITERATIONS * 10)))
            busy.start()
            time.sleep(0.1)
            with pytest.raises(InferenceServerException) as late:
                client.infer("slow", slow_request(1), client_timeout=0.2)
            busy.join(30)
        assert late.value.status() in ("StatusCode.DEADLINE_EXCEEDED", "StatusCode.UNAVAILABLE")
        # A shed call says when to come back as gRPC's pushback too, which a retrying client obeys.
        tensor, contents = service_pb2.ModelInferRequest.InferInputTensor, service_pb2.InferTensorContents
        request = service_pb2.ModelInferRequest(
            model_name="slow",
            inputs=[
                tensor(name="n", datatype="INT64", shape=[1], contents=contents(int64_contents=[1])),
                tensor(name="x", datatype="FP32", shape=[1], contents=contents(fp32_contents=[0])),
            ],
        )
        with tgrpc.InferenceServerClient(address) as client, grpc.insecure_channel(address) as channel:
            busy = threading.Thread(target=lambda: client.infer("slow", slow_request(SLOW_ITERATIONS * 10)))
            busy.start()
            time.sleep(0.1)
            with pytest.raises(grpc.RpcError) as shed_call:
                service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
            busy.join(30)
        assert shed_call.value.code() == grpc.StatusCode.UNAVAILABLE
        assert ("grpc-retry-pushback-ms", "1000") in [tuple(m) for m in shed_call.value.trailing_metadata()]

        # SIGTERM while a call is in flight (~1 s of inference): it finishes, then the server exits.
        result: list[object] = []

        def long_call() -> None:
            with tgrpc.InferenceServerClient(address) as client:
                try:
                    result.append(client.infer("slow", slow_request(SLOW_ITERATIONS * 20)).as_numpy("y"))
                except InferenceServerException as exc:
                    result.append(exc)

        caller = threading.Thread(target=long_call)
        caller.start()
        time.sleep(0.3)
        server.process.send_signal(signal.SIGTERM)
        caller.join(30)
        assert server.process.wait(30) == 0
        assert len(result) == 1 and isinstance(result[0], np.ndarray), result
        assert float(result[0][0]) == SLOW_ITERATIONS * 20


def test_a_grpc_flood_cannot_starve_a_steady_grpc_caller(tmp_path: Path) -> None:
    """Callers named by their keys: a flood of 8 calls in flight and a steady caller with one; the steady
    caller's calls are chosen by fair share like its HTTP connections would be (workers/lanes.py)."""
    model = build_slow_model(tmp_path / "slow.onnx")
    keys = {name: f"sk-{name}-0123456789abcdef" for name in ("steady", "flood")}
    keys_file = tmp_path / "keys"
    keys_file.write_text("".join(f"{name} {key}\n" for name, key in keys.items()), encoding="utf-8")
    address, settings = grpc_settings(
        server_settings(model)
        | {"ONNXPOOL_SERVER__WORKERS": "2", "ONNXPOOL_AUTH__API_KEYS_FILE": str(keys_file),
           "ONNXPOOL_CALLERS__LANES": "2"}
    )  # fmt: skip
    answers = {"steady": 0, "flood": 0}
    failures: list[str] = []
    stop = threading.Event()
    counting = threading.Event()

    def loop(name: str) -> None:
        with tgrpc.InferenceServerClient(address) as client:
            while not stop.is_set():
                try:
                    client.infer("slow", slow_request(20_000), headers={"authorization": f"Bearer {keys[name]}"})
                except InferenceServerException as exc:
                    failures.append(f"{name}: {exc.status()} {exc.message()}")
                    continue
                if counting.is_set():
                    answers[name] += 1

    with running_server(tmp_path, settings, workers=2, lanes=2) as server:
        wait_for_grpc(server, address, 2)
        threads = [threading.Thread(target=loop, args=("flood",)) for _ in range(8)]
        threads.append(threading.Thread(target=loop, args=("steady",)))
        for thread in threads:
            thread.start()
        time.sleep(1.0)
        counting.set()
        time.sleep(4.0)
        counting.clear()
        stop.set()
        for thread in threads:
            thread.join(30)
    assert not failures, failures[:3]
    # In one queue the steady caller would have 1 of 9 calls' answers (~11 %); chosen by its share, ~45 %.
    assert answers["steady"] >= 0.25 * (answers["steady"] + answers["flood"]), answers


def test_a_callers_traceparent_carries_through_a_grpc_call(tmp_path: Path) -> None:
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    with otlp_receiver() as receiver:
        address, settings = grpc_settings(
            {"ONNXPOOL_SERVER__WORKERS": "1", "ONNXPOOL_TRACING__ENDPOINT": receiver.endpoint,
             "OTEL_BSP_SCHEDULE_DELAY": "50"}
        )  # fmt: skip
        with running_server(tmp_path, settings, workers=1) as server:
            wait_for_grpc(server, address, 1)
            request = service_pb2.ModelInferRequest(model_name=MODEL_NAME)
            request.inputs.add(name="input", datatype="FP32", shape=IMAGE_SHAPE)
            request.raw_input_contents.append(np.ones(IMAGE_SHAPE, np.float32).tobytes())
            with grpc.insecure_channel(address) as channel:
                _, call = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer.with_call(
                    request, metadata=[("traceparent", f"00-{trace_id}-{parent_id}-01")]
                )
            receiver.wait_for(lambda spans: any(s.trace_id == trace_id and s.is_server for s in spans), what="span")
    spans = receiver.trace(trace_id)
    (span,) = [s for s in spans if s.is_server]
    assert span.parent_id == parent_id and span.attributes["rpc.system"] == "grpc"
    assert span.attributes["http.route"] == "/v2/models/<model>/infer"
    assert {s.name for s in spans} >= {"decode", "infer", "encode"}
    assert dict(call.trailing_metadata())["traceparent"] == f"00-{trace_id}-{span.span_id}-01"


def test_grpc_lives_only_in_the_workers(image_server: tuple[Server, str]) -> None:
    """The master forks the workers: gRPC's core (threads, pollers) must never be loaded there."""
    server, _ = image_server
    master = Path(f"/proc/{server.pid}/maps").read_text()
    assert "cygrpc" not in master and int(proc_status(server.pid)["Threads"]) == 1
    for pid in server.workers():
        assert "cygrpc" in Path(f"/proc/{pid}/maps").read_text()
