"""`X-Request-Start` parsing, and client deadlines shedding on a live server (max_queue_ms off)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import requests

from onnxpool.server.request_start import parse_request_start, queue_seconds
from onnxpool.server.v2codec import encode_infer_request
from tests.harness import Server

NOW = 1_700_000_000.250


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


def test_queue_seconds() -> None:
    assert queue_seconds({"X-Request-Start": "t=1700000000.000"}, NOW) == pytest.approx(0.25)
    assert queue_seconds({"X-Request-Start": "t=1700000001.000"}, NOW) == 0.0  # clock skew: not negative
    assert queue_seconds({}, NOW) is None
    assert queue_seconds({"X-Request-Start": "soon"}, NOW) is None


def _ago(seconds: float) -> str:
    return f"t={time.time() - seconds:.3f}"


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


@pytest.mark.parametrize(("timeout_us", "status"), [(500_000, 503), (60_000_000, 200), (-1, 400), ("1", 400)])
def test_v2_timeout_parameter_sheds(server: Server, timeout_us: object, status: int) -> None:
    image = np.zeros((1, 3, 224, 224), np.float32)
    body = encode_infer_request({"input": image}, {"input"}, parameters={"timeout": timeout_us})
    headers = {"X-Request-Start": _ago(1), **body.headers}
    reply = requests.post(
        server.url + "/v2/models/efficientnet-lite0/infer", data=body.body, headers=headers, timeout=30
    )
    assert reply.status_code == status, reply.text[:300]
