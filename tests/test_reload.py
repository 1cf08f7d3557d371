"""HUP re-reads everything: a good model or settings file is served by the new workers, a broken one refused.

And it hands over without a gap: the old workers serve until every new one is warm
(tested behind real nginx with `max_queue_ms` set, so a gap would show as 503s).
"""

from __future__ import annotations

import logging
import math
import os
import re
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import requests

from onnxpool import hooks
from tests.deploy_harness import Instance, Nginx, nginx_binary, start_instance, start_nginx
from tests.harness import DATA, MODEL_NAME, Server, free_port, running_server
from tests.tiny_models import build_tiny_model
from tests.v2client import LoadRunner, binary_infer, parse_binary_reply

X = np.full((1, 3, 224, 224), 0.5, dtype=np.float32)


def first_logit(server: Server) -> float:
    call = binary_infer(MODEL_NAME, X)
    reply = requests.post(server.url + call.path, data=call.body, headers=call.headers, timeout=30)
    return float(parse_binary_reply(reply, call.output)[0, 0])


def hup_and_wait(server: Server, workers: int) -> None:
    old = set(server.ready_workers())
    server.signal(signal.SIGHUP)
    server.wait_ready(workers, timeout=60, exclude=old)
    deadline = time.monotonic() + 30
    while set(server.workers()) & old and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not set(server.workers()) & old, "old workers still running"


def test_hup_loads_a_good_new_file_and_refuses_a_broken_one(tmp_path: Path) -> None:
    model = tmp_path / "model.onnx"
    build_tiny_model(model, bias=0.0)
    settings = {"ONNXPOOL_MODEL__PATH": str(model), "ONNXPOOL_SERVER__WORKERS": "2"}
    with running_server(tmp_path, settings, workers=2) as srv:
        base = first_logit(srv)

        copies = run_folder(srv) / "models"
        first = served_copies(copies)
        assert len(first) == 1 and (first[0].parent / "model.onnx.data").is_file()  # the mapped form

        broken = tmp_path / "broken.onnx"
        broken.write_bytes(b"\x08\x07 half-written file" * 100)
        os.replace(broken, model)
        hup_and_wait(srv, 2)
        assert "reload: keeping the running configuration and the last good model" in srv.log()
        assert first_logit(srv) == base  # the new workers loaded the last good copy and serve
        assert served_copies(copies) == first  # the refused file's copy is gone, the last good one kept

        fresh = build_tiny_model(tmp_path / "next.onnx", bias=1.0)
        os.replace(fresh, model)
        hup_and_wait(srv, 2)
        assert abs(first_logit(srv) - (base + 1.0)) < 1e-4
        second = served_copies(copies)
        assert len(second) == 1 and second != first  # swapped: the old generation's folder removed
        assert srv.process.poll() is None


def served_copies(models: Path) -> list[Path]:
    """The served forms in the run folder's models/ (each in a folder of its own), besides nothing else."""
    assert all(folder.is_dir() for folder in models.iterdir())
    return sorted(models.glob("*/model.onnx"))


def run_folder(server: Server) -> Path:
    found = re.search(r"run folder: (\S+)", server.log())
    assert found, server.log()
    return Path(found.group(1))


def write_labels(path: Path, prefix: str) -> None:
    path.write_text("".join(f"{prefix}{i}\n" for i in range(1000)), encoding="utf-8")


def write_settings(path: Path, model: Path, labels: Path, top_k: int, extra: str = "") -> None:
    path.write_text(
        f'[model]\npath = "{model}"\nwarmup_runs = 1\n[task]\nlabels = "{labels}"\ntop_k = {top_k}\n{extra}',
        encoding="utf-8",
    )


def predict(server: Server, headers: dict[str, str] | None = None) -> requests.Response:
    with (DATA / "chelsea-cat.jpg").open("rb") as photo:
        return requests.post(server.url + "/predict", files={"image": photo}, headers=headers, timeout=30)


def labels_of(reply: requests.Response) -> list[str]:
    assert reply.status_code == 200, reply.text
    return [p["label"] for p in reply.json()["predictions"][0]]


