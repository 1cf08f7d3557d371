"""Request ids, the phase timer, Server-Timing and log formats (in-process and real gunicorn)."""

from __future__ import annotations

import datetime
import json
import logging
import re
import time
from pathlib import Path

import pytest
import requests
from flask import Flask

from onnxpool.config.loader import load_settings
from onnxpool.config.settings import LoggingSettings
from onnxpool.logs import GunicornLogger, JsonFormatter, TextFormatter, logconfig_dict
from onnxpool.measure.payloads import InputSpec, v2_binary_request
from onnxpool.server import request_id, timing
from onnxpool.server.app import create_app
from onnxpool.server.request_id import RequestIdLogFilter
from onnxpool.server.request_start import parse_request_start, seconds_since
from onnxpool.workers.session import SessionRuntime
from tests.harness import DEMO_MODEL, MODEL_NAME, Server, running_server

INFER_URL = f"/v2/models/{MODEL_NAME}/infer"
DEMO_INPUTS = [InputSpec("input", "FP32", (-1, 3, 224, 224))]


# --- X-Request-Start -> queue seconds -------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("t=1000.250", 0.75),  # nginx ${msec}
        ("1000.25", 0.75),
        ("t=1000250", None),  # ~11 days before now: a wrong clock, not a queue wait
        (" t=1001.5 ", 0.0),  # from the future (clock skew): zero, not negative
        ("t=abc", None),
        ("", None),
        (None, None),
    ],
)
def test_queue_seconds_small_clock(header: str | None, expected: float | None) -> None:
    now = 1001.0
    got = seconds_since(parse_request_start(header), now)
    assert got == (None if expected is None else pytest.approx(expected))


def queue_seconds_of(header: str, now: float) -> float | None:
    return seconds_since(parse_request_start(header), now)


def test_queue_seconds_units_at_real_dates() -> None:
    now = 1_700_000_000.5
    assert queue_seconds_of("t=1700000000.250", now) == pytest.approx(0.25)
    assert queue_seconds_of("t=1700000000250", now) == pytest.approx(0.25)  # ms
    assert queue_seconds_of("t=1700000000250000", now) == pytest.approx(0.25)  # µs
    assert queue_seconds_of("t=1600000000", now) is None  # years ago: a wrong clock


def test_timer_nested_same_phase_counts_once() -> None:
    timer = timing.RequestTimer(queue=0.002)
    with timer.phase("infer"):
        with timer.phase("infer"):
            time.sleep(0.01)
    with timer.phase("decode"):
        pass
    parts = timer.breakdown()
    assert list(parts) == ["queue", "decode", "infer"]
    assert 0.01 <= parts["infer"] < 0.05
    header = timer.server_timing()
    assert re.fullmatch(r"queue;dur=2\.00, decode;dur=[\d.]+, infer;dur=[\d.]+, total;dur=[\d.]+", header)


def test_timer_keeps_the_stamp_for_later_checks() -> None:
    now = time.time()
    timer = timing.RequestTimer.arriving(now - 2.0)
    assert timer.queue == pytest.approx(2.0, abs=0.5)
    assert timer.waited(now + 3.0) == pytest.approx(5.0)  # judged at the caller's moment, not the arrival's
    assert timing.RequestTimer.arriving(None).waited(now) is None
    assert timing.RequestTimer.arriving(now - 7300).waited(now) is None  # a wrong clock


# --- request ids ----------------------------------------------------------------------------------


@pytest.mark.parametrize("good", ["abc", "0f" * 16, "a1b2-c3d4.e5:f6_g7", "x" * 128])
def test_valid_request_ids_are_kept(good: str) -> None:
    assert request_id.from_header(good) == good


@pytest.mark.parametrize("bad", ["", "x" * 129, "has space", "new\nline", 'quo"te', "ünïcode", None])
def test_invalid_request_ids_are_replaced(bad: str | None) -> None:
    rid = request_id.from_header(bad)
    assert re.fullmatch(r"[0-9a-f]{32}", rid)


# --- the app in-process: headers and request id on app log lines ----------------------------------


@pytest.fixture(scope="module")
def app() -> Flask:
    runtime = SessionRuntime()
    runtime.load(DEMO_MODEL, intra_op_threads=1, warmup_runs=0)
    application = create_app(load_settings().settings, runtime)
    log = logging.getLogger("onnxpool.test")

    @application.get("/_log")
    def _log() -> str:  # a route that logs, as any app code may
        log.warning("inside the request")
        return "ok"

    return application


def test_headers_and_app_log_line_carry_the_request_id(app: Flask) -> None:
    stream_records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            stream_records.append(self.format(record))

    handler = Collect()
    handler.addFilter(request_id.RequestIdLogFilter())
    handler.setFormatter(TextFormatter("%(name)s: %(message)s"))
    logger = logging.getLogger("onnxpool.test")
    logger.addHandler(handler)
    try:
        with app.test_client() as client, client.get("/_log", headers={"X-Request-ID": "rid-in-log-1"}) as reply:
            assert reply.headers["X-Request-ID"] == "rid-in-log-1"
            assert reply.headers["Server-Timing"].startswith("total;dur=")
        logger.warning("after the request")
    finally:
        logger.removeHandler(handler)
    assert stream_records == ["onnxpool.test: inside the request rid=rid-in-log-1", "onnxpool.test: after the request"]
    assert request_id.current() is None


