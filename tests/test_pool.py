"""The pre-fork pool through REAL gunicorn: pinning, one session per worker, replacement, v2 over HTTP."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import requests

from onnxpool.server.v2codec import BINARY_HEADER, encode_infer_request
from tests.harness import (
    DEMO_MODEL,
    MODEL_NAME,
    REPO,
    Server,
    clean_env,
    free_port,
    parse_cpu_list,
    proc_status,
    running_server,
)
from tests.v2client import decode_reply

INFER = f"/v2/models/{MODEL_NAME}/infer"


def shares(server: Server) -> dict[int, set[int]]:
    return {pid: parse_cpu_list(proc_status(pid)["Cpus_allowed_list"]) for pid in server.ready_workers()}


def reference(x: np.ndarray) -> np.ndarray:
    """The same model called in-process with onnxruntime (the ground truth)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(DEMO_MODEL), options, providers=["CPUExecutionProvider"])
    result: np.ndarray = session.run(None, {"input": x})[0]
    return result


def infer_binary(url: str, x: np.ndarray, binary_output: bool = True) -> np.ndarray:
    encoded = encode_infer_request({"input": x}, {"input"}, binary_output=binary_output, outputs=["logits"])
    reply = requests.post(url + INFER, data=encoded.body, headers=encoded.headers, timeout=30)
    assert reply.status_code == 200, reply.text
    assert (BINARY_HEADER in reply.headers) == binary_output
    return decode_reply(reply)["logits"]


def infer_json(url: str, x: np.ndarray) -> np.ndarray:
    """A client independent of our codec: nested `data` (allowed, see the README), Python's JSON writer."""
    doc = {"id": "req-7", "inputs": [{"name": "input", "datatype": "FP32", "shape": list(x.shape), "data": x.tolist()}]}
    reply = requests.post(url + INFER, json=doc, timeout=30)
    assert reply.status_code == 200, reply.text
    assert reply.headers["Content-Type"].startswith("application/json")
    body = reply.json()
    assert body["id"] == "req-7" and body["model_name"] == MODEL_NAME
    out = body["outputs"][0]
    assert out["name"] == "logits" and out["datatype"] == "FP32"
    return np.array(out["data"], dtype=np.float32).reshape(out["shape"])


