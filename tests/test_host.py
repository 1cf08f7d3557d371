"""Several models on one host (`onnxpool serve` on a `[models.<name>]` file, onnxpool.host): real gunicorn
pools behind the real nginx front door, every check through that ONE port.

- every route of every model: Triton (tritonclient) infer, readiness and metadata; the official
  `openai` client on either of two text-embedding models, an alias and an unknown model (404 in
  OpenAI's shape); KServe v1; the image upload; the host's own routes (model list, repository index,
  health) and one /metrics with every model's series;
- each worker's cores, nice value and cgroup weight, read from /proc and /sys, are its model's
  plan as the host printed it; a worker killed with SIGKILL comes back on the same model's plan;
- SIGHUP adds one model and removes another while a client loops on a third: no request fails
  and the third's workers are the same processes;
- a missing optional model file is one line and the model is UNAVAILABLE; a missing required one,
  or a bad settings file, is one line and exit 1; a dead pool master stops the host (exit 1).

The small models: iris (models/iris), the demo image model, tests/tiny_models.py and the tiny text
encoders of tests/text_models.py (two, with different weights). The shipped config/zoo.toml (with
the real MiniLM, `make minilm`) is served once too: skipped without models/minilm outside CI.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import openai
import pytest
import requests
import tritonclient.http as triton
from prometheus_client.parser import text_string_to_metric_families

from onnxpool.host.front_door import js_module
from onnxpool.measure.paths import CAT_JPEG
from tests.deploy_harness import nginx_binary
from tests.harness import REPO, Server, children_of, clean_env, free_port, parse_cpu_list, proc_status, spawn_logged
from tests.slow_model import build_slow_model, infer_body
from tests.text_models import build_encoder, build_text_model_folder, vocabulary
from tests.tiny_models import build_tiny_model
from tests.v2client import LoadRunner, binary_infer, parse_binary_reply

NGINX = nginx_binary()
pytestmark = [
    pytest.mark.nginx,
    pytest.mark.slow,
    pytest.mark.skipif(NGINX is None, reason="nginx binary not installed (apt-get install nginx-light)"),
]

IMAGE_MODEL = REPO / "models" / "efficientnet-lite0" / "model.onnx"
IMAGE_LABELS = REPO / "models" / "efficientnet-lite0" / "labels.txt"
IRIS = REPO / "models" / "iris"
MINILM = REPO / "models" / "minilm" / "model.onnx"
SETOSA = [5.1, 3.5, 1.4, 0.2]
CAT_LABELS = {"Egyptian cat", "tiger cat", "tabby"}
START_SECONDS = 120.0

# --- settings files -------------------------------------------------------------------------------


def iris_table(name: str, extra: str = "") -> str:
    return (
        f'[models."{name}"]\npath = "{IRIS / "model.onnx"}"\ntask = "tabular"\n{extra}'
        f'[tasks."{name}"]\nlabels = "{IRIS / "labels.txt"}"\n'
        'features = ["sepal_length", "sepal_width", "petal_length", "petal_width"]\n'
    )


def image_table(name: str, path: Path, extra: str = "") -> str:
    return (
        f'[models."{name}"]\npath = "{path}"\ntask = "image-classification"\nwarmup_runs = 1\n{extra}'
        f'[tasks."{name}"]\nlabels = "{IMAGE_LABELS}"\n'
    )


def text_table(name: str, folder: Path, extra: str = "") -> str:
    return (
        f'[models."{name}"]\npath = "{folder / "model.onnx"}"\ntask = "text-embedding"\n{extra}'
        f'[tasks."{name}"]\nmax_batch = 8\nmax_length = 48\n'
    )


def write_settings(path: Path, *tables: str, server: str = "") -> Path:
    """A several-model settings file (written beside, then renamed: a reload never reads half of it)."""
    partial = path.with_name(f".{path.name}.new")
    partial.write_text(f"[server]\n{server}\n" + "\n".join(tables), encoding="utf-8")
    os.replace(partial, path)
    return path


def two_workers(cpus: float) -> str:
    """A model's budget on 2 single-threaded workers (bounded however many cores the machine has)."""
    return f"cpus = {cpus}\nworkers = 2\nthreads_per_worker = 1\n"


def one_worker(cpus: float) -> str:
    return f"cpus = {cpus}\nworkers = 1\nthreads_per_worker = 1\n"


