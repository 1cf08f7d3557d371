"""A several-models host for tests: settings files, the running host and what it printed, /proc, requests.

tests/test_host.py (every route, plans, reloads) and tests/test_host_faults.py (the fault table)
start real hosts (`onnxpool serve` on a `[models.<name>]` file: supervisord, gunicorn pools, nginx)
through these helpers.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from onnxpool.proxy import js_module
from onnxpool.workers.run_folder import default_base
from tests.deploy_harness import nginx_binary
from tests.harness import REPO, Server, children_of, clean_env, free_port, parse_cpu_list, proc_status, spawn_logged
from tests.tiny_models import build_tiny_model
from tests.v2client import LoadRunner, binary_infer

NGINX = nginx_binary()
HOST_TEST_MARKS = [
    pytest.mark.nginx,
    pytest.mark.slow,
    pytest.mark.skipif(NGINX is None, reason="nginx binary not installed (apt-get install nginx-light)"),
]
"""A module of host tests: `pytestmark = HOST_TEST_MARKS`."""

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
# The pool's socket is the first address; callers' lanes (`<name>.<k>.sock`, workers/lanes.py) may follow.
LISTENING = re.compile(r"Listening at: unix:\S+?/pools/(?P<name>[^/\s,]+)\.sock(?:,\S+)? \((?P<pid>\d+)\)")
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
    """A running `onnxpool serve` on a several-model file, in its own session (its supervisord and every
    program it runs stay in that session: supervisord makes process groups, not sessions)."""

    server: Server
    config: Path
    left: list[str] = field(default_factory=list)
    """What `stop` found left behind (`remains`)."""

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
        """Each model's live pool master (a child of the host's supervisord) by the socket gunicorn said
        it listens on; the last one of each model."""
        programs = set(children_of(self.supervisord()))
        found = {m["name"]: int(m["pid"]) for m in LISTENING.finditer(self.log())}
        return {name: pid for name, pid in found.items() if pid in programs}

    def run_folder(self) -> Path:
        """The host's run folder (the pools' sockets are in it), from the socket a pool said it listens on."""
        for line in self.log().splitlines():
            if "Listening at: unix:" in line and "/pools/" in line:
                return Path(line.split("unix:", 1)[1].split("/pools/", 1)[0])
        raise AssertionError("no pool socket in the log")

    def host_json(self) -> dict[str, dict[str, Any]]:
        """host.json's models, by name (what the host's routes and its gRPC router read)."""
        document = json.loads((self.run_folder() / "host.json").read_text(encoding="utf-8"))
        return {model["name"]: model for model in document["models"]}

    def supervisord(self) -> int:
        """The host's supervisord (its one lasting child; `nginx -t` runs beside it for a moment)."""
        found = []
        for pid in children_of(self.pid):
            with contextlib.suppress(OSError):
                if b"supervisor.supervisord" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(pid)
        if not found:
            raise KeyError("the host has not started its supervisord yet")
        assert len(found) == 1, f"the host runs several supervisords: {found}"
        return found[0]

    def program(self, name: str) -> int:
        """The pid of a program supervisord runs (`nginx`, `routes`, `grpc`, `model-<name>`), or of the host's
        janitor."""
        for pid in children_of(self.supervisord()):
            with contextlib.suppress(OSError):
                command = Path(f"/proc/{pid}/cmdline").read_bytes()
                title = command.decode(errors="replace")
                if name == "nginx" and title.startswith("nginx: master"):
                    return pid
                if name == "routes" and title.startswith("gunicorn: master") and "host routes" in title:
                    return pid
                if name == "grpc" and "onnxpool.host.grpc_router" in title:
                    return pid
        for pid in children_of(self.pid):  # the janitor is the host's own child, beside supervisord
            with contextlib.suppress(OSError):
                if name == "janitor" and b"janitor" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return pid
        if name.startswith("model-"):
            return self.masters()[name.removeprefix("model-")]
        raise KeyError(name)

    def remains(self) -> list[str]:
        """What is left of the host after it stopped: processes of its session, its run folder and the
        pools' (by the pids it printed), its cgroups (read from /proc and /sys)."""
        left = [f"process {pid}: {title}" for pid, title in session_members(self.pid).items()]
        base = default_base(self.server.env)
        pids = {self.pid, *(int(m["pid"]) for m in LISTENING.finditer(self.log()))}
        left += [f"folder {path}" for pid in pids for path in base.glob(f"onnxpool-{pid}-*")]
        folders = [plan.cgroup[2] for plan in self.plans(every=True).values() if plan.cgroup is not None]
        left += [f"cgroup {folder}" for folder in {*folders, *(folder.parent for folder in folders)} if folder.exists()]
        return left

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
                "onnxpool.host: front door:" in self.log()  # the host has finished starting
                and bool(plans)
                and set(masters) >= set(plans)
                and all(len(self.workers(name)) == plan.workers for name, plan in plans.items())
                and requests.get(self.url + "/v2/health/ready", timeout=5).status_code == 200
            )

        self.wait_for("every model ready", ready, timeout)

    def stop(self) -> int | None:
        """SIGTERM to the host alone (its supervisord stops nginx first, then the pools); what it left
        (`remains`) is kept in `self.left`, then killed: processes of its session, its cgroups."""
        if self.server.process.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.server.process.wait(60)
        status = self.server.process.returncode
        self.left = self.remains()
        for pid in session_members(self.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
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


def session_members(sid: int) -> dict[int, str]:
    """The live processes of session `sid` (pid -> command line), from /proc."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
                if int(fields[3]) == sid and fields[0] != "Z":
                    found[int(entry.name)] = (entry / "cmdline").read_text(errors="replace").replace("\0", " ")[:120]
    return found


def wait_gone(host: Host, seconds: float = 30.0) -> list[str]:
    """After the host exited by itself: until nothing of it is left (or `seconds`); what is left."""
    deadline = time.monotonic() + seconds
    while (left := host.remains()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def serve_argv(config: Path) -> list[str]:
    return [sys.executable, "-m", "onnxpool.cli", "serve", "--config", str(config)]


def spawn_host(
    folder: Path, config: Path, *, cores: int | None = None, env_extra: dict[str, str] | None = None
) -> Host:
    """`onnxpool serve` on `config` (bound to a free port), just started; `cores`: under taskset, on that many
    cores (a file whose models have "auto" workers then starts as many as on a machine of that size)."""
    port = free_port()
    env = clean_env({"ONNXPOOL_SERVER__BIND": f"127.0.0.1:{port}", "PYTHONUNBUFFERED": "1", **(env_extra or {})})
    log_path = folder / f"host-{port}.log"
    argv = serve_argv(config)
    if cores is not None and shutil.which("taskset"):
        argv = ["taskset", "-c", ",".join(map(str, sorted(os.sched_getaffinity(0))[:cores])), *argv]
    process = spawn_logged(argv, log_path, env)
    return Host(Server(process=process, port=port, log_path=log_path, env=env, bind=f"127.0.0.1:{port}"), config)


def start_host(
    folder: Path, config: Path, *, cores: int | None = None, env_extra: dict[str, str] | None = None
) -> Host:
    """`spawn_host`, until every model is ready."""
    host = spawn_host(folder, config, cores=cores, env_extra=env_extra)
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
    assert host.left == [], f"the host left behind: {host.left}"


def run_once(
    config: Path, timeout: float = 60.0, env_extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`onnxpool serve` expected to refuse: its exit status and everything it printed."""
    env = clean_env({"ONNXPOOL_SERVER__BIND": f"127.0.0.1:{free_port()}", **(env_extra or {})})
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
    programs = set(children_of(host.supervisord()))
    for name, plan in plans.items():
        assert masters[name] in programs, f"model {name}: its master is not a program of the host's supervisord"
        workers = host.workers(name)
        assert sorted(children_of(masters[name])) == sorted(workers), f"model {name}: a worker never said ready"
        assert sorted(workers.values()) == list(range(plan.workers)), (name, workers)
        for pid, slot in workers.items():
            check_worker(pid, slot, plan)


# --- requests -------------------------------------------------------------------------------------


def loop_on(host: Host, model: str, clients: int = 2, seconds: float = 120.0) -> LoadRunner:
    """A closed loop of v2 binary infers on `model` (iris, else an image model such as tiny) through the
    front door, started and past its first 20 answers; keep-alive resends counted (retry_stale)."""
    if model.startswith("iris"):
        call = binary_infer(model, np.array([SETOSA], np.float32), output_name="probabilities")
    else:
        call = binary_infer(model, np.zeros((1, 3, 224, 224), np.float32))
    loop = LoadRunner(host.url, call, clients=clients, max_seconds=seconds, max_requests=1_000_000, retry_stale=True)
    loop.start()
    loop.wait_for(20)
    return loop


def states(host: Host) -> dict[str, str]:
    """Each model's state, as the host's /v2/models says it."""
    return {name: str(model["state"]) for name, model in model_list(host).items()}


def two_models(folder: Path, server: str = "") -> Path:
    """iris (the looped model) and tiny (the victim): one worker each."""
    return write_settings(
        folder / "host.toml",
        iris_table("iris", one_worker(0.5)),
        image_table("tiny", build_tiny_model(folder / "tiny.onnx", bias=0.0), one_worker(0.5)),
        server=server,
    )


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
