"""Several models as a pod runs them (deploy/k8s/overlays/zoo): one process group per container.

Each model is `onnxpool serve` with $ONNXPOOL_POOL on the shared settings file, the host's routes are
`onnxpool routes`, the front door is `onnxpool nginx` (host/pod_front_door.py); they share one run
folder as the pod's containers share an emptyDir. This test plays the kubelet: it kills one model's
"container" (its whole process group, kill -9) while a client loops on the other model through the
front door, starts it again, and counts what the loop lost and what the states said. The same pod in
real containers: deploy/container/ci_image.py --overlay zoo.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from onnxpool.host.state import pool_socket
from tests.harness import clean_env, free_port
from tests.host_harness import (
    HOST_TEST_MARKS,
    SETOSA,
    group_members,
    image_table,
    iris_table,
    one_worker,
    write_settings,
)
from tests.test_host_faults import _zeros
from tests.tiny_models import build_tiny_model
from tests.v2client import LoadRunner, binary_infer

pytestmark = HOST_TEST_MARKS

START_SECONDS = 120.0
CLI = ["-m", "onnxpool.cli"]


@dataclass
class Pod:
    """The pod's containers as process groups (each its own session, as a container its own pid namespace)."""

    folder: Path
    config: Path
    port: int
    containers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    logs: list[Path] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    shared: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="onnxpool-pod-")))
    """The emptyDir: outside pytest's owner-only folders, so that nginx's workers (`nobody` when the
    tests run as root) reach the sockets in it."""

    def __post_init__(self) -> None:
        self.shared.chmod(0o711)

    @property
    def host_dir(self) -> Path:
        return self.shared / "host"

    def env(self, extra: dict[str, str]) -> dict[str, str]:
        return clean_env(
            {
                "ONNXPOOL_CONFIG": str(self.config),
                "ONNXPOOL_HOST_DIR": str(self.host_dir),
                "ONNXPOOL_SERVER__RUN_DIR": str(self.shared),
                "PYTHONUNBUFFERED": "1",
                **extra,
            }
        )

    def start(self, name: str) -> None:
        """Start (or, as the kubelet, restart) one container."""
        if name.startswith("model-"):
            model = name.removeprefix("model-")
            argv = [*CLI, "serve"]
            extra = {
                "ONNXPOOL_POOL": model,
                "ONNXPOOL_SERVER__BIND": pool_socket(self.host_dir, model),
                "ONNXPOOL_METRICS__DIR": str(self.host_dir / "metrics" / model),
                "ONNXPOOL_NGINX__PIDFILE": str(self.host_dir / "nginx" / "nginx.pid"),
            }
        elif name == "routes":
            argv, extra = [*CLI, "routes"], {}
        else:
            argv, extra = [*CLI, "nginx"], {"ONNXPOOL_SERVER__BIND": f"127.0.0.1:{self.port}"}
        log = self.folder / f"{name}-{len(self.logs)}.log"
        self.logs.append(log)
        with log.open("wb") as out:
            self.containers[name] = subprocess.Popen(
                [sys.executable, *argv],
                env=self.env(extra),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill(self, name: str) -> None:
        """A container's death: every process in it at once."""
        process = self.containers[name]
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def stop(self) -> dict[str, int | None]:
        """SIGTERM to every container at once (as the kubelet after preStop); their exit statuses."""
        for process in self.containers.values():
            if process.poll() is None:
                os.kill(process.pid, signal.SIGTERM)
        codes: dict[str, int | None] = {}
        for name, process in self.containers.items():
            try:
                codes[name] = process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                codes[name] = None
        for process in self.containers.values():
            try:
                os.killpg(process.pid, signal.SIGKILL)  # whatever a container left is gone with it
            except ProcessLookupError:
                pass
        shutil.rmtree(self.shared, ignore_errors=True)  # the emptyDir goes with the pod
        return codes

    def log(self) -> str:
        return "\n".join(f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}" for path in self.logs)

    def states(self) -> dict[str, str]:
        models = requests.get(self.url + "/v2/models", timeout=5).json()["models"]
        return {model["name"]: model["state"] for model in models}

    def wait(self, what: str, check: Callable[[], bool], timeout: float = START_SECONDS) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if check():
                    return
            except (requests.RequestException, KeyError, ValueError):
                pass
            if self.containers["nginx"].poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"{what}: not within {timeout:g} s\n{self.log()}")


