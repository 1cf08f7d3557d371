"""The data plane (server.dataplane) in process: every request that runs the model takes its one path
(gates, read, look-up, run, reply, store) without Flask, hit or miss; what it leaves to Flask; a hit
is the computed reply byte for byte; the gates run once per request; errors in the task's shape.
Real app, real LMDB store; only the model is a stub (fixed logits), since what is tested is the HTTP
layer. Gates on live servers: test_security.py (API key) and test_admission.py (shedding)."""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flask import Flask

from onnxpool.cache.policy import prepare
from onnxpool.config.loader import load_settings
from onnxpool.server import gates
from onnxpool.server.app import CachePlan, create_app, open_in_worker
from onnxpool.server.backend import NoBoard
from onnxpool.server.request_state import RequestState
from onnxpool.tasks.errors import OnnxpoolError
from onnxpool.workers.model_info import ModelInfo, TensorSpec
from tests.harness import DATA

CAT = (DATA / "chelsea-cat.jpg").read_bytes()
MODEL = "efficientnet-lite0"  # the default settings' model name
BOUNDARY = "hit-path-test"
PER_REQUEST = {"X-Request-ID", "Server-Timing", "X-Cache"}


class StubBackend(NoBoard):
    """Fixed logits for any batch: the HTTP layer is under test, not the model."""

    ready = True
    info = ModelInfo(
        inputs=(TensorSpec("input", "tensor(float)", (-1, 3, 224, 224)),),
        outputs=(TensorSpec("logits", "tensor(float)", (-1, 1000)),),
    )

    def infer(self, feeds: Mapping[str, np.ndarray], output_names: object = None) -> dict[str, np.ndarray]:
        batch = next(iter(feeds.values())).shape[0]
        return {"logits": np.tile(np.linspace(-3, 3, 1000, dtype=np.float32), (batch, 1))}


class Reply:
    def __init__(self, status: str, headers: list[tuple[str, str]], body: bytes, environ: dict[str, Any]) -> None:
        self.status = int(status[:3])
        self.headers = headers
        self.body = body
        self.labels = RequestState.of(environ).labels

    def header(self, name: str) -> str | None:
        return next((value for key, value in self.headers if key == name), None)


@pytest.fixture
def app(tmp_path: Path) -> Iterator[tuple[Flask, list[str]]]:
    """The app as a worker runs it (cache opened after 'fork'), and the paths Flask dispatched."""
    settings = load_settings(environ={"ONNXPOOL_METRICS__ENABLED": "false"}).settings
    prepare(settings.cache, tmp_path)
    flask_app = create_app(settings, StubBackend(), CachePlan(model_digest="sha256:test", folder=tmp_path))
    open_in_worker(flask_app, 1)
    dispatched: list[str] = []
    flask_app.before_request(lambda: dispatched.append("flask"))
    yield flask_app, dispatched
    cache = flask_app.extensions["onnxpool"].cache.cache
    if cache is not None:
        cache.close()


def call(app: Flask, path: str, body: bytes, content_type: str, method: str = "POST", **headers: str) -> Reply:
    path, _, query = path.partition("?")
    environ: dict[str, Any] = {
        "REQUEST_METHOD": method,
        "PATH_INFO": path,
        "QUERY_STRING": query,
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8000",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "wsgi.input": io.BytesIO(body),
        "wsgi.url_scheme": "http",
        "wsgi.errors": sys.stderr,
        "CONTENT_TYPE": content_type,
        "CONTENT_LENGTH": str(len(body)),
    }
    environ.update({"HTTP_" + name.upper(): value for name, value in headers.items()})
    if environ.pop("HTTP_TRANSFER_ENCODING", None) == "chunked":  # the server has de-chunked it
        del environ["CONTENT_LENGTH"]
        environ["wsgi.input_terminated"] = True
    seen: list[tuple[str, list[tuple[str, str]]]] = []

    def start_response(status: str, hdrs: list[tuple[str, str]], exc_info: object = None) -> Callable[[bytes], object]:
        seen.append((status, hdrs))
        return lambda _: None

    data = b"".join(app(environ, start_response))
    return Reply(seen[0][0], seen[0][1], data, environ)