# --- the host process and what it printed ---------------------------------------------------------

PLAN_LINE = re.compile(
    r"onnxpool\.host: model (?P<name>\S+): budget (?P<budget>\S+) cpu; (?P<workers>\d+) workers x "
    r"(?P<threads>\d+) threads; cores (?P<cores>.+?); priority (?P<priority>.+)$",
    re.MULTILINE,
)
LISTENING = re.compile(r"Listening at: unix:\S+/pools/(?P<name>[^/\s]+)\.sock \((?P<pid>\d+)\)")
WORKER_READY = re.compile(r"worker ready: slot=(?P<slot>\d+) pid=(?P<pid>\d+)")


@dataclass(frozen=True)
class Plan:
    """One model's plan line: `cores w0:0 w1:1` (or `unpinned within 0,1`) and its priority."""

    name: str
    workers: int
    cores: str
    priority: str

    def cores_of(self, slot: int) -> set[int]:
        if self.cores.startswith("unpinned within "):
            return parse_cpu_list(self.cores.removeprefix("unpinned within "))
        shares = dict(share.split(":", 1) for share in self.cores.split())
        return parse_cpu_list(shares[f"w{slot}"])

    @property
    def nice(self) -> int:
        """The nice value each worker must have (0 when a cgroup carries the weight)."""
        found = re.fullmatch(r"nice (\d+) per worker", self.priority)
        return int(found.group(1)) if found else 0

    @property
    def weight(self) -> float:
        """The model's kernel weight: its cgroup's, else its workers' together (nice 0 weighs 1024)."""
        group = self.cgroup
        return group[1] if group is not None else self.workers * 1024 / 1.25**self.nice

    @property
    def cgroup(self) -> tuple[str, int, Path] | None:
        """(weight file, value, the model's cgroup folder), or None with nice values."""
        found = re.fullmatch(r"cgroup v(1|2) (cpu\.shares|cpu\.weight)=(\d+) \((.+)\)", self.priority)
        if found is None:
            assert self.priority.startswith("nice "), self.priority
            return None
        return found.group(2), int(found.group(3)), Path(found.group(4))


