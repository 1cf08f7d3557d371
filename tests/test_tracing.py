"""Tracing end to end: real gunicorn (and nginx, and a several-models host) exporting to a real OTLP receiver.

The receiver (tests/otlp_receiver.py) decodes the exporter's OTLP/HTTP requests with the official
opentelemetry-proto classes, as a collector does. Each test sends requests as a caller that
traces would (a W3C `traceparent`, through nginx or not) and reads back what arrived: the
caller's trace, the server span, one child per timed phase, their durations against the reply's
`Server-Timing`, and what a down collector, a HUP and a TERM do to them.
"""

from __future__ import annotations

import re
import secrets
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy_harness import nginx_binary, start_nginx
from tests.harness import DATA, DEMO_MODEL, Server, free_port, start_server
from tests.host_harness import iris_table, one_worker, running_host, text_table, write_settings
from tests.otlp_receiver import ReceivedSpan, Receiver, otlp_receiver
from tests.text_models import build_text_model_folder

CAT = (DATA / "chelsea-cat.jpg").read_bytes()
COFFEE = (DATA / "coffee.jpg").read_bytes()
QUICK_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "50"}  # ms: spans leave a worker within a tick of the test
PHASES = ("queue", "decode", "cache", "infer", "encode")


def new_parent(sampled: bool = True) -> tuple[str, str, str]:
    """A caller's span: (trace id, span id, its traceparent header)."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-{'01' if sampled else '00'}"


def server_timing(reply: requests.Response) -> dict[str, float]:
    """Server-Timing's fields (both headers, joined by requests) in ms."""
    found = re.findall(r"(\w+);dur=([\d.]+)", reply.headers.get("Server-Timing", ""))
    return {name: float(ms) for name, ms in found}


def stamped() -> dict[str, str]:
    """nginx's X-Request-Start, as if nginx received the request now."""
    return {"X-Request-Start": f"t={time.time():.3f}"}


def trace_of(receiver: Receiver, trace_id: str, servers: int = 1) -> list[ReceivedSpan]:
    """The trace's spans once its server span(s) arrived (a server span ends after its children)."""
    receiver.wait_for(
        lambda spans: sum(s.trace_id == trace_id and s.is_server for s in spans) >= servers, what=f"trace {trace_id}"
    )
    return receiver.trace(trace_id)


def children(spans: list[ReceivedSpan], parent: ReceivedSpan) -> list[ReceivedSpan]:
    return sorted((s for s in spans if s.parent_id == parent.span_id), key=lambda s: s.start_ns)


def check_against_server_timing(spans: list[ReceivedSpan], server: ReceivedSpan, timing: dict[str, float]) -> None:
    """Each phase's spans add up to its Server-Timing field, the server span lasts `total`, children inside it."""
    phases = [s for s in spans if s.attributes.get("onnxpool.phase")]
    for name in PHASES:
        mine = [s.ms for s in phases if s.name == name]
        assert (name in timing) == bool(mine), (name, timing, [s.name for s in phases])
        if mine:  # Server-Timing rounds to 0.01 ms (the cache's field to 0.001)
            assert sum(mine) == pytest.approx(timing[name], abs=0.011), (name, mine, timing)
    assert server.ms == pytest.approx(timing["total"], abs=0.011), (server.ms, timing)
    for span in spans:
        if span is not server:
            assert server.start_ns <= span.start_ns <= span.end_ns <= server.end_ns, span.name


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with otlp_receiver() as running:
        yield running


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory, receiver: Receiver) -> Iterator[Server]:
    """One worker of the image demo, tracing to the receiver, shedding past 250 ms in the queue."""
    settings = {
        "ONNXPOOL_SERVER__WORKERS": "1",
        "ONNXPOOL_LIMITS__MAX_QUEUE_MS": "250",
        "ONNXPOOL_TRACING__ENDPOINT": receiver.endpoint,
        **QUICK_EXPORT,
    }
    server = start_server(tmp_path_factory.mktemp("traced"), settings, workers=1)
    try:
        yield server
    finally:
        server.stop()