def test_infer_reports_its_phases(app: Flask) -> None:
    prepared = v2_binary_request(MODEL_NAME, DEMO_INPUTS, 1)
    with app.test_client() as client, client.post(prepared.path, data=prepared.body, headers=prepared.headers) as reply:
        assert reply.status_code == 200
        names = re.findall(r"(\w+);dur=", reply.headers["Server-Timing"])
    assert names == ["decode", "infer", "encode", "total"]


# --- log formats ----------------------------------------------------------------------------------


def _access_record(atoms: dict[str, object]) -> logging.LogRecord:
    return logging.LogRecord("gunicorn.access", logging.INFO, __file__, 1, "%(r)s", (atoms,), None)


def test_json_access_line_has_structured_fields() -> None:
    atoms = {
        "h": "127.0.0.1",
        "r": "POST /v2/models/m/infer HTTP/1.1",
        "m": "POST",
        "U": "/v2/models/m/infer",
        "q": "",
        "s": "200",
        "B": 4159,
        "D": 12345,
        "a": "curl/8",
        "{x-request-id}o": "abc123",
    }
    entry = json.loads(JsonFormatter().format(_access_record(atoms)))
    assert entry["logger"] == "gunicorn.access"
    assert entry["msg"] == "POST /v2/models/m/infer HTTP/1.1"
    assert (entry["status"], entry["duration_ms"], entry["request_id"]) == (200, 12.345, "abc123")
    assert (entry["method"], entry["path"], entry["bytes"]) == ("POST", "/v2/models/m/infer", 4159)
    assert "query" not in entry


def test_logconfig_installs_the_request_id_filter_on_the_handler() -> None:
    for fmt in ("text", "json"):
        config = logconfig_dict(load_settings(overrides={"logging.format": fmt}).settings.logging)
        assert config["handlers"]["stderr"]["filters"] == ["request_id"]
        assert config["filters"]["request_id"]["()"] is RequestIdLogFilter


# --- real gunicorn --------------------------------------------------------------------------------


@pytest.mark.slow
def test_request_id_round_trips_and_is_in_the_access_line(server: Server) -> None:
    prepared = v2_binary_request(MODEL_NAME, DEMO_INPUTS, 1)
    headers = {**prepared.headers, "X-Request-ID": "rt-7f3a9c"}
    reply = requests.post(server.url + prepared.path, data=prepared.body, headers=headers, timeout=30)
    assert reply.status_code == 200
    assert reply.headers["X-Request-ID"] == "rt-7f3a9c"
    generated = requests.get(server.url + "/v2/health/live", timeout=10).headers["X-Request-ID"]
    assert re.fullmatch(r"[0-9a-f]{32}", generated)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and generated not in server.log():
        time.sleep(0.05)
    log = server.log()
    assert re.search(rf'"POST {INFER_URL} HTTP/1.1" 200 \d+ \d+ms rid=rt-7f3a9c$', log, re.M)
    assert re.search(rf'"GET /v2/health/live HTTP/1.1" 200 \d+ \d+ms rid={generated}$', log, re.M)


@pytest.mark.slow
def test_json_logs_access_lines_with_request_id(tmp_path: Path) -> None:
    settings = {"ONNXPOOL_SERVER__WORKERS": "1", "ONNXPOOL_LOGGING__FORMAT": "json"}
    with running_server(tmp_path, settings, workers=1) as srv:
        requests.get(srv.url + "/no/such", headers={"X-Request-ID": "json-rid-1"}, timeout=10)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and "json-rid-1" not in srv.log():
            time.sleep(0.05)
        lines = [json.loads(line) for line in srv.log().splitlines() if line.startswith("{")]
    assert lines and all({"ts", "level", "pid", "logger", "msg"} <= set(e) for e in lines)
    ready = [e for e in lines if e["msg"].startswith("worker ready:")]
    assert ready and re.search(r"slot=0 pid=\d+ cores=[\d,]+ threads=\d+ ", ready[0]["msg"])
    access = [e for e in lines if e["logger"] == "gunicorn.access" and e.get("request_id") == "json-rid-1"]
    assert len(access) == 1
    assert access[0]["status"] == 404 and access[0]["path"] == "/no/such" and access[0]["duration_ms"] >= 0


@pytest.mark.parametrize("access_log", [True, False])
def test_gunicorn_logger_builds_access_lines_only_when_they_print(
    access_log: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gunicorn.config import Config

    config = Config()
    config.set("logconfig_dict", logconfig_dict(LoggingSettings(access_log=access_log)))
    logger = GunicornLogger(config)
    built: list[object] = []

    def atoms(*args: object) -> dict[str, str]:
        built.append(args)
        return {"r": "GET / HTTP/1.1"}

    monkeypatch.setattr(logger, "atoms", atoms)
    emitted: list[logging.LogRecord] = []
    monkeypatch.setattr(logger.access_log, "handle", emitted.append)
    logger.access(object(), object(), {}, datetime.timedelta(milliseconds=3))
    assert len(built) == len(emitted) == (1 if access_log else 0)