def test_hup_applies_every_setting_and_keeps_the_last_good_ones(tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "model.onnx", bias=0.0)
    labels, config = tmp_path / "labels.txt", tmp_path / "onnxpool.toml"
    write_labels(labels, "old-")
    write_settings(config, model, labels, top_k=3)
    with running_server(tmp_path, {"ONNXPOOL_SERVER__WORKERS": "2"}, workers=2, config=config) as srv:
        before = labels_of(predict(srv))
        assert len(before) == 3 and all(name.startswith("old-") for name in before)

        # New labels, a new top_k default and an API key: all applied by a HUP, no restart.
        write_labels(labels, "new-")
        key = "k" * 24
        write_settings(config, model, labels, top_k=2, extra=f'[auth]\napi_keys = ["{key}"]\n')
        hup_and_wait(srv, 2)
        assert predict(srv).status_code == 401
        after = labels_of(predict(srv, {"Authorization": f"Bearer {key}"}))
        assert after == [name.replace("old-", "new-") for name in before[:2]]

        # A broken settings file, then a labels file that no longer fits the model: both refused.
        config.write_text("[model\ntop_k = 7\n", encoding="utf-8")
        hup_and_wait(srv, 2)
        labels.write_text("only\nthree\nlabels\n", encoding="utf-8")
        write_settings(config, model, labels, top_k=5)
        hup_and_wait(srv, 2)
        assert srv.log().count("reload: keeping the running configuration") == 2
        assert labels_of(predict(srv, {"Authorization": f"Bearer {key}"})) == after
        assert srv.process.poll() is None


# The demo model, one thread per worker, max_queue_ms 250. Each new worker's warm-up is made to take
# about WARM_UP_SECONDS by design, whatever the CPU: the warm-up runs are set from the inference time the
# first workers measured (their ready line), so a gap in the hand-over would always be past max_queue_ms.
HANDOFF_SETTINGS = {
    "ONNXPOOL_SERVER__THREADS_PER_WORKER": "1",
    "ONNXPOOL_LIMITS__MAX_QUEUE_MS": "250",
    "ONNXPOOL_CACHE__ENABLED": "false",  # every request needs a worker's inference
}
WARM_UP_SECONDS = 1.2
READY_LINE = re.compile(r"model load (\d+) ms, warm-up (\d+) runs \(first ([\d.]+) ms, last ([\d.]+) ms\)")


def warm_up_seconds(log: str) -> list[float]:
    """Each ready worker's model load + warm-up, from its ready line (first run + the rest at the last's pace)."""
    return [
        (int(load) + float(first) + (int(runs) - 1) * float(last)) / 1000
        for load, runs, first, last in READY_LINE.findall(log)
    ]


def runs_for(log: str, seconds: float) -> int:
    """Warm-up runs that take `seconds` at the slowest inference the ready lines so far measured."""
    slowest = max(float(last) for *_, last in READY_LINE.findall(log))
    return max(10, math.ceil(seconds * 1000 / max(slowest, 0.01)))