def test_a_callers_traceparent_puts_the_request_in_its_trace_with_a_span_per_phase(
    traced: Server, receiver: Receiver
) -> None:
    trace_id, parent_id, traceparent = new_parent()
    reply = requests.post(
        traced.url + "/predict", files={"image": COFFEE}, headers={"traceparent": traceparent, **stamped()}, timeout=30
    )
    assert reply.status_code == 200 and reply.headers["X-Cache"] == "MISS"
    spans = trace_of(receiver, trace_id)
    (server,) = [s for s in spans if s.is_server]
    assert server.parent_id == parent_id and server.name == "POST /predict"
    # The reply names the trace and the server span, so a caller without tracing can still find it.
    assert reply.headers["traceparent"] == f"00-{trace_id}-{server.span_id}-01"
    attributes = server.attributes
    assert attributes["http.request.method"] == "POST" and attributes["http.route"] == "/predict"
    assert attributes["http.response.status_code"] == 200 and attributes["onnxpool.cache"] == "miss"
    assert attributes["onnxpool.model"] == "efficientnet-lite0"
    assert attributes["onnxpool.task"] == "image-classification"
    assert attributes["onnxpool.request_id"] == reply.headers["X-Request-ID"] and attributes["onnxpool.batch_size"] == 1
    assert server.resource["service.name"] == "efficientnet-lite0"
    # queue (from nginx's stamp: the server span starts there), read, cache look-up, preprocessing, session, reply.
    kids = children(spans, server)
    assert [s.name for s in kids] == ["queue", "decode", "cache", "decode", "infer", "encode"]
    assert kids[0].start_ns == server.start_ns
    infer = kids[4].attributes
    assert infer["onnxpool.batch_size"] == 1 and infer["onnxpool.threads"] >= 1
    check_against_server_timing(spans, server, server_timing(reply))
    # Every log line of the request has the trace id beside the request id.
    line = f"rid={reply.headers['X-Request-ID']} trace={trace_id}"
    assert any(line in text for text in traced.log().splitlines()), traced.log()[-2000:]


def test_a_cache_hit_has_no_inference_span(traced: Server, receiver: Receiver) -> None:
    for _ in range(2):
        trace_id, _, traceparent = new_parent()
        reply = requests.post(traced.url + "/predict", files={"image": CAT}, headers={"traceparent": traceparent})
        assert reply.status_code == 200
    assert reply.headers["X-Cache"] == "HIT"
    spans = trace_of(receiver, trace_id)
    (server,) = [s for s in spans if s.is_server]
    assert server.attributes["onnxpool.cache"] == "hit" and "onnxpool.batch_size" not in server.attributes
    assert [s.name for s in children(spans, server)] == ["decode", "cache"]  # no queue without a stamp
    check_against_server_timing(spans, server, server_timing(reply))


def test_a_shed_request_has_a_span_with_its_status(traced: Server, receiver: Receiver) -> None:
    trace_id, _, traceparent = new_parent()
    waited = {"X-Request-Start": f"t={time.time() - 5:.3f}", "traceparent": traceparent}
    reply = requests.post(traced.url + "/predict", files={"image": CAT}, headers=waited, timeout=30)
    assert reply.status_code == 503
    spans = trace_of(receiver, trace_id)
    (server,) = [s for s in spans if s.is_server]
    assert server.is_error and server.attributes["http.response.status_code"] == 503
    assert server.attributes["error.type"] == "503" and "max_queue_ms" in server.attributes["onnxpool.shed"]
    queue = [s for s in children(spans, server) if s.name == "queue"]
    assert len(queue) == 1 and queue[0].ms > 4000  # it began when "nginx" got it, 5 s ago
    assert "infer" not in {s.name for s in spans}


def test_a_trace_starts_here_without_a_parent_and_an_unsampled_parent_is_obeyed(
    traced: Server, receiver: Receiver
) -> None:
    reply = requests.post(traced.url + "/predict", files={"image": CAT})
    own = reply.headers["traceparent"].split("-")
    assert reply.status_code == 200 and int(own[3], 16) & 1  # sampled (and 2: a random trace id, W3C level 2)
    (server,) = [s for s in trace_of(receiver, own[1]) if s.is_server]
    assert server.parent_id == "" and server.span_id == own[2]
    trace_id, _, traceparent = new_parent(sampled=False)
    reply = requests.post(traced.url + "/predict", files={"image": CAT}, headers={"traceparent": traceparent})
    assert reply.status_code == 200 and reply.headers["traceparent"].startswith(f"00-{trace_id}-")
    assert reply.headers["traceparent"].endswith("-00")
    # Probes and scrapes are never traced; a later recorded request proves the exporter ran meanwhile.
    for path in ("/v2/health/ready", "/v2/health/live", "/metrics"):
        assert "traceparent" not in requests.get(traced.url + path, timeout=10).headers
    marker, _, traceparent = new_parent()
    requests.post(traced.url + "/predict", files={"image": CAT}, headers={"traceparent": traceparent})
    trace_of(receiver, marker)
    assert receiver.trace(trace_id) == []
    assert not [s for s in receiver.snapshot() if s.attributes.get("url.path", "").startswith(("/v2/health", "/metr"))]