def ready(pod: Pod) -> bool:
    return requests.get(pod.url + "/v2/health/ready", timeout=5).status_code == 200


def tiny_answers(pod: Pod) -> bool:
    return requests.post(f"{pod.url}/v2/models/tiny/infer", json=_zeros(), timeout=5).status_code == 200


def group_alive(pgid: int) -> bool:
    """A live, non-zombie member remains (a killed process that nobody reaped yet is a zombie, whatever the
    machine's pid 1 does with orphans: killpg(pgid, 0) would count it)."""
    return bool(group_members(pgid))


@pytest.fixture
def pod(tmp_path: Path) -> Iterator[Pod]:
    config = write_settings(
        tmp_path / "zoo.toml",
        iris_table("iris", one_worker(0.5)),
        image_table("tiny", build_tiny_model(tmp_path / "tiny.onnx", bias=0.0), one_worker(0.5)),
    )
    running = Pod(tmp_path, config, free_port())
    for name in ("model-iris", "model-tiny", "routes", "nginx"):
        running.start(name)
    try:
        running.wait("the pod ready through its front door", lambda: ready(running))
        yield running
    finally:
        running.stop()


def test_a_models_container_killed_is_its_own_trouble(pod: Pod) -> None:
    assert pod.states() == {"iris": "READY", "tiny": "READY"}
    assert tiny_answers(pod)
    call = binary_infer("iris", np.array([SETOSA], np.float32), output_name="probabilities")
    loop = LoadRunner(pod.url, call, clients=2, max_seconds=90, max_requests=1_000_000, retry_stale=True).start()
    try:
        loop.wait_for(20)
        killed = pod.containers["model-tiny"].pid
        pod.kill("model-tiny")
        seen = ["READY"]

        def unavailable() -> bool:
            seen.append(pod.states()["tiny"])
            return seen[-1] == "UNAVAILABLE"

        pod.wait("tiny UNAVAILABLE once its container died", unavailable, timeout=10)
        reason = next(
            m for m in requests.get(pod.url + "/v2/models", timeout=5).json()["models"] if m["name"] == "tiny"
        )
        assert "kubelet restarts" in str(reason.get("reason")), reason
        before = loop.stats.ok
        pod.start("model-tiny")  # the kubelet's restart
        pod.wait("tiny READY again", lambda: pod.states()["tiny"] == "READY" and tiny_answers(pod))
        loop.wait_for(before + 50)
    finally:
        stats = loop.stop()
    print(f"\nkill -9 of tiny's container: the loop on iris {stats.ok} / {stats.sent}, {len(stats.failures)} failed")
    assert stats.failures == [], stats.failures[:5]
    assert not group_alive(killed)
    assert pod.states() == {"iris": "READY", "tiny": "READY"}
    metrics = requests.get(pod.url + "/metrics", timeout=10).text
    assert 'onnxpool_model_pool_restarts_total{model="tiny"} 1.0' in metrics
    assert 'onnxpool_model_pool_restarts_total{model="iris"} 0.0' in metrics
    # The killed container's run folder went when its successor started (its lock was free), the
    # live ones stayed: the pid in a folder's name says nothing where every container's master is pid 1.
    runs = sorted(path.name for path in pod.shared.glob("onnxpool-*"))
    assert len(runs) == 2, runs