@dataclass
class Host:
    """A running `onnxpool serve` on a several-model file, in its own process group."""

    server: Server
    config: Path

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def pid(self) -> int:
        return self.server.pid

    def log(self) -> str:
        return self.server.log()

    def plans(self, every: bool = False) -> dict[str, Plan]:
        """The models' plan lines since the last reload that printed some (`every`: all, the last line each)."""
        text = self.log()
        if not every:
            for reload in reversed(list(re.finditer(r"onnxpool\.host: reload: re-reading", text))):
                if PLAN_LINE.search(text, reload.end()):
                    text = text[reload.end() :]
                    break
        return {
            m["name"]: Plan(m["name"], int(m["workers"]), m["cores"], m["priority"]) for m in PLAN_LINE.finditer(text)
        }

    def masters(self) -> dict[str, int]:
        """Each model's pool master (a child of the host) by the socket gunicorn said it listens on."""
        children = set(children_of(self.pid))
        return {m["name"]: int(m["pid"]) for m in LISTENING.finditer(self.log()) if int(m["pid"]) in children}

    def workers(self, model: str) -> dict[int, int]:
        """The model's live workers that said they are ready: pid -> slot."""
        alive = set(children_of(self.masters()[model]))
        ready = {int(m["pid"]): int(m["slot"]) for m in WORKER_READY.finditer(self.log())}
        return {pid: slot for pid, slot in ready.items() if pid in alive}

    def wait_for(self, what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
        """Until `check()` (a request error or a model not started yet counts as not yet)."""
        deadline = time.monotonic() + timeout
        while True:
            if self.server.process.poll() is not None:
                raise AssertionError(f"host exited ({self.server.process.returncode}) before {what}:\n{self.log()}")
            with contextlib.suppress(requests.RequestException, KeyError, OSError):
                if check():
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not after {timeout} s\n{self.log()}")
            time.sleep(0.05)

    def wait_ready(self, timeout: float = START_SECONDS) -> None:
        """Every planned worker of every model ready, and the front door answering ready."""

        def ready() -> bool:
            plans, masters = self.plans(), self.masters()
            return (
                bool(plans)
                and set(masters) >= set(plans)
                and all(len(self.workers(name)) == plan.workers for name, plan in plans.items())
                and requests.get(self.url + "/v2/health/ready", timeout=5).status_code == 200
            )

        self.wait_for("every model ready", ready, timeout)

    def stop(self) -> int | None:
        """SIGTERM to the host alone (nginx first, then the pools), then whatever is left of its group."""
        if self.server.process.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.server.process.wait(40)
        status = self.server.process.returncode
        self.server.stop()
        # A host that could not clean up leaves its cgroups (empty once its killed processes are reaped).
        folders = [plan.cgroup[2] for plan in self.plans(every=True).values() if plan.cgroup is not None]
        deadline = time.monotonic() + 5
        for folder in [*folders, *{folder.parent for folder in folders}]:
            while folder.exists() and time.monotonic() < deadline:
                with contextlib.suppress(OSError):
                    folder.rmdir()
                    break
                time.sleep(0.05)
        return status


def serve_argv(config: Path) -> list[str]:
    return [sys.executable, "-m", "onnxpool.cli", "serve", "--config", str(config)]


def start_host(
    folder: Path, config: Path, *, cores: int | None = None, env_extra: dict[str, str] | None = None
) -> Host:
    """`onnxpool serve` on `config` (bound to a free port); `cores`: under taskset, on that many cores
    (a file whose models have "auto" workers then starts as many as on a machine of that size)."""
    port = free_port()
    env = clean_env({"ONNXPOOL_SERVER__BIND": f"127.0.0.1:{port}", "PYTHONUNBUFFERED": "1", **(env_extra or {})})
    log_path = folder / f"host-{port}.log"
    argv = serve_argv(config)
    if cores is not None and shutil.which("taskset"):
        argv = ["taskset", "-c", ",".join(map(str, sorted(os.sched_getaffinity(0))[:cores])), *argv]
    process = spawn_logged(argv, log_path, env)
    host = Host(Server(process=process, port=port, log_path=log_path, env=env, bind=f"127.0.0.1:{port}"), config)
    try:
        host.wait_ready()
    except BaseException:
        host.stop()
        raise
    return host


@contextlib.contextmanager
def running_host(
    folder: Path, config: Path, cores: int | None = None, env_extra: dict[str, str] | None = None
) -> Iterator[Host]:
    host = start_host(folder, config, cores=cores, env_extra=env_extra)
    try:
        yield host
    finally:
        host.stop()


def run_once(config: Path, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """`onnxpool serve` expected to refuse: its exit status and everything it printed."""
    env = clean_env({"ONNXPOOL_SERVER__BIND": f"127.0.0.1:{free_port()}"})
    return subprocess.run(
        serve_argv(config), env=env, cwd=config.parent, capture_output=True, text=True, timeout=timeout, check=False
    )


def need_js_module() -> None:
    """Two text-embedding models: nginx routes OpenAI's requests by their body with its js module."""
    assert NGINX is not None
    if js_module(NGINX) is None:
        if os.environ.get("CI"):
            pytest.fail("nginx's js module is not installed: .ci/run installs libnginx-mod-http-js")
        pytest.skip("nginx's js module is not installed (apt-get install libnginx-mod-http-js)")


# --- /proc ----------------------------------------------------------------------------------------


def nice_of(pid: int) -> int:
    """Field 19 of /proc/<pid>/stat (the command in field 2 may hold spaces: count after its ')')."""
    after_command = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return int(after_command[19 - 3])


def cpu_cgroup_of(pid: int) -> str:
    """The process's cgroup for CPU weights: v1's cpu hierarchy, else the v2 line."""
    lines = [line.split(":", 2) for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()]
    v1 = [path for _, controllers, path in lines if "cpu" in controllers.split(",")]
    return v1[0] if v1 else next(path for _, controllers, path in lines if controllers == "")


def group_members(pgid: int) -> list[int]:
    """The live processes of a process group (the host's: its pools, their workers, nginx)."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
                if int(fields[5 - 3]) == pgid and fields[0] != "Z":
                    members.append(int(entry.name))
    return sorted(members)


def check_worker(pid: int, slot: int, plan: Plan) -> None:
    """The worker's cores, nice value and cgroup (with its weight) are its model's plan."""
    where = f"model {plan.name} worker pid {pid} slot {slot}"
    assert parse_cpu_list(proc_status(pid)["Cpus_allowed_list"]) == plan.cores_of(slot), where
    assert nice_of(pid) == plan.nice, where
    group = plan.cgroup
    if group is not None:
        weight_file, value, folder = group
        own = cpu_cgroup_of(pid)
        assert own != "/" and folder.as_posix().endswith(own), (where, own, folder)
        assert int((folder / weight_file).read_text()) == value, where
        assert str(pid) in (folder / "cgroup.procs").read_text().split(), where


def check_every_worker(host: Host) -> None:
    plans, masters = host.plans(), host.masters()
    children = set(children_of(host.pid))
    for name, plan in plans.items():
        assert masters[name] in children, f"model {name}: its master is not the host's child"
        workers = host.workers(name)
        assert sorted(children_of(masters[name])) == sorted(workers), f"model {name}: a worker never said ready"
        assert sorted(workers.values()) == list(range(plan.workers)), (name, workers)
        for pid, slot in workers.items():
            check_worker(pid, slot, plan)


# --- requests -------------------------------------------------------------------------------------


def kserve(host: Host, model: str, rows: list[list[float]] | None = None) -> requests.Response:
    return requests.post(f"{host.url}/v1/models/{model}:predict", json={"instances": rows or [SETOSA]}, timeout=30)


def infer_ok(host: Host, model: str) -> bool:
    """The tiny image model answers a v2 infer through the front door."""
    call = binary_infer(model, np.zeros((1, 3, 224, 224), np.float32))
    return requests.post(host.url + call.path, data=call.body, headers=call.headers, timeout=10).status_code == 200


def model_list(host: Host) -> dict[str, dict[str, object]]:
    reply = requests.get(host.url + "/v2/models", timeout=10)
    assert reply.status_code == 200, reply.text
    return {model["name"]: model for model in reply.json()["models"]}


def metric_models(host: Host) -> dict[str, set[str]]:
    """The `model` labels of every series of one GET /metrics, by metric family."""
    reply = requests.get(host.url + "/metrics", timeout=10)
    assert reply.status_code == 200, reply.text
    found: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(reply.text):
        for sample in family.samples:
            if "model" in sample.labels:
                found.setdefault(family.name, set()).add(sample.labels["model"])
    return found


def openai_client(host: Host) -> openai.OpenAI:
    return openai.OpenAI(base_url=host.url + "/v1", api_key="not-checked", max_retries=0, timeout=30)


def vectors(reply: openai.types.CreateEmbeddingResponse) -> np.ndarray:
    return np.array([item.embedding for item in reply.data], dtype=np.float32)


# --- the shared host: an image model, iris, two text embedders ------------------------------------

MODELS = ("image", "iris", "text-a", "text-b")


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    need_js_module()
    folder = tmp_path_factory.mktemp("host")
    text_a = build_text_model_folder(folder / "text-a")
    text_b = build_text_model_folder(folder / "text-b")
    build_encoder(text_b / "model.onnx", len(vocabulary()), seed=1)  # other weights: other vectors
    config = write_settings(
        folder / "host.toml",
        image_table("image", IMAGE_MODEL, two_workers(1.0) + 'aliases = ["cat-finder"]\n'),
        iris_table("iris", two_workers(0.25) + 'aliases = ["iris-v1"]\n'),
        text_table("text-a", text_a, one_worker(0.5) + 'aliases = ["text-a-v1", "org/text-a"]\n'),
        text_table("text-b", text_b, one_worker(0.25)),
    )
    with running_host(folder, config) as running:
        yield running


def test_every_model_answers_by_every_route_through_one_port(host: Host) -> None:
    # The host's routes: every model, its versions, aliases and state.
    assert requests.get(host.url + "/v2/health/ready", timeout=10).json() == {"ready": True}
    listed = model_list(host)
    assert list(listed) == list(MODELS)
    assert all(model["state"] == "READY" and model["versions"] == ["1"] for model in listed.values())
    assert listed["text-a"]["aliases"] == ["text-a-v1", "org/text-a"]
    index = requests.post(host.url + "/v2/repository/index", timeout=10)
    assert index.status_code == 200
    assert index.json() == [{"name": name, "version": "1", "state": "READY", "reason": ""} for name in MODELS]
    only_ready = requests.post(host.url + "/v2/repository/index", json={"ready": True}, timeout=10)
    assert [entry["name"] for entry in only_ready.json()] == list(MODELS)
    for name in (*MODELS, "cat-finder", "iris-v1", "text-a-v1"):
        ready = requests.get(f"{host.url}/v2/models/{name}/ready", timeout=10)
        assert ready.status_code == 200, (name, ready.text)
    assert requests.get(f"{host.url}/v2/models/nobody/ready", timeout=10).status_code == 404

    # Triton's client: readiness, metadata, infer (by name and by alias).
    with triton.InferenceServerClient(host.url.removeprefix("http://")) as client:
        assert client.is_server_ready()
        assert all(client.is_model_ready(name) for name in MODELS)
        image_meta = client.get_model_metadata("image")
        assert image_meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 3, 224, 224]}]
        iris_meta = client.get_model_metadata("iris-v1")
        assert iris_meta["name"] == "iris"
        assert [output["name"] for output in iris_meta["outputs"]] == ["label", "probabilities"]
        pixels = triton.InferInput("input", [1, 3, 224, 224], "FP32")
        pixels.set_data_from_numpy(np.zeros((1, 3, 224, 224), np.float32), binary_data=True)
        logits = client.infer("image", [pixels]).as_numpy("logits")
        assert logits is not None and logits.shape == (1, 1000) and np.isfinite(logits).all()
        for name in ("iris", "iris-v1"):
            flower = triton.InferInput("input", [1, 4], "FP32")
            flower.set_data_from_numpy(np.array([SETOSA], np.float32))
            result = client.infer(name, [flower])
            assert result.as_numpy("label").tolist() == [0]
            assert result.get_response()["model_name"] == "iris"

    # KServe v1 on iris (name and alias), the image upload on the first model with /predict.
    for name in ("iris", "iris-v1"):
        reply = kserve(host, name)
        assert reply.status_code == 200, reply.text
        assert reply.json()["predictions"][0]["label"] == "setosa"
    with CAT_JPEG.open("rb") as image:
        upload = requests.post(host.url + "/predict", files={"image": ("cat.jpg", image, "image/jpeg")}, timeout=30)
    assert upload.status_code == 200, upload.text
    assert upload.json()["model"] == "image"
    assert upload.json()["predictions"][0][0]["label"] in CAT_LABELS

    # Both text models answer OpenAI's route; then one scrape holds every model's series.
    with openai_client(host) as client:
        for name in ("text-a", "text-b"):
            assert client.embeddings.create(model=name, input="hello world").model == name
    families = metric_models(host)
    assert set(MODELS) <= families["onnxpool_requests"], families.get("onnxpool_requests")
    assert set(MODELS) <= set().union(*families.values())


def test_openai_client_embeds_with_either_text_model_an_alias_or_gets_a_404(host: Host) -> None:
    with openai_client(host) as client:
        check_either_text_model(host, client)


def check_either_text_model(host: Host, client: openai.OpenAI) -> None:
    texts = ["hello world", "the cat sat on the mat"]
    a = client.embeddings.create(model="text-a", input=texts)
    b = client.embeddings.create(model="text-b", input=texts)
    assert (a.model, b.model) == ("text-a", "text-b")
    assert vectors(a).shape == vectors(b).shape == (2, 16)
    assert not np.allclose(vectors(a), vectors(b), atol=1e-3), "both names reached the same model"
    for alias in ("text-a-v1", "org/text-a"):  # a URL alias and a body-only one (a Hugging Face id)
        again = client.embeddings.create(model=alias, input=texts)
        assert again.model == "text-a"
        assert np.allclose(vectors(again), vectors(a), atol=1e-6)

    with pytest.raises(openai.NotFoundError) as caught:
        client.embeddings.create(model="gpt-4", input="hello")
    assert caught.value.status_code == 404
    error = caught.value.body
    assert isinstance(error, dict)
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", "model", "model_not_found")
    assert "gpt-4" in error["message"] and "text-a" in error["message"] and "text-b" in error["message"]
    no_model = requests.post(host.url + "/v1/embeddings", json={"input": "hello"}, timeout=10)
    assert no_model.status_code == 400 and no_model.json()["error"]["param"] == "model"


def test_each_worker_runs_on_its_models_cores_and_priority(host: Host) -> None:
    plans = host.plans()
    assert set(plans) == set(MODELS)
    assert (plans["image"].workers, plans["text-a"].workers) == (2, 1)
    check_every_worker(host)
    # The budgets (image 1.0, iris 0.25, text-a 0.5, text-b 0.25) are the models' kernel weights: a
    # cgroup's, or their workers' together (each 1024 / 1.25**nice).
    budgets = {"image": 1.0, "iris": 0.25, "text-a": 0.5, "text-b": 0.25}
    weights = {name: plan.weight for name, plan in plans.items()}
    for name, budget in budgets.items():
        assert weights[name] / weights["image"] == pytest.approx(budget, rel=0.15), weights


def test_a_killed_worker_comes_back_on_its_model(host: Host) -> None:
    plan = host.plans()["iris"]
    master = host.masters()["iris"]
    others = {name: host.workers(name) for name in MODELS if name != "iris"}
    before = host.workers("iris")
    victim = next(pid for pid, slot in before.items() if slot == 0)
    os.kill(victim, signal.SIGKILL)
    host.wait_for(
        "a new iris worker",
        lambda: len(after := host.workers("iris")) == plan.workers and victim not in after,
    )
    after = host.workers("iris")
    assert host.masters()["iris"] == master
    new = set(after) - set(before)
    assert len(new) == 1
    (pid,) = new
    assert after[pid] == 0, "the replacement takes the slot its predecessor left"
    check_worker(pid, after[pid], plan)
    for _ in range(4):
        reply = kserve(host, "iris")
        assert reply.status_code == 200 and reply.json()["predictions"][0]["label"] == "setosa"
    assert {name: host.workers(name) for name in others} == others


# --- SIGHUP ---------------------------------------------------------------------------------------


def test_hup_adds_and_removes_models_while_another_keeps_serving(tmp_path: Path) -> None:
    """keep + drop -> keep + added, while two clients loop on keep: no request fails, keep's workers
    are the same processes, drop is gone (404), added answers."""
    drop_model = build_tiny_model(tmp_path / "drop.onnx", bias=0.0)
    added_model = build_tiny_model(tmp_path / "added.onnx", bias=1.0)
    keep = iris_table("keep", two_workers(0.25))
    config = write_settings(tmp_path / "host.toml", keep, image_table("drop", drop_model, one_worker(1.0)))
    iris_row = np.array([SETOSA], np.float32)
    with running_host(tmp_path, config) as host:
        masters = host.masters()
        keep_workers = host.workers("keep")
        call = binary_infer("keep", iris_row, output_name="probabilities")
        load = LoadRunner(host.url, call, clients=2, max_seconds=60)
        load.start()
        try:
            load.wait_for(50)
            # With a cgroup per model, a neighbour's budget changes nothing of keep's; with nice values
            # the heaviest worker sets every nice value, so there added weighs what drop weighed.
            nice = host.plans()["keep"].cgroup is None
            write_settings(config, keep, image_table("added", added_model, one_worker(1.0 if nice else 0.5)))
            host.server.signal(signal.SIGHUP)
            host.wait_for("drop's pool to stop", lambda: masters["drop"] not in children_of(host.pid))
            host.wait_for("added to answer", lambda: infer_ok(host, "added"))
            load.wait_for(load.stats.ok + 50)
        finally:
            stats = load.stop()
        assert stats.failures == [], stats.failures[:5]
        assert stats.ok == stats.sent >= 100
        log = host.log()
        assert "reload: model added added" in log and "reload: model drop removed" in log
        assert "reload: model keep changed" not in log
        assert host.masters()["keep"] == masters["keep"]
        assert host.workers("keep") == keep_workers, "the looped model's workers were replaced"

        listed = model_list(host)
        assert list(listed) == ["keep", "added"] and all(m["state"] == "READY" for m in listed.values())
        assert requests.get(host.url + "/v2/models/drop/ready", timeout=10).status_code == 404
        gone = requests.post(host.url + "/v2/models/drop/infer", json={}, timeout=10)
        assert gone.status_code == 404, gone.text
        call = binary_infer("added", np.zeros((1, 3, 224, 224), np.float32))
        reply = requests.post(host.url + call.path, data=call.body, headers=call.headers, timeout=30)
        assert parse_binary_reply(reply, "logits").flat[0] == pytest.approx(1.0, abs=1e-5)  # zeros in: the bias
        host.wait_for("added's workers", lambda: len(host.workers("added")) == 1)
        check_every_worker(host)
        assert set(host.plans()) == {"keep", "added"} and set(host.masters()) == {"keep", "added"}


# --- missing model files, bad files, a dead pool ----------------------------------------------------


def test_a_missing_optional_model_is_one_line_and_unavailable(tmp_path: Path) -> None:
    """Budgets held by nice values here (the other tests' hosts use a cgroup when they may)."""
    ghost = tmp_path / "not-built" / "model.onnx"
    config = write_settings(
        tmp_path / "host.toml",
        iris_table("iris", two_workers(0.25)),
        image_table("tiny", build_tiny_model(tmp_path / "tiny.onnx", bias=0.0), one_worker(1.0)),
        text_table("ghost", ghost.parent, "optional = true\n"),
        server='budgets = "nice"',
    )
    with running_host(tmp_path, config) as host:
        lines = [line for line in host.log().splitlines() if "ghost" in line]
        assert len(lines) == 1, lines
        assert f"model ghost: {ghost} does not exist" in lines[0] and "optional = true" in lines[0]
        listed = model_list(host)
        assert {name: model["state"] for name, model in listed.items()} == {
            "iris": "READY",
            "tiny": "READY",
            "ghost": "UNAVAILABLE",
        }
        assert "does not exist" in str(listed["ghost"]["reason"])
        index = requests.post(host.url + "/v2/repository/index", timeout=10).json()
        assert [entry["state"] for entry in index] == ["READY", "READY", "UNAVAILABLE"]
        assert requests.get(host.url + "/v2/health/ready", timeout=10).status_code == 200
        assert requests.get(host.url + "/v2/models/ghost/ready", timeout=10).status_code != 200
        assert kserve(host, "iris").status_code == 200 and infer_ok(host, "tiny")
        plans = host.plans()
        assert set(plans) == {"iris", "tiny"} and plans["iris"].priority == "nice 9 per worker"
        assert plans["tiny"].priority == "nice 0 per worker"
        check_every_worker(host)


def test_a_missing_required_model_stops_the_host_in_one_line(tmp_path: Path) -> None:
    ghost = tmp_path / "not-built" / "model.onnx"
    config = write_settings(
        tmp_path / "host.toml", iris_table("iris", two_workers(0.25)), text_table("ghost", ghost.parent)
    )
    done = run_once(config)
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 1, done
    assert [line for line in lines if "error" in line.lower()] == lines[-1:], lines
    assert f"model ghost: {ghost} does not exist" in lines[-1]
    assert "Starting gunicorn" not in done.stderr


@pytest.mark.parametrize(
    ("tables", "message"),
    [
        (
            [iris_table("iris", 'aliases = ["flowers"]\n'), iris_table("iris2", 'aliases = ["flowers"]\n')],
            "[models.iris2]: the name 'flowers' is already iris's",
        ),
        ([iris_table("iris"), iris_table("bad name!")], "[models.bad name!]: a model name is"),
        ([f'[model]\npath = "{IRIS / "model.onnx"}"\n', iris_table("iris")], "[model] and [models.<name>] together"),
    ],
    ids=["duplicate-alias", "bad-name", "model-and-models"],
)
def test_a_bad_settings_file_is_one_line_and_exit_1(tmp_path: Path, tables: list[str], message: str) -> None:
    config = write_settings(tmp_path / "host.toml", *tables)
    done = run_once(config)
    assert done.returncode == 1, done
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("onnxpool: error: ") and message in lines[0], lines


def test_a_dead_pool_master_stops_the_host(tmp_path: Path) -> None:
    config = write_settings(
        tmp_path / "host.toml",
        iris_table("iris", one_worker(0.25)),
        image_table("tiny", build_tiny_model(tmp_path / "tiny.onnx", bias=0.0), one_worker(1.0)),
    )
    host = start_host(tmp_path, config)
    try:
        orphans = set(host.workers("tiny"))
        os.kill(host.masters()["tiny"], signal.SIGKILL)
        host.server.process.wait(60)
        assert host.server.process.returncode == 1
        assert "model tiny: its pool's master exited (status -9): stopping the host" in host.log()
        # nginx and iris's pool are stopped; tiny's workers outlive their master (gunicorn's notice it
        # after timeout / 2): in its cgroup the host finds and stops them too.
        left = set(group_members(host.pid))
        group = host.plans()["tiny"].cgroup
        assert left <= (orphans if group is None else set()), left
        if group is not None:
            assert not group[2].parent.exists(), "the host left its cgroups behind"
    finally:
        host.stop()


def test_a_flooded_model_sheds_its_own_excess_and_the_others_do_not(tmp_path: Path) -> None:
    """Shedding is per model: the slow model's queue (its own max_queue_ms, nginx stamps X-Request-Start)
    overflows into 503s while iris, looped on meanwhile, answers every request."""
    slow = build_slow_model(tmp_path / "slow.onnx")
    config = write_settings(
        tmp_path / "host.toml",
        f'[models.slow]\npath = "{slow}"\ntask = "tensors"\nwarmup_runs = 1\n{one_worker(1.0)}'
        "[models.slow.limits]\nmax_queue_ms = 100\n",
        iris_table("iris", one_worker(1.0)),
    )
    with running_host(tmp_path, config) as host:
        deadline = time.monotonic() + 3.0
        slow_statuses: list[int] = []
        iris_statuses: list[int] = []
        lock = threading.Lock()

        def flood() -> None:
            with requests.Session() as session:
                while time.monotonic() < deadline:
                    reply = session.post(host.url + "/v2/models/slow/infer", json=infer_body(50_000), timeout=30)
                    with lock:
                        slow_statuses.append(reply.status_code)

        threads = [threading.Thread(target=flood) for _ in range(12)]
        for thread in threads:
            thread.start()
        with requests.Session() as session:
            while time.monotonic() < deadline:
                iris_statuses.append(kserve_with(session, host).status_code)
        for thread in threads:
            thread.join(30)
    assert set(slow_statuses) == {200, 503} and slow_statuses.count(503) > 0, sorted(set(slow_statuses))
    assert iris_statuses and set(iris_statuses) == {200}, sorted(set(iris_statuses))


def kserve_with(session: requests.Session, host: Host) -> requests.Response:
    return session.post(f"{host.url}/v1/models/iris:predict", json={"instances": [SETOSA]}, timeout=30)


def test_the_host_tells_systemd_when_it_is_ready(tmp_path: Path) -> None:
    """`Type=notify`: the host (the unit's main process) says READY=1 once the front door is up, and
    RELOADING=1 then READY=1 around a HUP; its pools' masters never write to the socket."""
    config = write_settings(tmp_path / "host.toml", iris_table("iris", one_worker(0.25)))
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(str(path))
        listener.settimeout(60)
        with running_host(tmp_path, config, env_extra={"NOTIFY_SOCKET": str(path)}) as host:
            assert listener.recv(4096) == b"READY=1"
            assert kserve(host, "iris").status_code == 200
            host.server.process.send_signal(signal.SIGHUP)
            assert listener.recv(4096).startswith(b"RELOADING=1\nMONOTONIC_USEC=")
            assert listener.recv(4096) == b"READY=1"
            host.server.process.send_signal(signal.SIGTERM)
            assert listener.recv(4096) == b"STOPPING=1"
            host.server.process.wait(60)
            listener.settimeout(0.5)
            with pytest.raises(TimeoutError):
                listener.recv(4096)  # nothing from the pools' masters


# --- the shipped zoo ------------------------------------------------------------------------------


@pytest.mark.minilm
def test_the_shipped_zoo_serves_its_three_models(tmp_path: Path) -> None:
    if not MINILM.is_file():
        if os.environ.get("CI"):
            pytest.fail("models/minilm is not built: .ci/run runs `make minilm-check` before `make test`")
        pytest.skip("models/minilm not built (make minilm)")
    with running_host(tmp_path, REPO / "config" / "zoo.toml", cores=2) as host:  # its workers are "auto"
        assert {name: m["state"] for name, m in model_list(host).items()} == {
            "efficientnet-lite0": "READY",
            "iris": "READY",
            "all-minilm-l6-v2": "READY",
        }
        with openai_client(host) as client:
            reply = client.embeddings.create(model="sentence-transformers/all-MiniLM-L6-v2", input="hello")
        assert reply.model == "all-minilm-l6-v2" and len(reply.data[0].embedding) == 384
        assert kserve(host, "iris").json()["predictions"][0]["label"] == "setosa"
        check_every_worker(host)