def test_ready_and_metadata(server: Server) -> None:
    assert requests.get(server.url + "/v2/health/ready", timeout=5).json() == {"ready": True}
    assert requests.get(server.url + "/v2/health/live", timeout=5).status_code == 200
    meta = requests.get(server.url + "/v2", timeout=5).json()
    assert meta["name"] == "onnxpool" and "binary_tensor_data" in meta["extensions"]
    model = requests.get(f"{server.url}/v2/models/{MODEL_NAME}", timeout=5).json()
    assert model["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 3, 224, 224]}]
    assert model["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 1000]}]
    assert requests.get(f"{server.url}/v2/models/{MODEL_NAME}/ready", timeout=5).status_code == 200
    assert requests.get(f"{server.url}/v2/models/{MODEL_NAME}/versions/1/ready", timeout=5).status_code == 200


def threads_started_by_importing_onnxruntime() -> int:
    """OS threads `import onnxruntime` starts by itself (measured in a fresh process)."""
    code = (
        "t = lambda: int(open('/proc/self/status').read().split('Threads:')[1].split()[0])\n"
        "import numpy\nbefore = t()\nimport onnxruntime\nprint(t() - before)"
    )
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def test_workers_pinned_to_disjoint_shares_with_one_thread_each(server: Server) -> None:
    by_worker = shares(server)
    assert len(by_worker) == 2
    cores = list(by_worker.values())
    assert cores[0].isdisjoint(cores[1])
    assert set().union(*cores) == set(os.sched_getaffinity(0)) or len(os.sched_getaffinity(0)) > 2
    runtime_threads = threads_started_by_importing_onnxruntime()
    for pid, share in by_worker.items():
        # intra-op threads = share size: with 1 thread onnxruntime runs on the caller's thread,
        # so a sync worker has its main thread plus what importing onnxruntime starts, no pool;
        # its wide session ([model] wide_threads, workers/wide.py) has a pool thread per other worker.
        wide = int(re.search(rf"pid={pid} .* wide=(\d+) threads", server.log()).group(1))  # type: ignore[union-attr]
        assert int(proc_status(pid)["Threads"]) == 1 + runtime_threads + len(share) - 1 + wide - 1
        assert f"pid={pid} cores={','.join(map(str, sorted(share)))} threads={len(share)}" in server.log()


def test_taskset_mask_is_honoured(tmp_path: Path) -> None:
    with running_server(tmp_path, cpus="1") as srv:
        assert list(shares(srv).values()) == [{1}]


def test_one_worker_two_threads_gets_both_cores(tmp_path: Path) -> None:
    settings = {"ONNXPOOL_SERVER__WORKERS": "1", "ONNXPOOL_SERVER__THREADS_PER_WORKER": "2"}
    with running_server(tmp_path, settings, workers=1, cpus="0,1") as srv:
        [(pid, share)] = shares(srv).items()
        assert share == {0, 1}
        # the caller + one pool thread, plus what importing onnxruntime starts
        assert int(proc_status(pid)["Threads"]) == 2 + threads_started_by_importing_onnxruntime()


def test_warm_up_ran_before_ready(server: Server) -> None:
    lines = [line for line in server.log().splitlines() if "worker ready:" in line]
    assert len(lines) >= 2
    assert all("warm-up 3 runs (first" in line for line in lines)
    # [model] memory_arena = "auto": the arena is kept (and bounded); the memory is in the same line.
    assert all("arena=kept, given back past +64 MB" in line for line in lines)
    assert all("memory after warm-up: private " in line and " MB, PSS " in line for line in lines)


@pytest.mark.parametrize("batch", [1, 3])
def test_infer_matches_in_process_onnxruntime(server: Server, batch: int) -> None:
    x = np.random.default_rng(batch).standard_normal((batch, 3, 224, 224), dtype=np.float32)
    expected = reference(x)
    for got in (infer_binary(server.url, x), infer_binary(server.url, x, False), infer_json(server.url, x)):
        assert got.shape == (batch, 1000)
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_kill_9_worker_under_load_gets_replaced_on_the_same_cores(tmp_path: Path) -> None:
    with running_server(tmp_path, {"ONNXPOOL_SERVER__WORKERS": "2"}, workers=2) as srv:
        before = shares(srv)
        victim, victim_cores = next(iter(before.items()))
        x = np.zeros((1, 3, 224, 224), dtype=np.float32)
        stop = threading.Event()
        results: list[bool] = []

        def load() -> None:
            while not stop.is_set():
                try:
                    infer_binary(srv.url, x)
                    results.append(True)
                except (requests.RequestException, AssertionError):
                    results.append(False)

        clients = [threading.Thread(target=load) for _ in range(3)]
        for t in clients:
            t.start()
        try:
            time.sleep(0.5)
            os.kill(victim, signal.SIGKILL)
            killed_at = time.monotonic()
            replacement = [p for p in srv.wait_ready(2, timeout=30, exclude={victim}) if p not in before]
            recovered_in = time.monotonic() - killed_at
            time.sleep(0.5)
        finally:
            stop.set()
            for t in clients:
                t.join(30)
        assert len(replacement) == 1 and recovered_in < 10
        assert shares(srv)[replacement[0]] == victim_cores
        assert results.count(True) > 10
        assert results.count(False) <= 3  # at most the requests in flight on the killed worker
        assert infer_binary(srv.url, x).shape == (1, 1000)


def raw_request(
    server: Server, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        reply = conn.getresponse()
        status, data = reply.status, reply.read()
    finally:
        conn.close()
    assert reply.getheader("Content-Type", "").startswith("application/json"), data
    return status, json.loads(data)


def good_input(**overrides: object) -> dict[str, object]:
    entry: dict[str, object] = {"name": "input", "datatype": "FP32", "shape": [1, 3, 224, 224], "data": [0.0] * 150528}
    entry.update(overrides)
    return {"inputs": [entry]}


@pytest.mark.parametrize(
    ("method", "path", "body", "headers", "status", "message"),
    [
        ("POST", INFER, b"{not json", {}, 400, "not valid JSON"),
        ("POST", INFER, b"{}", {}, 400, "non-empty 'inputs'"),
        ("POST", INFER, json.dumps(good_input(name="pixels")).encode(), {}, 400, "unknown input 'pixels'"),
        ("POST", INFER, json.dumps(good_input(datatype="INT64")).encode(), {}, 400, "the model expects FP32"),
        ("POST", INFER, json.dumps(good_input(shape=[1, 3, 32, 32])).encode(), {}, 400, "dimension 2 must be 224"),
        ("POST", INFER, json.dumps(good_input(data=[0.0] * 10)).encode(), {}, 400, "has 10 values"),
        ("POST", INFER, json.dumps(good_input(shape=[30, 3, 224, 224])).encode(), {}, 400, "has 150528 values"),
        ("POST", INFER, json.dumps(good_input(shape=[10**6, 3, 224, 224])).encode(), {}, 413, "batch size 1000000"),
        ("POST", INFER, b"{}", {"Inference-Header-Content-Length": "x"}, 400, "must be a non-negative integer"),
        ("POST", "/v2/models/resnet/infer", b"{}", {}, 404, "unknown model 'resnet'"),
        ("POST", f"/v2/models/{MODEL_NAME}/versions/9/infer", b"{}", {}, 404, "has no version '9'"),
        ("GET", INFER, b"", {}, 405, "method GET is not allowed"),
        ("DELETE", "/v2/health/ready", b"", {}, 405, "not allowed"),
        ("GET", "/nothing/here", b"", {}, 404, "no route /nothing/here"),
    ],
)
def test_malformed_requests_get_a_4xx_naming_the_problem(
    server: Server, method: str, path: str, body: bytes, headers: dict[str, str], status: int, message: str
) -> None:
    workers = server.workers()
    got_status, reply = raw_request(server, method, path, body, headers)
    assert got_status == status
    assert message in reply["error"]
    assert server.workers() == workers  # nobody died


def test_body_over_the_limit_is_refused_before_it_is_read(server: Server) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.putrequest("POST", INFER)
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(64 * 1024 * 1024))
        conn.endheaders()  # not one byte of the declared 64 MiB is sent
        reply = conn.getresponse()
        assert reply.status == 413
        assert "the limit is 16777216" in json.loads(reply.read())["error"]
    finally:
        conn.close()
    assert requests.get(server.url + "/v2/health/ready", timeout=5).status_code == 200


def test_gthread_workers_serve_concurrent_keepalive_clients(tmp_path: Path) -> None:
    settings = {"ONNXPOOL_SERVER__WORKER_CLASS": "gthread", "ONNXPOOL_SERVER__HTTP_THREADS": "4"}
    with running_server(tmp_path, settings, workers=2) as srv:
        x = np.random.default_rng(0).standard_normal((1, 3, 224, 224), dtype=np.float32)
        expected = reference(x)
        request = encode_infer_request({"input": x}, {"input"}, binary_output=True)
        errors: list[str] = []

        def client() -> None:
            with requests.Session() as session:  # keep-alive: gthread holds the connection
                for _ in range(5):
                    reply = session.post(
                        srv.url + INFER,
                        data=request.body,
                        # no Content-Type, as in the README's client: the binary header alone marks the body
                        headers={BINARY_HEADER: str(request.header_length)},
                        timeout=30,
                    )
                    got = decode_reply(reply)["logits"]
                    if not np.allclose(got, expected, rtol=1e-4, atol=1e-4):
                        errors.append("wrong result")

        threads = [threading.Thread(target=client) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == []
        assert len(shares(srv)) == 2


def test_onnxpool_serve_command(tmp_path: Path) -> None:
    port = free_port()
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "onnxpool.cli", "serve", "--bind", f"127.0.0.1:{port}", "--workers", "1"],
            cwd=REPO,
            env=clean_env(),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    srv = Server(process=process, port=port, log_path=log_path)
    try:
        srv.wait_ready(1)
        assert len(srv.workers()) == 1  # exec'd in place: gunicorn's master is this very pid
    finally:
        srv.stop()


def test_master_holds_no_onnxruntime(server: Server) -> None:
    """No onnxruntime library, session or thread exists in the master that forks the workers."""
    assert int(proc_status(server.pid)["Threads"]) == 1
    maps = Path(f"/proc/{server.pid}/maps").read_text()
    assert "onnxruntime" not in maps
    assert all("onnxruntime" in Path(f"/proc/{pid}/maps").read_text() for pid in server.ready_workers())