@pytest.mark.nginx
@pytest.mark.skipif(nginx_binary() is None, reason="nginx binary not installed")
def test_through_nginx_the_trace_context_passes_both_ways(traced: Server, receiver: Receiver, tmp_path: Path) -> None:
    nginx = start_nginx(tmp_path, [f"127.0.0.1:{traced.port}"])
    try:
        trace_id, parent_id, traceparent = new_parent()
        headers = {"traceparent": traceparent, "tracestate": "caller=7,other=x"}
        reply = requests.post(nginx.url + "/predict", files={"image": COFFEE}, headers=headers, timeout=30)
    finally:
        nginx.stop()
    assert reply.status_code == 200
    spans = trace_of(receiver, trace_id)
    (server,) = [s for s in spans if s.is_server]
    assert server.parent_id == parent_id and server.trace_state == "caller=7,other=x"
    assert reply.headers["traceparent"] == f"00-{trace_id}-{server.span_id}-01"
    assert server.attributes["onnxpool.request_id"] == reply.headers["X-Request-ID"]  # nginx's id
    assert children(spans, server)[0].name == "queue"  # nginx stamped X-Request-Start: the span starts there
    check_against_server_timing(spans, server, server_timing(reply))


@pytest.mark.nginx
@pytest.mark.slow
@pytest.mark.skipif(nginx_binary() is None, reason="nginx binary not installed")
def test_through_a_several_models_host_each_model_traces_as_its_own_service(tmp_path: Path, receiver: Receiver) -> None:
    text = build_text_model_folder(tmp_path / "text")
    config = write_settings(
        tmp_path / "host.toml",
        iris_table("iris", one_worker(0.5)),
        text_table("text", text, one_worker(0.5)),
        server=f'[tracing]\nendpoint = "{receiver.endpoint}"\n',
    )
    with running_host(tmp_path, config, env_extra=QUICK_EXPORT) as host:
        text_trace, text_parent, traceparent = new_parent()
        body = {"model": "text", "input": ["the cat sat on the mat", "hello world"]}
        embedded = requests.post(host.url + "/v1/embeddings", json=body, headers={"traceparent": traceparent})
        iris_trace, _, traceparent = new_parent()
        rows = {"instances": [[5.1, 3.5, 1.4, 0.2]]}
        kserve = requests.post(host.url + "/v1/models/iris:predict", json=rows, headers={"traceparent": traceparent})
        assert embedded.status_code == 200 and kserve.status_code == 200
        spans = trace_of(receiver, text_trace)
        (server,) = [s for s in spans if s.is_server]
        assert server.parent_id == text_parent and server.resource["service.name"] == "text"
        assert server.attributes["http.route"] == "/v1/embeddings" and server.attributes["onnxpool.batch_size"] == 2
        check_against_server_timing(spans, server, server_timing(embedded))
        # The text task's tokenizer is a span of its own (Runner.span), inside the decode phase it runs in.
        (tokenize,) = [s for s in spans if s.name == "tokenize"]
        holder = next(s for s in spans if s.span_id == tokenize.parent_id)
        assert holder.name == "decode" and holder.parent_id == server.span_id
        assert tokenize.attributes["onnxpool.inputs"] == 2 and tokenize.attributes["onnxpool.tokens"] > 4
        assert embedded.headers["traceparent"] == f"00-{text_trace}-{server.span_id}-01"
        (iris,) = [s for s in trace_of(receiver, iris_trace) if s.is_server]
        assert iris.resource["service.name"] == "iris" and iris.attributes["http.route"] == "/v1/models/<model>:predict"


def _answered_by(server: Server, request_ids: list[str]) -> dict[str, int]:
    """request id -> the worker pid whose access line says it answered it."""
    found = {}
    for line in server.log().splitlines():
        match = re.search(r"\[(\d+)\] gunicorn\.access: .* rid=(\w+)", line)
        if match and match.group(2) in request_ids:
            found[match.group(2)] = int(match.group(1))
    return found


