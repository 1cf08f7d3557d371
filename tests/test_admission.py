"""`X-Request-Start` parsing, shedding in-process (metrics off) and client deadlines on a live server."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import numpy as np
import pytest
import requests
from flask import Flask

from onnxpool.config.loader import load_settings
from onnxpool.server import request_start
from onnxpool.server.app import create_app
from onnxpool.server.backend import NoBoard
from onnxpool.server.request_start import parse_request_start, seconds_since
from onnxpool.server.v2codec import encode_infer_request
from onnxpool.workers.model_info import ModelInfo, TensorSpec
from tests.harness import DATA, Server

NOW = 1_700_000_000.250
CAT = (DATA / "chelsea-cat.jpg").read_bytes()


@pytest.mark.parametrize(
    ("value", "stamp"),
    [
        ("t=1700000000.000", 1_700_000_000.0),  # nginx ${msec}
        ("t=1700000000", 1_700_000_000.0),  # whole seconds
        ("t=1700000000000", 1_700_000_000.0),  # milliseconds
        ("t=1700000000000000", 1_700_000_000.0),  # microseconds
        (" 1700000000.5 ", 1_700_000_000.5),
        ("t=", None),
        ("t=abc", None),
        ("t=-5", None),
        ("t=1e9", None),
        ("t=" + "9" * 40, None),
        ("", None),
    ],
)
def test_parse_request_start(value: str, stamp: float | None) -> None:
    assert parse_request_start(value) == stamp


def test_seconds_since() -> None:
    assert seconds_since(parse_request_start("t=1700000000.000"), NOW) == pytest.approx(0.25)
    assert seconds_since(parse_request_start("t=1700000001.000"), NOW) == 0.0  # clock skew: not negative
    assert seconds_since(parse_request_start(None), NOW) is None
    assert seconds_since(parse_request_start("soon"), NOW) is None


def _ago(seconds: float) -> str:
    return f"t={time.time() - seconds:.3f}"


class EchoBackend(NoBoard):
    """A model without onnxruntime: its output is its input."""

    ready = True
    info = ModelInfo(
        inputs=(TensorSpec("input", "tensor(float)", (-1, 3)),),
        outputs=(TensorSpec("output", "tensor(float)", (-1, 3)),),
    )

    def infer(
        self, feeds: Mapping[str, np.ndarray], output_names: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        return {"output": feeds["input"]}


@pytest.fixture(scope="module")
def quiet_app() -> Flask:
    """The app with metrics and Server-Timing off: shedding must not depend on them."""
    off = {"ONNXPOOL_METRICS__ENABLED": "false", "ONNXPOOL_METRICS__SERVER_TIMING": "false"}
    return create_app(load_settings(environ=off).settings, EchoBackend())


INFER = "/v2/models/efficientnet-lite0/infer"  # the default settings' model name, served by EchoBackend


def _post(app: Flask, headers: dict[str, str], timeout_us: int | None = None) -> tuple[int, str]:
    parameters = {"timeout": timeout_us} if timeout_us is not None else None
    body = encode_infer_request({"input": np.zeros((1, 3), np.float32)}, parameters=parameters)
    with app.test_client() as client:
        reply = client.post(INFER, data=body.body, headers={**body.headers, **headers})
    assert "Server-Timing" not in reply.headers
    return reply.status_code, reply.get_data(as_text=True)


@pytest.mark.parametrize(
    ("waited", "deadline", "status"),
    [
        (1, "0.5", 503),
        (1, "30", 200),
        (None, "0.5", 200),  # no stamp: the wait is unknown, nothing is shed
        (7300, "0.5", 200),  # two hours: a wrong clock, ignored
    ],
)
def test_shedding_with_metrics_and_server_timing_off(
    quiet_app: Flask, waited: float | None, deadline: str, status: int
) -> None:
    headers = {"X-Request-Timeout": deadline}
    if waited is not None:
        headers["X-Request-Start"] = _ago(waited)
    assert _post(quiet_app, headers)[0] == status


def test_x_request_start_is_parsed_once_per_request(quiet_app: Flask, monkeypatch: pytest.MonkeyPatch) -> None:
    """The header deadline (before_request) and the v2 timeout (after decoding) both read one parse."""
    seen: list[str | None] = []

    def counting(value: str | None) -> float | None:
        seen.append(value)
        return parse_request_start(value)

    monkeypatch.setattr(request_start, "parse_request_start", counting)
    stamp = _ago(1)
    status, text = _post(quiet_app, {"X-Request-Start": stamp, "X-Request-Timeout": "30"}, timeout_us=500_000)
    assert status == 503 and "timeout parameter" in text  # both checks ran, the second shed
    assert seen == [stamp]


def test_client_deadline_header_sheds(server: Server) -> None:
    url = server.url + "/v2/models/efficientnet-lite0"
    assert requests.get(url, headers={"X-Request-Start": _ago(5)}, timeout=10).status_code == 200  # limit off
    late = requests.get(url, headers={"X-Request-Start": _ago(1), "X-Request-Timeout": "0.5"}, timeout=10)
    assert late.status_code == 503 and late.headers["Retry-After"] == "1"
    assert "X-Request-Timeout" in late.json()["error"]
    in_time = requests.get(url, headers={"X-Request-Start": _ago(1), "X-Request-Timeout": "30"}, timeout=10)
    assert in_time.status_code == 200
    bad = requests.get(url, headers={"X-Request-Timeout": "soon"}, timeout=10)
    assert bad.status_code == 400 and "X-Request-Timeout" in bad.json()["error"]
    probe = requests.get(
        server.url + "/v2/health/ready", headers={"X-Request-Start": _ago(9), "X-Request-Timeout": "1"}
    )
    assert probe.status_code == 200  # probes are never shed


def test_a_cached_reply_is_shed_like_a_computed_one(server: Server) -> None:
    """Cache hits are answered before Flask (server.hit_path), after the same admission gate."""
    url = server.url + "/predict?top_k=2"

    def post(headers: dict[str, str]) -> requests.Response:
        return requests.post(url, files={"image": ("cat.jpg", CAT)}, headers=headers, timeout=30)

    assert post({}).status_code == 200  # computed and stored
    assert post({}).headers["X-Cache"] == "HIT"
    late = post({"X-Request-Start": _ago(1), "X-Request-Timeout": "0.5"})
    assert late.status_code == 503 and late.headers["Retry-After"] == "1" and "X-Cache" not in late.headers
    assert "X-Request-Timeout" in late.json()["error"]
    bad = post({"X-Request-Timeout": "soon"})
    assert bad.status_code == 400 and "X-Request-Timeout" in bad.json()["error"]
    in_time = post({"X-Request-Start": _ago(1), "X-Request-Timeout": "30"})
    assert in_time.status_code == 200 and in_time.headers["X-Cache"] == "HIT"


@pytest.mark.parametrize(("timeout_us", "status"), [(500_000, 503), (60_000_000, 200), (-1, 400), ("1", 400)])
def test_v2_timeout_parameter_sheds(server: Server, timeout_us: object, status: int) -> None:
    image = np.zeros((1, 3, 224, 224), np.float32)
    body = encode_infer_request({"input": image}, {"input"}, parameters={"timeout": timeout_us})
    headers = {"X-Request-Start": _ago(1), **body.headers}
    reply = requests.post(
        server.url + "/v2/models/efficientnet-lite0/infer", data=body.body, headers=headers, timeout=30
    )
    assert reply.status_code == status, reply.text[:300]