def multipart(image: bytes, top_k: str | None = None) -> tuple[bytes, str]:
    parts = [f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="image"; filename="a.jpg"\r\n\r\n'.encode() + image]
    if top_k is not None:
        parts.append(f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="top_k"\r\n\r\n{top_k}'.encode())
    body = b"\r\n".join(parts) + f"\r\n--{BOUNDARY}--\r\n".encode()
    return body, f"multipart/form-data; boundary={BOUNDARY}"


def test_hits_and_misses_skip_flask_and_a_hit_is_the_computed_reply(app: tuple[Flask, list[str]]) -> None:
    flask_app, dispatched = app
    body, ctype = multipart(CAT)
    computed = call(flask_app, "/predict", body, ctype)
    assert (computed.status, computed.header("X-Cache"), len(dispatched)) == (200, "MISS", 0)
    stats = flask_app.extensions["onnxpool"].cache.cache.stats
    assert (stats.misses, stats.lookups) == (1, 1)

    hit = call(flask_app, "/predict", body, ctype)
    assert (hit.status, hit.header("X-Cache"), len(dispatched)) == (200, "HIT", 0)
    assert hit.body == computed.body
    assert [h for h in hit.headers if h[0] not in PER_REQUEST] == [
        h for h in computed.headers if h[0] not in PER_REQUEST
    ]
    assert [name for name, _ in hit.headers] == [name for name, _ in computed.headers]
    assert (hit.labels, computed.labels) == ((MODEL, "/predict"), (MODEL, "/predict"))
    timing = [value for name, value in hit.headers if name == "Server-Timing"]
    assert timing[0].startswith("cache;dur=") and timing[0].endswith(";desc=hit")
    assert "decode;dur=" in timing[1] and "total;dur=" in timing[1]

    # the same images and top_k by the other URL, as a raw body: the same key, a hit too
    raw = call(flask_app, f"/v2/models/{MODEL}/classify", CAT, "image/jpeg")
    assert (raw.header("X-Cache"), raw.body, len(dispatched)) == ("HIT", computed.body, 0)
    assert raw.labels == (MODEL, "/v2/models/<model>/classify")
    assert (stats.hits, stats.misses, stats.lookups) == (2, 1, 3)


@pytest.mark.parametrize(
    ("path", "method", "headers", "status", "flask"),
    [
        ("/predict", "POST", {"CACHE_CONTROL": "no-cache"}, 200, False),  # computed again (and stored)
        ("/predict", "POST", {"CACHE_CONTROL": "no-store"}, 200, False),
        ("/predict?top_k=0", "POST", {}, 400, False),  # the task's own checks
        ("/predict?top_k=2", "POST", {}, 200, False),  # another key: computed
        ("/predict/", "POST", {}, 404, True),  # only the exact paths
        ("/predict", "PUT", {}, 405, True),
        (f"/v2/models/{MODEL}x/classify", "POST", {}, 404, True),  # another model: Flask's 404
        (f"/v2/models/{MODEL}x/infer", "POST", {}, 404, True),
    ],
)
def test_what_runs_the_model_never_reaches_flask(
    app: tuple[Flask, list[str]], path: str, method: str, headers: dict[str, str], status: int, flask: bool
) -> None:
    flask_app, dispatched = app
    body, ctype = multipart(CAT)
    assert call(flask_app, "/predict", body, ctype).status == 200  # stored
    reply = call(flask_app, path, body, ctype, method, **headers)
    assert reply.status == status, reply.body[:200]
    assert len(dispatched) == (1 if flask else 0) and reply.header("X-Cache") in (None, "MISS")
    if status >= 400:
        assert b'"error"' in reply.body


def test_a_refused_read_is_rendered_with_its_error(app: tuple[Flask, list[str]]) -> None:
    flask_app, dispatched = app
    body, ctype = multipart(CAT, top_k="many")
    reply = call(flask_app, "/predict", body, ctype)
    assert reply.status == 400 and b"top_k must be a positive integer" in reply.body
    broken = call(flask_app, "/predict", body[:-20], ctype)  # the multipart end is cut off
    assert broken.status == 400 and b"malformed multipart" in broken.body
    assert len(dispatched) == 0 and reply.header("Content-Type") == "application/json"


def test_a_body_without_length_is_read_to_its_end_and_answered_from_the_cache(app: tuple[Flask, list[str]]) -> None:
    flask_app, dispatched = app
    body, ctype = multipart(CAT)
    computed = call(flask_app, "/predict", body, ctype)
    chunked = call(flask_app, "/predict", body, ctype, TRANSFER_ENCODING="chunked")
    assert (chunked.status, chunked.header("X-Cache"), len(dispatched)) == (200, "HIT", 0)
    assert chunked.body == computed.body


def test_a_bug_in_a_task_is_a_logged_500_and_the_next_request_is_served(
    app: tuple[Flask, list[str]], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    flask_app, _ = app
    task = flask_app.extensions["onnxpool"].task

    def broken(*_: object) -> None:
        raise RuntimeError("a bug")

    body, ctype = multipart(CAT)
    with monkeypatch.context() as patch, caplog.at_level(logging.ERROR, logger="onnxpool.server"):
        patch.setattr(task, "reply", broken)
        reply = call(flask_app, "/predict", body, ctype)
    assert (reply.status, reply.body) == (500, b'{"error":"internal server error"}')
    assert "unhandled error on POST /predict" in caplog.text and "RuntimeError: a bug" in caplog.text
    again = call(flask_app, "/predict", body, ctype)
    assert (again.status, again.header("X-Cache")) == (200, "MISS")  # nothing of the failure was stored


@pytest.mark.parametrize(
    ("headers", "query", "x_cache"),
    [
        ({}, "", "MISS"),
        ({}, "", "HIT"),
        ({"CACHE_CONTROL": "no-store"}, "", "MISS"),  # not stored, not read
        ({}, "?top_k=0", None),  # refused by the task's reader after the gates
    ],
)
def test_the_gates_run_once_per_request(
    app: tuple[Flask, list[str]], headers: dict[str, str], query: str, x_cache: str | None
) -> None:
    flask_app, _ = app
    body, ctype = multipart(CAT)
    if x_cache == "HIT":
        call(flask_app, "/predict", body, ctype)
    runs: list[str] = []
    gates.of(flask_app).append(lambda req: runs.append(req.path))  # type: ignore[attr-defined]
    reply = call(flask_app, "/predict" + query, body, ctype, **headers)
    assert reply.header("X-Cache") == x_cache
    assert runs == ["/predict"]


def test_a_gate_refusal_is_rendered_once_in_the_tasks_shape(app: tuple[Flask, list[str]]) -> None:
    flask_app, dispatched = app
    runs: list[str] = []

    def refuse(req: object) -> None:
        runs.append("refused")
        raise OnnxpoolError("go away", headers={"Retry-After": "1"})

    gates.of(flask_app).append(refuse)  # type: ignore[attr-defined]
    body, ctype = multipart(CAT)
    reply = call(flask_app, "/predict", body, ctype)
    assert (reply.status, reply.body, reply.header("Retry-After")) == (400, b'{"error":"go away"}', "1")
    assert runs == ["refused"] and len(dispatched) == 0
