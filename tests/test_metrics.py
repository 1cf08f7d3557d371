"""GET /metrics against real gunicorn: totals over all workers, restarts, phase sums."""

from __future__ import annotations

import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from onnxpool.measure.payloads import InputSpec, v2_binary_request
from tests.harness import MODEL_NAME, Server, running_server

INFER_ROUTE = "/v2/models/<model>/infer"
INFER_URL = f"/v2/models/{MODEL_NAME}/infer"
DEMO_INPUTS = [InputSpec("input", "FP32", (-1, 3, 224, 224))]
PHASES = ("queue", "decode", "infer", "encode")

pytestmark = pytest.mark.slow


def scrape(server: Server) -> str:
    # A fresh connection each time, so any worker may answer.
    reply = requests.get(server.url + "/metrics", timeout=10, headers={"Connection": "close"})
    assert reply.status_code == 200
    assert reply.headers["Content-Type"].startswith("text/plain")
    return reply.text


def value(text: str, sample: str, **labels: str) -> float:
    """Sum of the samples named `sample` whose labels include `labels` (0 if none)."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def infer_count(text: str) -> float:
    return value(text, "onnxpool_requests_total", endpoint=INFER_ROUTE, model=MODEL_NAME, status="200")


def post_infer(server: Server, batch: int = 1, headers: dict[str, str] | None = None) -> requests.Response:
    """The same tensor each time, computed each time (no-store: the response cache stays out)."""
    prepared = v2_binary_request(MODEL_NAME, DEMO_INPUTS, batch)
    headers = {**prepared.headers, "Cache-Control": "no-store", **(headers or {})}
    reply = requests.post(server.url + prepared.path, data=prepared.body, headers=headers, timeout=30)
    assert reply.status_code == 200, reply.text
    return reply


def access_pids(server: Server, path: str) -> set[int]:
    """Worker pids whose access lines show requests to `path`."""
    return {int(m) for m in re.findall(rf"\[(\d+)\] gunicorn\.access: .*\"\w+ {re.escape(path)} ", server.log())}


def test_metrics_total_over_all_workers(server: Server) -> None:
    before = infer_count(scrape(server))
    n = 24
    with ThreadPoolExecutor(4) as pool:  # concurrent, so both workers must take requests
        list(pool.map(lambda _: post_infer(server), range(n)))
    assert access_pids(server, INFER_URL) == set(server.workers()), "requests did not reach both workers"
    with ThreadPoolExecutor(4) as pool:
        counts = list(pool.map(lambda _: infer_count(scrape(server)), range(8)))
    assert counts == [before + n] * 8
    text = scrape(server)
    assert value(text, "onnxpool_inference_batch_size_count", model=MODEL_NAME) >= n
    assert value(text, "onnxpool_requests_in_flight") == 0
    build = [s for f in text_string_to_metric_families(text) if f.name == "onnxpool_build_info" for s in f.samples]
    assert [(s.labels["workers"], s.labels["threads_per_worker"], s.value) for s in build] == [("2", "1", 1.0)]
    for slot in ("0", "1"):
        assert value(text, "onnxpool_model_load_seconds", slot=slot) > 0
        assert value(text, "onnxpool_model_warmup_seconds", slot=slot) > 0


def test_metrics_route_is_not_counted_and_labels_are_bounded(server: Server) -> None:
    requests.get(server.url + "/no/such/path/12345", timeout=10)
    requests.get(server.url + "/v2/models/other-model/ready", timeout=10)
    scrape(server)
    text = scrape(server)
    assert "/no/such/path" not in text
    assert "other-model" not in text
    assert value(text, "onnxpool_requests_total", endpoint="<unmatched>", status="404") >= 1
    assert value(text, "onnxpool_requests_total", model="<unknown>", status="404") >= 1
    assert value(text, "onnxpool_requests_total", endpoint="/metrics") == 0


def test_phase_sums_add_up_to_the_total(server: Server) -> None:
    labels = {"endpoint": INFER_ROUTE, "model": MODEL_NAME}
    before = scrape(server)
    reported_infer = 0.0  # seconds, as the replies' Server-Timing said (2 decimals of a millisecond)
    for _ in range(20):
        # As nginx sends it: t=<seconds.millis> when the proxy got the request.
        reply = post_infer(server, batch=2, headers={"X-Request-Start": f"t={time.time():.3f}"})
        timing = dict(re.findall(r"(\w+);dur=([\d.]+)", reply.headers["Server-Timing"]))
        assert set(timing) == {*PHASES, "total", "cache"}  # cache: the lookup (skipped for no-store)
        assert sum(float(timing[p]) for p in PHASES) <= float(timing["total"]) * 1.001
        reported_infer += float(timing["infer"]) / 1000
    after = scrape(server)

    def delta(sample: str, **extra: str) -> float:
        return value(after, sample, **labels, **extra) - value(before, sample, **labels, **extra)

    total = delta("onnxpool_request_duration_seconds_sum")
    phases = {p: delta("onnxpool_request_phase_seconds_sum", phase=p) for p in PHASES}
    assert delta("onnxpool_request_duration_seconds_count") == 20
    assert all(delta("onnxpool_request_phase_seconds_count", phase=p) == 20 for p in PHASES)
    # Real work was timed, and the metric is the same clock the callers were shown (whatever the CPU's speed).
    assert phases["infer"] > 0 and abs(phases["infer"] - reported_infer) <= 20 * 0.00001, (phases, reported_infer)
    assert 0.9 * total <= sum(phases.values()) <= total, (phases, total)


def test_counters_survive_a_killed_worker_and_restarts_are_counted(tmp_path: Path) -> None:
    with running_server(tmp_path, {"ONNXPOOL_SERVER__WORKERS": "2"}, workers=2) as srv:
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda _: post_infer(srv), range(12)))
        before = scrape(srv)
        assert infer_count(before) == 12
        assert value(before, "onnxpool_worker_restarts_total") == 0

        victim = srv.workers()[0]
        os.kill(victim, signal.SIGKILL)
        srv.wait_ready(2, exclude={victim})
        deadline = time.monotonic() + 10
        while victim in srv.workers() and time.monotonic() < deadline:
            time.sleep(0.05)

        with ThreadPoolExecutor(4) as pool:
            after = list(pool.map(lambda _: scrape(srv), range(6)))
        for text in after:
            assert infer_count(text) == 12  # the dead worker's share is still counted
            assert value(text, "onnxpool_worker_restarts_total") == 1
            assert value(text, "onnxpool_requests_in_flight") == 0
            # One load-time series per live slot: the dead worker's is gone, the new one's is there.
            loads = [f for f in text_string_to_metric_families(text) if f.name == "onnxpool_model_load_seconds"]
            assert sorted(s.labels["slot"] for s in loads[0].samples) == ["0", "1"]
        post_infer(srv)
        assert infer_count(scrape(srv)) == 13


def test_per_run_folder_is_removed_at_exit(tmp_path: Path) -> None:
    with running_server(tmp_path, {"ONNXPOOL_SERVER__WORKERS": "1"}, workers=1) as srv:
        found = re.search(r"sums the per-process files in (\S+)", srv.log())
        assert found is not None, srv.log()
        folder = Path(found.group(1))
        assert any(folder.glob("*.db"))
    assert not folder.exists()


def test_configured_folder_is_emptied_at_start_and_kept(tmp_path: Path) -> None:
    folder = tmp_path / "prom"
    folder.mkdir()
    (folder / "counter_999999.db").write_bytes(b"stale from a previous run")
    settings = {"ONNXPOOL_SERVER__WORKERS": "1", "ONNXPOOL_METRICS__DIR": str(folder)}
    with running_server(tmp_path, settings, workers=1) as srv:
        assert not (folder / "counter_999999.db").exists()
        post_infer(srv)
        assert infer_count(scrape(srv)) == 1
    assert folder.is_dir()


def test_metrics_disabled(tmp_path: Path) -> None:
    settings = {"ONNXPOOL_SERVER__WORKERS": "1", "ONNXPOOL_METRICS__ENABLED": "false"}
    with running_server(tmp_path, settings, workers=1) as srv:
        assert requests.get(srv.url + "/metrics", timeout=10).status_code == 404
        reply = post_infer(srv)
        assert "infer;dur=" in reply.headers["Server-Timing"]
        assert re.fullmatch(r"[0-9a-f]{32}", reply.headers["X-Request-ID"])
