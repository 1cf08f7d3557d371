"""Faults mid-request, on real gunicorn with the slow test model.

- an inference longer than gunicorn's `timeout`: gunicorn kills the worker
  (SIGABRT, then SIGKILL while it is stuck in onnxruntime's C code), the client
  sees the connection closed, and the replacement takes over the same cores;
- `kill -9` of a worker while its request is in flight: only that request fails.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from tests.harness import Server, proc_status, running_server
from tests.slow_model import FOREVER, build_slow_model, infer_body, server_settings

pytestmark = pytest.mark.slow

INFER = "/v2/models/slow/infer"


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def _busy_worker(server: Server, settle: float = 0.6) -> int:
    """The worker burning CPU right now (the one running the slow inference)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        before = {pid: _cpu_ticks(pid) for pid in server.workers()}
        time.sleep(settle)
        delta = {pid: _cpu_ticks(pid) - ticks for pid, ticks in before.items() if pid in server.workers()}
        busy = [pid for pid, d in delta.items() if d >= settle * 100 * 0.3]  # >= 30% of a core
        if len(busy) == 1:
            return busy[0]
    raise AssertionError(f"no single busy worker found: {delta}")


class SlowRequest(threading.Thread):
    """One request for an endless inference, in the background; records how it ended."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.error: BaseException | None = None
        self.status: int | None = None
        self.seconds = 0.0

    def run(self) -> None:
        start = time.monotonic()
        try:
            self.status = requests.post(self.url + INFER, json=infer_body(FOREVER), timeout=60).status_code
        except requests.RequestException as exc:
            self.error = exc
        self.seconds = time.monotonic() - start


@pytest.fixture(scope="module")
def slow_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_slow_model(tmp_path_factory.mktemp("models") / "slow.onnx")


@dataclass
class SlowInFlight:
    """A server (2 workers, slow model) with one endless inference running on `busy`."""

    server: Server
    original: set[int]
    slow: SlowRequest
    busy: int
    cores: str

    def wait_replacement(self) -> int:
        """The pid of the worker that replaced `busy`, once it is warmed up."""
        return self.server.wait_ready(1, timeout=60, exclude=self.original)[0]


@contextlib.contextmanager
def slow_in_flight(tmp_path: Path, model: Path, extra: dict[str, str] | None = None) -> Iterator[SlowInFlight]:
    settings = server_settings(model) | {"ONNXPOOL_SERVER__WORKERS": "2"} | (extra or {})
    with running_server(tmp_path, settings, workers=2) as server:
        original = set(server.workers())
        slow = SlowRequest(server.url)
        slow.start()
        busy = _busy_worker(server)
        yield SlowInFlight(server, original, slow, busy, proc_status(busy)["Cpus_allowed_list"])


def test_inference_past_timeout_replaces_the_worker_on_the_same_cores(tmp_path: Path, slow_model: Path) -> None:
    with slow_in_flight(tmp_path, slow_model, {"ONNXPOOL_SERVER__TIMEOUT": "2"}) as run:
        server, slow, busy, cores = run.server, run.slow, run.busy, run.cores
        slow.join(30)
        assert not slow.is_alive(), "the client hung past gunicorn's timeout"
        assert slow.status is None and isinstance(slow.error, requests.ConnectionError), (slow.status, slow.error)
        assert 2 <= slow.seconds < 20
        assert f"WORKER TIMEOUT (pid:{busy})" in server.log()
        replacement = run.wait_replacement()
        assert busy not in server.workers()
        assert proc_status(replacement)["Cpus_allowed_list"] == cores
        reply = requests.post(server.url + INFER, json=infer_body(10), timeout=10)
        assert reply.status_code == 200
        assert reply.json()["outputs"][0]["data"] == [10.0]


def test_kill_9_mid_request_fails_only_that_request(tmp_path: Path, slow_model: Path) -> None:
    with slow_in_flight(tmp_path, slow_model) as run:
        server, slow, busy, cores = run.server, run.slow, run.busy, run.cores
        statuses: list[int | str] = []
        stop = threading.Event()

        def client() -> None:
            while not stop.is_set():
                try:
                    statuses.append(requests.post(server.url + INFER, json=infer_body(100), timeout=30).status_code)
                except requests.RequestException as exc:
                    statuses.append(type(exc).__name__)

        clients = [threading.Thread(target=client, daemon=True) for _ in range(3)]
        for thread in clients:
            thread.start()
        time.sleep(0.5)
        os.kill(busy, signal.SIGKILL)
        slow.join(15)
        replacement = run.wait_replacement()
        time.sleep(0.5)  # the replacement serves some of the traffic too
        stop.set()
        for thread in clients:
            thread.join(30)

        assert not slow.is_alive()
        assert slow.status is None and isinstance(slow.error, requests.ConnectionError), (slow.status, slow.error)
        assert statuses and all(s == 200 for s in statuses), sorted(set(map(str, statuses)))
        assert proc_status(replacement)["Cpus_allowed_list"] == cores