def test_a_required_model_that_cannot_start_is_unavailable_with_its_reason(tmp_path: Path) -> None:
    """A broken model file: its container exits with the error in its own log, the model lists say why,
    the pod is not ready (the readiness rule), the other model serves through the front door."""
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not an onnx model")
    config = write_settings(tmp_path / "zoo.toml", iris_table("iris", one_worker(0.5)),
                            image_table("broken", broken, one_worker(0.5)))  # fmt: skip
    pod = Pod(tmp_path, config, free_port())
    for name in ("model-iris", "model-broken", "routes", "nginx"):
        pod.start(name)
    try:
        pod.wait("broken UNAVAILABLE", lambda: pod.states().get("broken") == "UNAVAILABLE")
        assert pod.containers["model-broken"].wait(timeout=30) == 1
        assert "onnxpool: error:" in pod.logs[1].read_text()
        reply = requests.get(pod.url + "/v2/models/broken", timeout=5)
        assert reply.status_code == 503 and "broken.onnx" in reply.text, reply.text
        pod.wait("iris READY", lambda: pod.states().get("iris") == "READY")
        assert requests.post(f"{pod.url}/v1/models/iris:predict", json={"instances": [SETOSA]}, timeout=5).ok
        health = requests.get(pod.url + "/v2/health/ready", timeout=5)
        assert health.status_code == 503 and "broken" in health.text
    finally:
        codes = pod.stop()
    assert codes["nginx"] == 0 and codes["routes"] == 0 and codes["model-iris"] == 0, codes


def test_sigterm_stops_every_container_cleanly(pod: Pod) -> None:
    codes = pod.stop()
    assert set(codes.values()) == {0}, (codes, pod.log())
    assert not any(group_alive(process.pid) for process in pod.containers.values())


def test_the_pods_one_grpc_port_routes_each_call_to_its_models_container(tmp_path: Path) -> None:
    """[server] grpc_bind in the zoo's file: the front door's process runs the host's gRPC router beside nginx
    (started again if it dies), which sends each call to its model's container at its [models.<name>] grpc_bind."""
    router = f"127.0.0.1:{free_port()}"
    config = write_settings(
        tmp_path / "zoo.toml",
        iris_table("iris", one_worker(0.5) + f'grpc_bind = "127.0.0.1:{free_port()}"\n'),
        image_table("tiny", build_tiny_model(tmp_path / "tiny.onnx", bias=0.0),
                    one_worker(0.5) + f'grpc_bind = "127.0.0.1:{free_port()}"\n'),
        server=f'grpc_bind = "{router}"\n',
    )  # fmt: skip
    pod = Pod(tmp_path, config, free_port())
    for name in ("model-iris", "model-tiny", "routes", "nginx"):
        pod.start(name)
    try:
        pod.wait("the pod ready through its front door", lambda: ready(pod))
        client = grpcclient.InferenceServerClient(router)
        pod.wait("the router answering", lambda: client.is_server_ready())
        assert grpc_setosa(client) and client.is_model_ready("tiny")
        with pytest.raises(InferenceServerException) as unknown:
            client.get_model_metadata("nope")
        assert unknown.value.message() == "unknown model 'nope'; this host serves: iris, tiny"
        (router_pid,) = [pid for pid in children(pod.containers["nginx"].pid) if b"grpc_router" in cmdline(pid)]
        os.kill(router_pid, signal.SIGKILL)
        pod.wait("the router started again", lambda: grpc_setosa(grpcclient.InferenceServerClient(router)))
    finally:
        codes = pod.stop()
    assert set(codes.values()) == {0}, (codes, pod.log())


def grpc_setosa(client: grpcclient.InferenceServerClient) -> bool:
    tensor = grpcclient.InferInput("input", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.array([SETOSA], np.float32))
    try:
        probabilities = client.infer("iris", [tensor], client_timeout=5).as_numpy("probabilities")
    except InferenceServerException:
        return False
    return probabilities is not None and int(np.argmax(probabilities)) == 0


def children(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()
