"""Deployment behind real nginx: TCP and unix-socket upstreams, HUP model swap, SIGTERM drain, losing a host.

Every test starts its own nginx and onnxpool instances and stops exactly those
(process groups). Instances "on other hosts" live in their own network
namespaces when the machine allows it (root + ip netns), else on 127.0.0.x.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
import requests

from onnxpool.config.settings import ServerSettings
from tests.deploy_harness import Host, Instance, Nginx, host_addresses, nginx_binary, start_instance, start_nginx
from tests.harness import MODEL_NAME, REPO, free_port
from tests.tiny_models import build_tiny_model
from tests.v2client import LoadRunner, binary_infer, parse_binary_reply

pytestmark = [
    pytest.mark.nginx,
    pytest.mark.slow,
    pytest.mark.skipif(nginx_binary() is None, reason="nginx binary not installed (apt-get install nginx-light)"),
]

LIGHT = {
    "ONNXPOOL_SERVER__THREADS_PER_WORKER": "1",
    "ONNXPOOL_MODEL__WARMUP_RUNS": "1",
}
CORES = sorted(os.sched_getaffinity(0))
IMAGE = np.random.default_rng(7).standard_normal((1, 3, 224, 224)).astype(np.float32)


def core(i: int) -> list[int]:
    return [CORES[i % len(CORES)]]


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short path for unix sockets (108-byte limit; pytest's tmp_path can be longer)."""
    path = Path(tempfile.mkdtemp(prefix="onxp-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def infer_via(base_url: str, headers: dict[str, str] | None = None) -> tuple[np.ndarray, requests.Response]:
    call = binary_infer(MODEL_NAME, IMAGE)
    response = requests.post(
        base_url + call.path, data=call.body, headers={**call.headers, **(headers or {})}, timeout=30
    )
    return parse_binary_reply(response, call.output), response


def start_hosts_behind_nginx(tmp_path: Path, hosts: Sequence[Host], instances: list[Instance]) -> Nginx:
    """One light onnxpool per host (appended to `instances` as they start, so the caller can stop them) + nginx."""
    for i, host in enumerate(hosts):
        bind = f"{host.address}:{8000 if host.namespace else free_port()}"
        instances.append(
            start_instance(tmp_path, bind, LIGHT, namespace=host.namespace, cores=core(i), name=f"host{i}")
        )
    return start_nginx(tmp_path, [i.upstream for i in instances])


def stop_all(nginx: Nginx | None, *instances: Instance | None) -> None:
    if nginx is not None:
        nginx.stop()
    for instance in instances:
        if instance is not None:
            instance.stop()


def test_tcp_and_unix_socket_upstreams(tmp_path: Path, short_dir: Path) -> None:
    tcp = unix = front_tcp = front_unix = None
    try:
        tcp = start_instance(tmp_path, f"127.0.0.1:{free_port()}", LIGHT, cores=core(0), name="tcp")
        unix = start_instance(tmp_path, f"unix:{short_dir}/onnxpool.sock", LIGHT, cores=core(1), name="unix")
        assert (short_dir / "onnxpool.sock").is_socket()
        front_tcp = start_nginx(tmp_path, [tcp.upstream])
        front_unix = start_nginx(tmp_path, [unix.upstream], ServerSettings(max_body_bytes=1_000_000))

        direct, _ = infer_via(tcp.url)
        via_tcp, reply = infer_via(front_tcp.url, {"X-Request-ID": "abc-123"})
        via_unix, generated = infer_via(front_unix.url)
        assert direct.shape == via_tcp.shape == via_unix.shape == (1, 1000)
        np.testing.assert_allclose(via_tcp, direct, rtol=1e-5)
        np.testing.assert_allclose(via_unix, direct, rtol=1e-5)
        assert reply.headers["X-Request-ID"] == "abc-123"
        assert re.fullmatch(r"[0-9a-f]{32}", generated.headers["X-Request-ID"])
        # each front really used its own upstream
        assert front_tcp.wait_for_log_line(f"upstream={tcp.upstream} us=200"), front_tcp.access_log()
        assert front_unix.wait_for_log_line(f"upstream={unix.upstream} us=200"), front_unix.access_log()

        # nginx's own errors keep onnxpool's shape: too large a body -> 413 {"error": ...}
        too_big = requests.post(front_unix.url + f"/v2/models/{MODEL_NAME}/infer", data=b"x" * 1_100_000, timeout=10)
        assert too_big.status_code == 413
        assert "1000000" in too_big.json()["error"]
    finally:
        stop_all(front_tcp, tcp)
        stop_all(front_unix, unix)


def test_hup_swaps_model_without_failed_requests(tmp_path: Path) -> None:
    """Replace the model file, HUP the master: no request fails, new workers answer with the new model."""
    model = build_tiny_model(tmp_path / "model.onnx", bias=0.0)
    config = tmp_path / "onnxpool.toml"
    labels = REPO / "models" / "efficientnet-lite0" / "labels.txt"
    config.write_text(f'[model]\npath = "{model}"\n[task]\nlabels = "{labels}"\n')
    instance = front = None
    try:
        instance = start_instance(
            tmp_path, f"127.0.0.1:{free_port()}", {**LIGHT, "ONNXPOOL_CONFIG": str(config)}, workers=2
        )
        front = start_nginx(tmp_path, [instance.upstream])
        load = LoadRunner(front.url, binary_infer(MODEL_NAME, IMAGE), clients=3, max_requests=20000, max_seconds=60)
        load.start()
        load.wait_for(50)
        old_value = load.stats.marks[-1][1]
        old_workers = set(instance.workers())

        build_tiny_model(tmp_path / "model.onnx.new", bias=1.0)
        os.replace(tmp_path / "model.onnx.new", model)  # atomic: a worker never reads half a file
        instance.signal(signal.SIGHUP)
        instance.wait_ready(2, exclude=old_workers, timeout=30)
        deadline = time.monotonic() + 10  # well below graceful_timeout (30 s)
        while set(instance.workers()) & old_workers and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not set(instance.workers()) & old_workers, "old workers still running after HUP"
        old_gone = time.monotonic()
        load.wait_for(load.stats.ok + 100)
        stats = load.stop()
    finally:
        stop_all(front, instance)

    print(f"\nHUP: sent {stats.sent}, ok {stats.ok}, failed {stats.failed}")
    assert stats.failures == []
    assert stats.sent == stats.ok
    new_value = stats.marks[-1][1]
    assert new_value == pytest.approx(old_value + 1.0, abs=1e-4), "workers did not load the new model file"
    values = [round(v - old_value) for _, v in stats.marks]
    # every reply came from the old or the new model; while gunicorn briefly runs old and
    # new workers side by side either may answer, but once the old workers are gone (plus
    # a second for replies already on their way) only the new model answers
    assert set(values) == {0, 1}
    assert all(round(v - old_value) == 1 for t, v in stats.marks if t > old_gone + 1.0)


def test_sigterm_drains_in_flight_requests(tmp_path: Path) -> None:
    """SIGTERM one of two instances under load: its accepted requests finish, nginx sends the rest on."""
    with host_addresses(2) as hosts:
        instances: list[Instance] = []
        front = None
        try:
            front = start_hosts_behind_nginx(tmp_path, hosts, instances)
            batch = np.repeat(IMAGE, 4, axis=0)  # ~40 ms per request: always one in flight
            load = LoadRunner(front.url, binary_infer(MODEL_NAME, batch), clients=3, max_requests=5000, max_seconds=60)
            load.start()
            load.wait_for(20)
            victim = instances[0]
            victim.signal(signal.SIGTERM)
            sent_term = time.monotonic()
            victim.process.wait(40)
            drain_seconds = time.monotonic() - sent_term
            load.wait_for(load.stats.ok + 30)
            stats = load.stop()
            errors = front.error_log()
            log = victim.log()
        finally:
            stop_all(front, *instances)

    print(f"\nSIGTERM: sent {stats.sent}, ok {stats.ok}, failed {stats.failed}; hosts {hosts}")
    assert victim.process.returncode == 0, log
    # workers leave as soon as their request is done, not when graceful_timeout (30 s) runs out
    assert drain_seconds < 10, f"SIGTERM took {drain_seconds:.1f} s\n{log}"
    assert stats.failures == []
    # a request a worker had accepted and then cut would show up here, even if nginx retried it
    # ("reset by peer" is fine: a connection still in the closed listen queue, never accepted)
    assert "prematurely closed" not in errors


def test_kill_one_of_three_hosts(tmp_path: Path) -> None:
    """kill -9 a whole instance (master + workers) under load: no client sees a failure."""
    with host_addresses(3) as hosts:
        instances: list[Instance] = []
        front = None
        try:
            front = start_hosts_behind_nginx(tmp_path, hosts, instances)
            load = LoadRunner(front.url, binary_infer(MODEL_NAME, IMAGE), clients=4, max_requests=5000, max_seconds=60)
            load.start()
            load.wait_for(40)
            victim = instances[2]
            lines_before = len(front.access_log())
            os.killpg(victim.pid, signal.SIGKILL)
            victim.process.wait(10)
            load.wait_for(load.stats.ok + 120)
            stats = load.stop()
            after = front.access_log()[lines_before:]
        finally:
            stop_all(front, *instances)

    served = {i.upstream: sum(f"upstream={i.upstream} us=200" in line for line in after) for i in instances}
    print(f"\nkill -9: sent {stats.sent}, ok {stats.ok}, failed {stats.failed}; served after kill {served}")
    assert stats.failures == []
    assert stats.sent == stats.ok
    survivors = [i.upstream for i in instances[:2]]
    assert all(served[u] > 10 for u in survivors), served
    assert sum(" 200 " in line for line in after) >= 120
