"""gRPC behind onnxpool's nginx ([nginx] grpc_listen): the rendered site, and a real nginx in front of a real
server, called with tritonclient.grpc unchanged."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb  # onnxpool's own protos would clash with its in one process
from tritonclient.utils import InferenceServerException

from onnxpool.config.callers import caller_book_of
from onnxpool.config.loader import ConfigError, load_settings
from onnxpool.config.nginx import render_site
from onnxpool.config.settings import NginxSettings, ServerSettings, Settings
from onnxpool.measure.servers import wait_http_ok
from tests.deploy_harness import nginx_binary, stop_together
from tests.harness import REPO, clean_env, free_port, spawn_logged

IRIS = REPO / "models" / "iris"
ROW = np.array([[5.1, 3.5, 1.4, 0.2]], dtype=np.float32)
MAX_BODY = 1_000_000


def test_no_grpc_server_unless_grpc_listen_is_set() -> None:
    assert "grpc_pass" not in render_site(Settings(server=ServerSettings(grpc_bind="127.0.0.1:8001")))


def test_the_grpc_server_follows_the_settings() -> None:
    settings = Settings(
        server=ServerSettings(grpc_bind="127.0.0.1:9001", max_body_bytes=2_000_000, timeout=45),
        nginx=NginxSettings(grpc_listen="8001", grpc_upstreams=("10.0.0.1:8001", "10.0.0.2:8001")),
    )
    site = render_site(settings)
    assert "listen 8001 http2;" in site
    assert "server 10.0.0.1:8001 max_fails=3 fail_timeout=10s;" in site and "127.0.0.1:9001" not in site
    grpc = site.split("listen 8001 http2;")[1]
    assert "grpc_pass grpc://onnxpool_grpc;" in grpc and "client_max_body_size 2000000;" in grpc
    assert 'grpc_set_header X-Request-Start "t=${msec}";' in grpc
    assert "grpc_read_timeout 45s;" in grpc and "add_header grpc-status 14 always;" in grpc
    only_bind = render_site(
        Settings(server=ServerSettings(grpc_bind="127.0.0.1:9001"), nginx=NginxSettings(grpc_listen="8001"))
    )
    assert "server 127.0.0.1:9001 max_fails=3" in only_bind


def test_grpc_listen_without_an_address_to_pass_to_is_refused() -> None:
    with pytest.raises(ConfigError, match="grpc_listen"):
        load_settings(environ={}, overrides={"nginx.grpc_listen": "8001"})
    with pytest.raises(ConfigError, match="grpc_upstreams"):
        load_settings(environ={}, overrides={"nginx.grpc_upstreams": ["unix:/run/x.sock"]})


def test_callers_quotas_answer_resource_exhausted_on_grpc() -> None:
    settings = Settings.model_validate(
        {
            "server": {"grpc_bind": "127.0.0.1:9001"},
            "nginx": {"grpc_listen": "8001"},
            "callers": {"identify": "header"},
            "caller": {"limited": {"rate": 1}},
        }
    )
    grpc = render_site(settings, callers=caller_book_of(settings)).split("listen 8001 http2;")[1]
    assert "limit_req zone=onnxpool_rate_limited_" in grpc
    assert "grpc_set_header X-Onnxpool-Caller $onnxpool_caller_found;" in grpc
    assert "add_header grpc-status 8 always;" in grpc and "is over its quota" in grpc


@dataclass
class Front:
    grpc: str
    serve: subprocess.Popen[bytes]
    nginx: subprocess.Popen[bytes]
    folder: Path


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Front]:
    """iris served by `onnxpool serve` with gRPC on, `onnxpool nginx` in front of both protocols."""
    if nginx_binary() is None:
        pytest.skip("nginx is not installed")
    folder = tmp_path_factory.mktemp("nginx-grpc")
    port, grpc_port, front_port, front_grpc = (free_port() for _ in range(4))
    config = folder / "iris.toml"
    config.write_text(
        f'[server]\nbind = "127.0.0.1:{port}"\ngrpc_bind = "127.0.0.1:{grpc_port}"\nworkers = 1\n'
        f"max_body_bytes = {MAX_BODY}\n\n"
        f'[model]\nname = "iris"\npath = "{IRIS / "model.onnx"}"\ntask = "tabular"\nwarmup_runs = 1\n\n'
        f'[task]\nlabels = "{IRIS / "labels.txt"}"\n'
        'features = ["sepal_length", "sepal_width", "petal_length", "petal_width"]\n\n'
        f'[nginx]\nlisten = "127.0.0.1:{front_port}"\ngrpc_listen = "127.0.0.1:{front_grpc}"\n'
        f'pidfile = "{folder / "nginx" / "nginx.pid"}"\naccess_log = ""\n\n'
        '[callers]\nidentify = "header"\nheader = "X-Team"\n\n[caller.limited]\nrate = 1\n',
        encoding="utf-8",
    )
    env = clean_env({"ONNXPOOL_CONFIG": str(config), "PYTHONUNBUFFERED": "1"})
    serve = spawn_logged([sys.executable, "-m", "onnxpool.cli", "serve"], folder / "serve.log", env)
    nginx = spawn_logged([sys.executable, "-m", "onnxpool.cli", "nginx"], folder / "nginx.log", env)
    try:
        wait_http_ok(f"http://127.0.0.1:{front_port}/v2/health/ready", serve, folder / "serve.log")
        yield Front(f"127.0.0.1:{front_grpc}", serve, nginx, folder)
    finally:
        stop_together(nginx, serve)


def _infer(client: grpcclient.InferenceServerClient, headers: dict[str, str] | None = None) -> grpcclient.InferResult:
    tensor = grpcclient.InferInput("input", list(ROW.shape), "FP32")
    tensor.set_data_from_numpy(ROW)
    return client.infer("iris", [tensor], headers=headers)


@pytest.mark.slow
@pytest.mark.nginx
def test_tritonclient_grpc_through_nginx(front: Front) -> None:
    client = grpcclient.InferenceServerClient(front.grpc)
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("iris")
    assert client.get_model_metadata("iris").name == "iris"
    probabilities = _infer(client).as_numpy("probabilities")
    assert probabilities is not None and probabilities.shape == (1, 3)
    assert int(np.argmax(probabilities)) == 0  # a setosa
    # nginx passes the caller's request id on (the worker echoes it), and invents one when there is none.
    with grpc.insecure_channel(front.grpc) as channel:
        ready = channel.unary_unary(
            "/inference.GRPCInferenceService/ServerReady",
            request_serializer=pb.ServerReadyRequest.SerializeToString,
            response_deserializer=pb.ServerReadyResponse.FromString,
        )
        reply, call = ready.with_call(pb.ServerReadyRequest(), metadata=(("x-request-id", "through-nginx-1"),))
        assert reply.ready and ("x-request-id", "through-nginx-1") in call.trailing_metadata()
        _, call = ready.with_call(pb.ServerReadyRequest())
        assert len(dict(call.trailing_metadata())["x-request-id"]) == 32  # nginx's $request_id


@pytest.mark.slow
@pytest.mark.nginx
def test_a_callers_quota_is_resource_exhausted_naming_the_caller_and_the_wait(front: Front) -> None:
    client = grpcclient.InferenceServerClient(front.grpc)
    codes = []
    for _ in range(3):
        try:
            _infer(client, {"x-team": "limited"})
            codes.append("OK")
        except InferenceServerException as exc:
            codes.append(str(exc.status()))
            refused = exc
    assert codes[0] == "OK" and "StatusCode.RESOURCE_EXHAUSTED" in codes[1:], codes
    assert "caller limited is over its quota" in refused.message() and "retry after 1 s" in refused.message()
    _infer(client, {"x-team": "someone-else"})  # others are not limited


@pytest.mark.slow
@pytest.mark.nginx
def test_a_message_over_the_limit_is_refused_by_nginx_as_resource_exhausted(front: Front) -> None:
    client = grpcclient.InferenceServerClient(front.grpc)
    rows = np.zeros((MAX_BODY // 16 + 1000, 4), np.float32)  # ~16 bytes a row: past max_body_bytes
    tensor = grpcclient.InferInput("input", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows)
    with pytest.raises(InferenceServerException) as refused:
        client.infer("iris", [tensor])
    assert refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED", refused.value
    assert f"larger than {MAX_BODY} bytes ([server] max_body_bytes)" in refused.value.message()


@pytest.mark.slow
@pytest.mark.nginx
def test_no_instance_behind_nginx_is_unavailable(front: Front) -> None:
    """nginx's own 502 (last: this stops the server) is a gRPC status, not a page."""
    os.killpg(front.serve.pid, signal.SIGKILL)  # its own group (spawn_logged): master and workers at once
    front.serve.wait(30)
    client = grpcclient.InferenceServerClient(front.grpc)
    with pytest.raises(InferenceServerException) as refused:
        _infer(client)
    assert refused.value.status() == "StatusCode.UNAVAILABLE", refused.value
    assert "no onnxpool instance is available" in refused.value.message()