@pytest.mark.slow
@pytest.mark.nginx
@pytest.mark.skipif(nginx_binary() is None, reason="nginx binary not installed (apt-get install nginx-light)")
def test_hup_keeps_the_old_workers_serving_until_the_new_ones_are_warm(tmp_path: Path) -> None:
    """Two HUPs under a closed client loop through nginx: no request shed, and the workers really changed.

    Without the hand-over, gunicorn stops the old workers as soon as it has forked the new ones,
    and requests wait in the listen backlog for a whole warm-up: past max_queue_ms, so shed (503).
    """
    config = tmp_path / "onnxpool.toml"
    config.write_text("[model]\nwarmup_runs = 20\n", encoding="utf-8")
    instance: Instance | None = None
    front: Nginx | None = None
    try:
        settings = {**HANDOFF_SETTINGS, "ONNXPOOL_CONFIG": str(config)}
        instance = start_instance(tmp_path, f"127.0.0.1:{free_port()}", settings, workers=2)
        runs = runs_for(instance.log(), WARM_UP_SECONDS)
        config.write_text(f"[model]\nwarmup_runs = {runs}\n", encoding="utf-8")
        hup_and_wait(instance, 2)  # from now on each new worker warms up for WARM_UP_SECONDS or more
        measured_from = len(READY_LINE.findall(instance.log()))
        front = start_nginx(tmp_path, [instance.upstream])
        load = LoadRunner(front.url, binary_infer(MODEL_NAME, X), clients=2, max_requests=100_000, max_seconds=45)
        load.start()
        load.wait_for(20)
        generations = [set(instance.workers())]
        for more in (1, 2):  # each HUP reads a changed file (a HUP that changes nothing forks no workers)
            config.write_text(f"[model]\nwarmup_runs = {runs + more}\n", encoding="utf-8")
            hup_and_wait(instance, 2)
            generations.append(set(instance.workers()))
            load.wait_for(load.stats.ok + 20)
        stats = load.stop()
        log = instance.log()
    finally:
        if front is not None:
            front.stop()
        if instance is not None:
            instance.stop()

    warm = warm_up_seconds(log)[measured_from:]
    shed = sum("HTTP 503" in failure for failure in stats.failures)
    print(f"\nHUP x2: sent {stats.sent}, ok {stats.ok}, shed {shed}, failed {len(stats.failures)}; warm-up {warm}")
    assert len(warm) == 4 and min(warm) > 0.5, warm  # each warm-up is clearly longer than max_queue_ms
    assert all(len(g) == 2 for g in generations)
    assert not generations[0] & generations[1] and not generations[1] & generations[2], generations  # reloaded
    assert stats.failures == [], stats.failures[:5]


def test_a_hup_that_changes_nothing_forks_no_workers_and_one_that_does_replaces_them(tmp_path: Path) -> None:
    """The same file, task files and model: the workers serve on (no warm-up for nothing), and the master is
    free at once (a dead worker replaced, the next HUP applied), not after graceful_timeout; an edited labels
    file: new workers, serving the new labels."""
    model = build_tiny_model(tmp_path / "model.onnx", bias=0.0)
    labels, config = tmp_path / "labels.txt", tmp_path / "onnxpool.toml"
    write_labels(labels, "old-")
    write_settings(config, model, labels, top_k=1)
    # gunicorn's reload() waits up to graceful_timeout for the workers older than it to exit: 300 s here, so a
    # master stuck in that wait after a HUP that replaced none cannot pass below.
    settings = {"ONNXPOOL_SERVER__WORKERS": "2", "ONNXPOOL_SERVER__GRACEFUL_TIMEOUT": "300"}
    with running_server(tmp_path, settings, workers=2, config=config) as srv:
        before = set(srv.workers())
        srv.signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while "the workers serve on" not in srv.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "reload: the settings, task, keys and model read are the ones served: the workers serve on" in srv.log()
        time.sleep(0.5)
        assert set(srv.workers()) == before, "a HUP that changed nothing replaced the workers"
        assert labels_of(predict(srv))[0].startswith("old-")

        victim = sorted(before)[0]
        os.kill(victim, signal.SIGKILL)
        srv.wait_ready(1, timeout=60, exclude=before)  # its replacement: the master runs its loop again
        assert victim not in srv.workers()

        write_labels(labels, "new-")
        hup_and_wait(srv, 2)
        assert labels_of(predict(srv))[0].startswith("new-")


class FakeWorker:
    """A gunicorn worker as the master sees it: pid, age and its heartbeat file (open, unlinked)."""

    def __init__(self, pid: int, age: int, warm: bool) -> None:
        self.pid, self.age = pid, age
        self.tmp = tempfile.TemporaryFile()
        if warm:
            hooks.say_warm(self)