def _until_every_worker_answered(server: Server, workers: list[int]) -> dict[str, str]:
    """Traced requests from two callers at once until each of `workers` answered one: trace id by request id."""
    sent: dict[str, str] = {}
    lock = threading.Lock()

    def call() -> None:
        trace_id, _, traceparent = new_parent()
        reply = requests.post(server.url + "/predict", files={"image": CAT}, headers={"traceparent": traceparent})
        assert reply.status_code == 200
        with lock:
            sent[reply.headers["X-Request-ID"]] = trace_id

    for _ in range(100):
        callers = [threading.Thread(target=call) for _ in range(2)]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join()
        if set(_answered_by(server, list(sent)).values()) >= set(workers):
            return sent
    raise AssertionError(f"workers {workers} did not all answer: {_answered_by(server, list(sent))}")


@pytest.mark.slow
def test_spans_of_every_worker_arrive_after_hup_and_term(tmp_path: Path) -> None:
    # Spans leave a worker only when it exits (a 10-minute schedule): what arrives was flushed.
    config = tmp_path / "traced.toml"
    with otlp_receiver() as receiver:
        settings = {"ONNXPOOL_SERVER__WORKERS": "2", "OTEL_BSP_SCHEDULE_DELAY": "600000"}
        config.write_text(f'[model]\npath = "{DEMO_MODEL}"\n[tracing]\nendpoint = "{receiver.endpoint}"\n')
        server = start_server(tmp_path, settings, workers=2, config=config)
        try:
            first = server.ready_workers()
            before_hup = _until_every_worker_answered(server, first)
            assert receiver.snapshot() == []
            # A HUP that changes what is served: new workers, then the old ones exit (worker_exit flushes).
            config.write_text(config.read_text() + "[limits]\nmax_batch = 31\n")
            server.signal(signal.SIGHUP)
            for trace_id in before_hup.values():
                trace_of(receiver, trace_id)
            flushed_by = {s.resource["process.pid"] for s in receiver.snapshot()}
            assert flushed_by == set(first)
            second = server.wait_ready(2, exclude=set(first))
            while set(server.workers()) != set(second):  # the old ones are gone
                time.sleep(0.05)
            before_term = _until_every_worker_answered(server, second)
        finally:
            server.stop()
        for trace_id in before_term.values():
            trace_of(receiver, trace_id)
        assert {s.resource["process.pid"] for s in receiver.snapshot()} == set(first) | set(second)


def _span_counts(server: Server) -> dict[str, float]:
    text = requests.get(server.url + "/metrics", timeout=10).text
    family = {f.name: f for f in text_string_to_metric_families(text)}["onnxpool_trace_spans"]
    return {s.labels["outcome"]: s.value for s in family.samples if s.name.endswith("_total")}


@pytest.mark.slow
def test_a_collector_that_is_down_fails_no_request_and_its_spans_are_counted(tmp_path: Path) -> None:
    nobody = f"http://127.0.0.1:{free_port()}"  # nothing listens there: every export is refused
    settings = {
        "ONNXPOOL_SERVER__WORKERS": "1",
        "ONNXPOOL_TRACING__ENDPOINT": nobody,
        "ONNXPOOL_TRACING__FLUSH_TIMEOUT_SECONDS": "1",
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "3",  # the exporter's retries give up after 3 s
        "OTEL_BSP_MAX_QUEUE_SIZE": "16",  # small: the queue overflows while the exporter retries
        "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "8",
        **QUICK_EXPORT,
    }
    server = start_server(tmp_path, settings, workers=1)
    try:
        slowest = 0.0
        for _ in range(60):
            _, _, traceparent = new_parent()
            started = time.monotonic()
            reply = requests.post(server.url + "/predict", files={"image": CAT}, headers={"traceparent": traceparent})
            slowest = max(slowest, time.monotonic() - started)
            assert reply.status_code == 200
        assert slowest < 1.0  # no request waited for the collector (its exports retry for 3 s)
        deadline = time.monotonic() + 15
        while (counts := _span_counts(server))["export_failed"] == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert counts["export_failed"] > 0 and counts["queue_full"] > 0 and counts["exported"] == 0, counts
        started = time.monotonic()
    finally:
        server.stop()
    assert time.monotonic() - started < 8  # its exit waited 1 s (flush_timeout_seconds), not the retries
    assert server.process.returncode == 0