class FakeArbiter:
    """Stands in for gunicorn's Arbiter: the workers, and the calls the hand-over wraps and makes."""

    def __init__(self, workers: list[FakeWorker], num_workers: int, graceful_timeout: float = 10.0) -> None:
        self.WORKERS = {w.pid: w for w in workers}
        self.num_workers = num_workers
        self.cfg = SimpleNamespace(graceful_timeout=graceful_timeout)
        self.dead: set[int] = set()  # exited, reaped at the next reap_workers()
        self.killed: list[int] = []
        self.managed_at = 0.0

    def manage_workers(self) -> None:
        """gunicorn's: SIGTERM the oldest workers beyond num_workers (they stay listed until reaped)."""
        self.managed_at = time.monotonic()
        by_age = sorted(self.WORKERS.values(), key=lambda w: w.age)
        for worker in by_age[: max(len(by_age) - self.num_workers, 0)]:
            self.kill_worker(worker.pid, signal.SIGTERM)

    def kill_worker(self, pid: int, sig: int) -> None:
        self.killed.append(pid)

    def reap_workers(self) -> None:
        for pid in self.dead & self.WORKERS.keys():
            self.WORKERS.pop(pid).tmp.close()


@pytest.fixture
def workers() -> Iterator[list[FakeWorker]]:
    """Old generation 101, 102 (warm), new generation 103, 104 (warming up); files closed afterwards."""
    made = [FakeWorker(100 + age, age, warm=age <= 2) for age in (1, 2, 3, 4)]
    yield made
    for worker in made:
        worker.tmp.close()


def later(seconds: float, action: Callable[[], object]) -> threading.Timer:
    timer = threading.Timer(seconds, action)
    timer.start()
    return timer


def test_reload_stops_the_old_workers_once_the_new_are_warm(workers: list[FakeWorker]) -> None:
    arbiter = FakeArbiter(workers, num_workers=2)
    hooks.hand_over_on_reload(arbiter)
    t0 = time.monotonic()
    timers = [later(0.2, lambda: hooks.say_warm(workers[2])), later(0.4, lambda: hooks.say_warm(workers[3]))]
    arbiter.manage_workers()
    for timer in timers:
        timer.join()
    assert arbiter.managed_at - t0 >= 0.4  # gunicorn's stop of the old ones ran after the last new one was warm
    assert arbiter.killed == [101, 102]


def test_start_and_replacement_are_not_slowed_down(workers: list[FakeWorker]) -> None:
    arbiter = FakeArbiter(workers[2:], num_workers=2)  # both warming up: a start, or replacements
    hooks.hand_over_on_reload(arbiter)
    t0 = time.monotonic()
    arbiter.manage_workers()
    assert arbiter.managed_at - t0 < 0.05 and arbiter.killed == []


@pytest.mark.parametrize(("graceful_timeout", "waited"), [(0.3, (0.3, 1.0)), (0, (0.0, 0.05))])
def test_the_wait_is_bounded_by_graceful_timeout(
    workers: list[FakeWorker], caplog: pytest.LogCaptureFixture, graceful_timeout: float, waited: tuple[float, float]
) -> None:
    """At most graceful_timeout (one warning line), then as gunicorn does without the hand-over;
    graceful_timeout = 0: no wait, no line."""
    arbiter = FakeArbiter(workers, num_workers=2, graceful_timeout=graceful_timeout)
    hooks.hand_over_on_reload(arbiter)
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="onnxpool.workers"):
        arbiter.manage_workers()
    assert waited[0] <= arbiter.managed_at - t0 < waited[1]
    assert arbiter.killed == [101, 102]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    if graceful_timeout:
        assert len(warnings) == 1 and "2 new worker(s) not warm after 0.3 s" in warnings[0], warnings
    else:
        assert not caplog.records


def test_a_new_worker_dying_while_warming_up_neither_hangs_nor_leaves_an_old_one(workers: list[FakeWorker]) -> None:
    arbiter = FakeArbiter(workers, num_workers=2)
    hooks.hand_over_on_reload(arbiter)
    hooks.say_warm(workers[2])
    timer = later(0.2, lambda: arbiter.dead.add(104))  # killed (say, out of memory) while warming up
    t0 = time.monotonic()
    arbiter.manage_workers()
    timer.join()
    assert arbiter.managed_at - t0 < 2
    # gunicorn stops one old worker (3 listed, 2 wanted); the other old one is stopped too, so the
    # next round forks a worker of the new generation instead of keeping the old one serving.
    assert sorted(arbiter.killed) == [101, 102]
