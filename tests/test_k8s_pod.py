"""The pod contract: the rendered `shared` Deployment's two containers (nginx in front of
onnxpool, one image) with their own commands, args and env, run under the pod's conditions
emulated on this machine (as root, which CI is):

- the manifest's numeric uid/gid (`setpriv --reuid --regid --clear-groups`, no new privileges);
- a read-only root filesystem per container, writable ONLY at the manifest's emptyDir paths
  (a private mount namespace each, `unshare -m`: every mount remounted read-only); an emptyDir
  both containers mount is one folder made here, bind-mounted into both (gunicorn's unix
  socket and nginx's pid file live there, as in the pod);
- each container's CPU quota (`limits.cpu`) in a cgroup made here (v1 `cpu.cfs_quota_us`, or
  v2 `cpu.max`), with the affinity mask (all of this machine's cores) wider than the quota.

Checked: ready within the startup probe's budget, every probe of both containers (the exec
probes run as the manifest says, over the socket), /metrics, /docs and a classification through
nginx, the unpinned quota-sized layout line; then, on the same pod, slow clients (1 byte/s)
and an overload of 64 connections straight at nginx's port with probes watched throughout;
and, with a slow model, SIGTERM to both containers at once during requests: nothing lost.

What stands in for the image (checked for real by deploy/container/ci_image.py): the
commands' venv (/opt/onnxpool in the image) is this checkout's .venv; the ConfigMap's
onnxpool.toml is written to a temp folder and bind-mounted read-only at the manifest's
mount path; the model paths (/models in the image) point at this checkout's demo model;
nginx listens on a free loopback port instead of 8000 (there is no pod network namespace
here and other runs share this host). A mount point missing on the host (e.g. /run/onnxpool)
is created as an empty folder and left there: another run may be using it as a mount point
in its own namespace.

Needs root, kubectl, nginx, unshare, setpriv and a writable cgroup CPU controller: without
them it fails when CI=true and skips elsewhere. Timing: the load phases are a few seconds
each; the only latency bound checked is relative to service times measured in the same run.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient

from tests import pod_load
from tests.deploy_harness import nginx_binary
from tests.harness import DEMO_MODEL, MODEL_NAME, REPO, Server, free_port, spawn_logged
from tests.k8s_render import OVERLAYS, in_ci, need_tool, render
from tests.slow_model import build_slow_model, infer_body, server_settings

pytestmark = [pytest.mark.slow, pytest.mark.pod]

OVERLAY = "shared"
APP, PROXY = "onnxpool", "nginx"
CAT = REPO / "models" / "samples" / "chelsea-cat.jpg"
CGROUP = Path("/sys/fs/cgroup")
# Kernel filesystems a pod has as well (the runtime mounts them); everything else goes read-only.
KERNEL_MOUNTS = ("/proc", "/sys", "/dev")
HOST = "127.0.0.1"


def unavailable(reason: str) -> None:
    if in_ci():
        pytest.fail(f"pod contract test cannot run: {reason}")
    pytest.skip(reason)


def cpu_quantity(q: str) -> float:
    return int(q[:-1]) / 1000 if q.endswith("m") else float(q)


def memory_quantity(q: str) -> str:
    """An emptyDir sizeLimit as a tmpfs size= value (Mi -> m, Gi -> g)."""
    for suffix, unit in (("Ki", "k"), ("Mi", "m"), ("Gi", "g")):
        if q.endswith(suffix):
            return q[: -len(suffix)] + unit
    return q


@dataclass
class Container:
    """What the rendered Deployment says about one of its containers."""

    name: str
    argv: list[str]
    env: dict[str, str]
    empty_dirs: dict[str, str]  # mount path -> volume name
    config_maps: dict[str, dict[str, str]]  # mount path -> file name -> text
    cpu_limit: float
    probes: dict[str, dict[str, Any]]
    ports: dict[str, int] = field(default_factory=dict)


@dataclass
class Pod:
    """What the rendered Deployment says about its pod."""

    containers: dict[str, Container]
    uid: int
    gid: int
    startup_budget: float
    grace: float
    image_venv: Path
    settings: dict[str, Any]

    @property
    def app(self) -> Container:
        return self.containers[APP]

    @property
    def max_queue_ms(self) -> int:
        return int(self.settings.get("limits", {}).get("max_queue_ms", 0))


def rendered_pod() -> Pod:
    import tomllib

    docs = render(OVERLAYS / OVERLAY)
    dep = next(d for d in docs if d["kind"] == "Deployment")
    spec = dep["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    configmaps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    containers: dict[str, Container] = {}
    ids: set[tuple[int, int]] = set()
    for c in spec["containers"]:
        sc = {**spec.get("securityContext", {}), **c.get("securityContext", {})}
        assert sc.get("readOnlyRootFilesystem") and sc.get("runAsNonRoot"), f"{c['name']}: non-root, read-only root"
        ids.add((int(sc["runAsUser"]), int(sc.get("runAsGroup", sc["runAsUser"]))))
        empty_dirs, config_maps = {}, {}
        for m in c["volumeMounts"]:
            vol = volumes[m["name"]]
            if "emptyDir" in vol:
                empty_dirs[m["mountPath"]] = m["name"]
            elif "configMap" in vol:
                config_maps[m["mountPath"]] = dict(configmaps[vol["configMap"]["name"]]["data"])
            else:
                raise AssertionError(f"volume {m['name']}: only emptyDir and configMap are emulated")
        containers[c["name"]] = Container(
            name=c["name"],
            argv=[*c["command"], *c.get("args", [])],
            env={e["name"]: env_value(e, dep) for e in c.get("env", [])},
            empty_dirs=empty_dirs,
            config_maps=config_maps,
            cpu_limit=cpu_quantity(str(c["resources"]["limits"]["cpu"])),
            probes={k: c[k] for k in ("startupProbe", "readinessProbe", "livenessProbe") if k in c},
            ports={p["name"]: int(p["containerPort"]) for p in c.get("ports", [])},
        )
    assert len(ids) == 1, f"both containers run as the same uid/gid: {ids}"
    ((uid, gid),) = ids
    probe = containers[APP].probes["startupProbe"]
    settings_text = next(iter(containers[APP].config_maps.values()))["onnxpool.toml"]
    return Pod(
        containers=containers,
        uid=uid,
        gid=gid,
        startup_budget=probe.get("initialDelaySeconds", 0) + probe["periodSeconds"] * probe["failureThreshold"],
        grace=float(spec["terminationGracePeriodSeconds"]),
        image_venv=Path(containers[APP].argv[0]).parent.parent,
        settings=tomllib.loads(settings_text),
    )


class CpuQuota:
    """A cgroup made here with `limit` CPUs of CFS quota (v1 cpu controller, else v2 cpu.max)."""

    def __init__(self, limit: float) -> None:
        period = 100_000
        quota = round(limit * period)
        name = f"onnxpool-pod-test-{os.getpid()}-{time.monotonic_ns()}"
        v1 = next((CGROUP / n for n in ("cpu,cpuacct", "cpu") if (CGROUP / n / "cpu.cfs_quota_us").exists()), None)
        if v1 is not None:
            self.path = v1 / name
            self.path.mkdir()
            (self.path / "cpu.cfs_period_us").write_text(f"{period}\n")
            (self.path / "cpu.cfs_quota_us").write_text(f"{quota}\n")
            self.version = "v1"
        elif "cpu" in (CGROUP / "cgroup.controllers").read_text().split():
            with contextlib.suppress(OSError):  # enabled already on most hosts
                (CGROUP / "cgroup.subtree_control").write_text("+cpu\n")
            self.path = CGROUP / name
            self.path.mkdir()
            (self.path / "cpu.max").write_text(f"{quota} {period}\n")
            self.version = "v2"
        else:
            raise OSError("no cgroup CPU controller")

    def remove(self) -> None:
        """Remove the cgroup; its processes must be gone (the kernel refuses otherwise)."""
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)
        self.path.rmdir()


def env_value(entry: dict[str, Any], dep: dict[str, Any]) -> str:
    """A container's env entry: its `value`, or the pod field its `valueFrom.fieldRef` names, as the
    kubelet fills it (the downward API's `metadata.name` and `metadata.namespace`)."""
    if "value" in entry:
        return str(entry["value"])
    field = entry["valueFrom"]["fieldRef"]["fieldPath"]
    metadata = dep["metadata"]
    fields = {"metadata.name": f"{metadata['name']}-0", "metadata.namespace": str(metadata.get("namespace", "default"))}
    assert field in fields, f"env {entry['name']}: only {sorted(fields)} of the downward API are emulated"
    return fields[field]


def hidden_behind(path: Path) -> Path | None:
    """The topmost ancestor of `path` other users cannot enter (e.g. /root, 0700), if any."""
    for ancestor in reversed(path.parents):
        if not os.stat(ancestor).st_mode & 0o001:
            return ancestor
    return None


def expose_lines(paths: list[Path], staging: Path) -> list[str]:
    """Make `paths` reachable for the pod's uid although an ancestor is private to root.

    This machine's Python (pyenv under /root, 0700) stands in for the image's
    /usr/bin/python3: the private ancestor is covered with an empty tmpfs (mode 755)
    holding only the needed folders, bind-mounted from the real ones.
    """
    hidden = [(path, blocker) for path in paths if (blocker := hidden_behind(path)) is not None]
    stages = [staging / f"expose-{index}" for index in range(len(hidden))]
    # A path that is itself private (a checkout cloned into `mktemp -d`, 0700) is covered the same
    # way, holding a bind of each of its entries: a bind of the folder itself would keep its mode.
    private = [path for path in paths if not os.stat(path).st_mode & 0o001]
    private_stages = [staging / f"private-{index}" for index in range(len(private))]
    q = shlex.quote
    # All sources are bound aside first: a tmpfs over /root hides every path under it.
    lines = [
        f"mkdir -p {stage} && mount --bind {q(str(path))} {stage}"
        for path, stage in zip([p for p, _ in hidden] + private, stages + private_stages, strict=True)
    ]
    lines += [f"mount -t tmpfs -o mode=755,size=1m exposed {q(str(b))}" for b in sorted({b for _, b in hidden})]
    lines += [
        f"mkdir -p {q(str(path))} && mount --move {stage} {q(str(path))}"
        for (path, _), stage in zip(hidden, stages, strict=True)
    ]
    for path, stage in zip(private, private_stages, strict=True):
        lines.append(f"mount -t tmpfs -o mode=755,size=1m exposed {q(str(path))}")
        for entry in sorted(path.iterdir()):
            make = "mkdir -p" if entry.is_dir() else "touch"
            lines.append(f"{make} {q(str(entry))} && mount --bind {stage}/{q(entry.name)} {q(str(entry))}")
    return lines


def mount_script(
    c: Container, shared: dict[str, Path], config_dirs: dict[str, Path], workdir: str, staging: Path
) -> str:
    """Shell run as root in the container's new mount namespace; it ends by exec'ing its command."""
    lines = ["set -eu", "mount --make-rprivate /"]
    lines += expose_lines([Path(sys.base_prefix), REPO], staging)
    for path, volume in c.empty_dirs.items():
        # The pod's emptyDir: one folder for every container that mounts it.
        lines.append(f"mkdir -p {shlex.quote(path)}")
        lines.append(f"mount --bind {shlex.quote(str(shared[volume]))} {shlex.quote(path)}")
    for path, source in config_dirs.items():
        lines.append(f"mkdir -p {shlex.quote(path)}")
        lines.append(f"mount --bind {shlex.quote(str(source))} {shlex.quote(path)}")
        lines.append(f"mount -o remount,bind,ro {shlex.quote(path)}")
    # Every other mount read-only (the root first, then submounts), except the kernel's own
    # filesystems a pod has too and the writable paths made above.
    keep = [*c.empty_dirs, *KERNEL_MOUNTS]
    keep_pattern = "|".join(f"{p}|{p}/*" for p in keep)
    lines.append(
        "findmnt -rn -o TARGET | while read -r target; do "
        f'case "$target" in {keep_pattern}) continue;; esac; '
        'mount -o remount,bind,ro "$target" 2>/dev/null || true; done'
    )
    # The root must be read-only, or the test proves nothing.
    lines.append(
        "if touch /.onnxpool-rw-check 2>/dev/null; then "
        'rm -f /.onnxpool-rw-check; echo "root still writable" >&2; exit 97; fi'
    )
    lines.append(f"cd {shlex.quote(workdir)}")
    return "\n".join(lines)


@dataclass
class PodRun:
    server: Server  # the onnxpool container's process (gunicorn's master), reached through nginx
    nginx: subprocess.Popen[bytes]  # the nginx container's process (`onnxpool nginx`)
    nginx_log: Path
    port: int  # nginx's: the pod's port
    grpc_port: int  # nginx's gRPC listener: the pod's port grpc
    shared: dict[str, Path]  # emptyDir volume -> the folder standing in for it
    quotas: dict[str, CpuQuota]
    ready_after: float
    pod: Pod

    def socket_address(self) -> str:
        """gunicorn's bind (unix:/run/onnxpool/...) as reachable from here, through the emptyDir's folder."""
        bind = self.pod.app.env["ONNXPOOL_SERVER__BIND"]
        path = Path(bind[len("unix:") :])
        for mount, volume in self.pod.app.empty_dirs.items():
            if path.is_relative_to(mount):
                return f"unix:{self.shared[volume] / path.relative_to(mount)}"
        raise AssertionError(f"{bind} is not on an emptyDir")

    def exec_probe(self, kind: str) -> tuple[bool, str]:
        """The onnxpool container's exec probe as the manifest writes it (its python, module, path)."""
        command = self.pod.app.probes[kind]["exec"]["command"]
        venv = Path(sys.prefix)
        argv = [str(venv / Path(command[0]).relative_to(self.pod.image_venv)), *command[1:]]
        argv = [self.socket_address() if a == self.pod.app.env["ONNXPOOL_SERVER__BIND"] else a for a in argv]
        timeout = float(self.pod.app.probes[kind].get("timeoutSeconds", 1))
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return False, f"exec {kind}: no answer within {timeout:g} s"
        return done.returncode == 0, f"exec {kind}: exit {done.returncode} {done.stderr.strip()}"


def container_command(pod: Pod, c: Container, env: dict[str, str], script: str, quota: CpuQuota) -> list[str]:
    venv = Path(sys.prefix)  # this checkout's .venv (the test runs in it)
    argv = [
        str(venv / Path(a).relative_to(pod.image_venv)) if a.startswith(f"{pod.image_venv}/") else a for a in c.argv
    ]
    user = ["setpriv", f"--reuid={pod.uid}", f"--regid={pod.gid}", "--clear-groups", "--no-new-privs"]
    script += "\nexec " + " ".join(map(shlex.quote, user)) + ' -- env -i "$@"'
    join = f'echo $$ > {shlex.quote(str(quota.path / "cgroup.procs"))} && exec "$@"'
    command = ["sh", "-c", join, "sh", "unshare", "-m", "--propagation", "private", "sh", "-c", script, c.name]
    return command + [f"{k}={v}" for k, v in env.items()] + argv


def image_env(venv: Path) -> dict[str, str]:
    """What the image's ENV gives every container that the manifest does not set (see the Dockerfile)."""
    return {
        "PATH": f"{venv}/bin:/usr/local/bin:/usr/bin:/bin",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        "ORT_DISABLE_TELEMETRY": "1",
    }


def wait_ready(server: Server, nginx: subprocess.Popen[bytes], workers: int, budget: float) -> None:
    """Ready through nginx (both containers up, workers warm) within the startup budget; fail fast if one died."""
    deadline = time.monotonic() + budget
    while time.monotonic() < deadline:
        if nginx.poll() is not None:
            raise RuntimeError(f"the nginx container exited with {nginx.returncode}")
        with contextlib.suppress(TimeoutError):
            server.wait_ready(workers, timeout=1.0)
            return
    raise TimeoutError(f"not ready through nginx after {budget:g} s:\n{server.log()[-3000:]}")


@contextlib.contextmanager
def run_pod(pod: Pod, share: Path, extra_env: dict[str, str] | None = None) -> Iterator[PodRun]:
    """Start both containers under the emulated conditions; stop them and remove their cgroups after."""
    for tool in ("unshare", "nsenter", "setpriv", "findmnt", "mount"):
        need_tool(tool)
    if os.geteuid() != 0:
        unavailable("needs root (setpriv to the pod's uid, mount namespaces, cgroups)")
    if nginx_binary() is None:
        unavailable("needs nginx (apt-get install nginx-light)")
    affinity = len(os.sched_getaffinity(0))
    if affinity <= pod.app.cpu_limit:
        unavailable(
            f"needs an affinity mask wider than limits.cpu {pod.app.cpu_limit:g}; this machine has {affinity} cores"
        )
    quotas: dict[str, CpuQuota] = {}
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for c in pod.containers.values():
            try:
                quotas[c.name] = CpuQuota(c.cpu_limit)
            except OSError as exc:
                unavailable(f"cannot make a cgroup with a CPU quota: {exc}")
        share = Path(tempfile.mkdtemp(prefix="run-", dir=share))  # one per start
        share.chmod(0o755)
        volumes = {v for c in pod.containers.values() for v in c.empty_dirs.values()}
        shared = {v: share / f"emptydir-{v}" for v in volumes}
        for folder in shared.values():
            folder.mkdir()
            os.chown(folder, pod.uid, pod.gid)  # an emptyDir is the pod's (fsGroup)
        port = free_port()
        # The pod's gRPC (the Service's port grpc, and the workers' loopback address behind nginx) on free
        # loopback ports too: the manifest's fixed ones would collide with other runs on this host.
        grpc_port, grpc_bind = free_port(), f"{HOST}:{free_port()}"
        venv = Path(sys.prefix)
        logs: dict[str, Path] = {}
        envs: dict[str, dict[str, str]] = {}
        for index, c in enumerate(pod.containers.values()):
            config_dirs: dict[str, Path] = {}
            for path, files in c.config_maps.items():
                folder = share / f"configmap-{c.name}-{index}"
                folder.mkdir(mode=0o755)
                for name, text in files.items():
                    (folder / name).write_text(text, encoding="utf-8")
                    (folder / name).chmod(0o644)
                config_dirs[path] = folder
            env = {**image_env(venv), **c.env, "ONNXPOOL_SERVER__GRPC_BIND": grpc_bind}
            if c.name == APP:
                # /models is the image's: here the checkout's demo model (its labels.txt found beside it).
                env["ONNXPOOL_MODEL__PATH"] = str(DEMO_MODEL)
                env.update(extra_env or {})
            else:
                # The pod's port, on a free loopback port (no pod network namespace here).
                env["ONNXPOOL_NGINX__LISTEN"] = f"{HOST}:{port}"
                env["ONNXPOOL_NGINX__GRPC_LISTEN"] = f"{HOST}:{grpc_port}"
            envs[c.name] = env
            workdir = env.get("ONNXPOOL_SERVER__RUN_DIR", next(iter(c.empty_dirs)))
            script = mount_script(c, shared, config_dirs, workdir, share)
            logs[c.name] = share / f"{c.name}-{port}.log"
            command = container_command(pod, c, env, script, quotas[c.name])
            processes.append(
                spawn_logged(command, logs[c.name], {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, cwd=share)
            )
        app_process, nginx_process = processes[0], processes[1]
        server = Server(process=app_process, port=port, log_path=logs[APP], env=envs[APP])
        t0 = time.monotonic()
        try:
            try:
                wait_ready(server, nginx_process, max(1, math.floor(pod.app.cpu_limit)), pod.startup_budget)
            except (RuntimeError, TimeoutError) as exc:
                raise AssertionError(
                    f"{exc}\n--- nginx log:\n{logs[PROXY].read_text(errors='replace')[-3000:]}"
                ) from None
            yield PodRun(
                server=server,
                nginx=nginx_process,
                nginx_log=logs[PROXY],
                port=port,
                grpc_port=grpc_port,
                shared=shared,
                quotas=quotas,
                ready_after=time.monotonic() - t0,
                pod=pod,
            )
        finally:
            # Both at once, as the kubelet does; each its own process group only.
            for process in processes:
                if process.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(process.pid, signal.SIGTERM)
            for process in processes:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(pod.grace)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(5)
    finally:
        for quota in quotas.values():
            quota.remove()


@pytest.fixture(scope="module")
def pod() -> Pod:
    return rendered_pod()


@pytest.fixture(scope="module")
def share() -> Iterator[Path]:
    """A folder the pod's uid can read (pytest's tmp_path is root-only)."""
    folder = Path(tempfile.mkdtemp(prefix="onnxpool-pod-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def demo_pod(pod: Pod, share: Path) -> Iterator[PodRun]:
    """One pod with the demo model for the serving, slow-client and overload tests (a start costs seconds)."""
    with run_pod(pod, share) as run:
        yield run


def layout_line(log: str) -> str:
    return next((line for line in log.splitlines() if "cpu: " in line), "")


def show(capsys: pytest.CaptureFixture[str], text: str) -> None:
    """Into the test log even when pytest captures output (`make test`): CI's record of the numbers."""
    with capsys.disabled():
        print(text, flush=True)


def predict_request() -> pod_load.Request:
    body, ctype = pod_load.multipart("image", CAT.name, CAT.read_bytes(), "image/jpeg")
    # no-store: every request is computed (the response cache would answer repeats in 0.3 ms).
    return ("POST", "/predict", body, {"Content-Type": ctype, "Cache-Control": "no-store"})


def probes(run: PodRun) -> list[pod_load.Check]:
    """Every probe of the pod as the kubelet runs it: nginx's httpGet ones and gunicorn's exec liveness."""
    checks: list[pod_load.Check] = []
    for probe in run.pod.containers[PROXY].probes.values():
        get = probe["httpGet"]
        checks.append(pod_load.http_check(HOST, run.port, get["path"], float(probe.get("timeoutSeconds", 1))))
    checks.append(lambda: run.exec_probe("livenessProbe"))
    return checks


def watch_all(run: PodRun, period: float = 1.0) -> list[pod_load.Watch]:
    return [pod_load.Watch(check, period) for check in probes(run)]


def test_pod_serves_under_its_own_conditions(demo_pod: PodRun, pod: Pod, capsys: pytest.CaptureFixture[str]) -> None:
    run = demo_pod
    server = run.server
    show(
        capsys,
        f"\npod contract ({OVERLAY}, limits.cpu {pod.app.cpu_limit:g} + nginx {pod.containers[PROXY].cpu_limit:g}, "
        f"uid {pod.uid}): ready through nginx after {run.ready_after:.1f} s (startup budget {pod.startup_budget:g} s)",
    )
    assert run.ready_after < pod.startup_budget
    for check in probes(run):
        ok, detail = check()
        assert ok, detail
    ok, detail = run.exec_probe("startupProbe")
    assert ok, detail
    metrics = requests.get(server.url + "/metrics", timeout=10)
    assert metrics.status_code == 200 and "# TYPE" in metrics.text
    for path in ("/docs", "/docs/swagger-ui-bundle.js", "/openapi.json"):  # the API page, in the pod
        assert requests.get(server.url + path, timeout=10).status_code == 200, path
    with CAT.open("rb") as photo:
        answer = requests.post(server.url + "/predict", files={"image": photo}, timeout=30)
    assert answer.status_code == 200, answer.text
    assert "cat" in answer.text.lower(), answer.text[:300]
    assert answer.headers["Server"] == "nginx" and answer.headers.get("X-Request-ID")
    assert "queue;dur=" in answer.headers["Server-Timing"]  # X-Request-Start from nginx: shedding can judge
    # gRPC through the pod's nginx (the Service's port grpc): tritonclient.grpc unchanged.
    client = grpcclient.InferenceServerClient(f"{HOST}:{run.grpc_port}")
    assert client.is_server_ready()
    tensor = grpcclient.InferInput("input", [1, 3, 224, 224], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 3, 224, 224), np.float32))
    logits = client.infer(MODEL_NAME, [tensor]).as_numpy("logits")
    assert logits is not None and logits.shape == (1, 1000)

    log = server.log()
    line = layout_line(log)
    show(capsys, f"pod contract layout line: {line}")
    expected_workers = max(1, math.floor(pod.app.cpu_limit))
    assert f"cpu: unpinned (affinity {len(os.sched_getaffinity(0))} cores > quota {pod.app.cpu_limit:g})" in line
    assert f"-> {expected_workers} workers x 1 threads" in line
    for name, pid in ((APP, server.pid), (PROXY, run.nginx.pid)):
        uids = next(ln for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ln.startswith("Uid:"))
        assert uids.split()[1:] == [str(pod.uid)] * 4, (name, uids)  # real, effective, saved, fs: the pod's uid
        assert run.quotas[name].path.name in Path(f"/proc/{pid}/cgroup").read_text(), name
    nginx_master = [p for p in Path(f"/proc/{run.nginx.pid}/task/{run.nginx.pid}/children").read_text().split()]
    assert len(nginx_master) == 1, nginx_master  # `onnxpool nginx` -> nginx's master
    workers = server.workers()
    assert len(workers) == expected_workers
    for pid in workers:  # not pinned: each worker keeps the whole mask
        assert os.sched_getaffinity(pid) == os.sched_getaffinity(0)
    nginx_log = run.nginx_log.read_text(errors="replace")
    for text in (log, nginx_log):
        assert "Read-only file system" not in text and "Permission denied" not in text, text[-3000:]
    # Nothing of onnxruntime's telemetry in $HOME (an emptyDir): no .cache/Microsoft.
    assert not any(p.name == "Microsoft" for folder in run.shared.values() for p in folder.rglob("*"))
    # The emulation holds: as the pod's uid, in each container's mounts, only the emptyDirs are writable.
    for name, pid in ((APP, server.pid), (PROXY, run.nginx.pid)):
        c = pod.containers[name]
        for path, writable in [*((p, True) for p in c.empty_dirs), ("/tmp", False), (str(REPO), False)]:
            probe = subprocess.run(
                ["nsenter", f"--target={pid}", "--mount", "--", "setpriv", f"--reuid={pod.uid}",
                 f"--regid={pod.gid}", "--clear-groups", "touch", f"{path}/.pod-write-probe"],
                capture_output=True, text=True, check=False, timeout=30,
            )  # fmt: skip
            assert (probe.returncode == 0) == writable, (name, path, probe.stderr)


def test_slow_clients_do_not_take_the_pod_down(demo_pod: PodRun, capsys: pytest.CaptureFixture[str]) -> None:
    """4 clients sending a /predict body at 1 byte/s: every normal request and every probe still answered."""
    run = demo_pod
    request = predict_request()
    slow = pod_load.SlowClients(HOST, run.port, request, count=4).start()
    watches = watch_all(run)
    try:
        with contextlib.ExitStack() as stack:
            for watch in watches:
                stack.enter_context(watch)
            time.sleep(2.0)  # the slow clients are connected and trickling
            # 2 connections on the pod's 1 worker: each waits at most one service time, far
            # under max_queue_ms even on a loaded box, so a 503 here would be a real failure.
            outcomes = pod_load.closed_loop(HOST, run.port, request, connections=2, seconds=8.0)
    finally:
        slow.finish()
    ok = [o for o in outcomes if o.status == 200]
    share = len(ok) / max(1, len(outcomes))
    probe_results = [r for w in watches for r in w.results]
    failures = [r for w in watches for r in w.failures]
    show(
        capsys,
        f"\npod slow clients: 4 at 1 byte/s (sent {slow.bytes_sent} bytes, cut: {len(slow.cut)}); "
        f"normal /predict at 2 connections: {len(ok)}/{len(outcomes)} HTTP 200 ({share:.1%}), "
        f"p99 {pod_load.percentile([o.seconds for o in ok], 0.99) * 1000:.0f} ms; "
        f"probes {len(probe_results) - len(failures)}/{len(probe_results)} passed; "
        f"not 200: {[(o.status, round(o.seconds, 3), o.error) for o in outcomes if o.status != 200][:3]}",
    )
    assert len(outcomes) >= 20, outcomes[:5]
    assert share >= 0.99, [o for o in outcomes if o.status != 200][:5]
    assert not failures, failures[:5]
    assert min(slow.bytes_sent) >= 5 and not slow.cut, (slow.bytes_sent, slow.cut)  # they were really there


def test_overload_is_shed_and_probes_stay_green(demo_pod: PodRun, capsys: pytest.CaptureFixture[str]) -> None:
    """64 connections straight at the pod's port: 503 + Retry-After past max_queue_ms, latency bounded."""
    run = demo_pod
    request = predict_request()
    max_queue = run.pod.max_queue_ms / 1000
    assert max_queue > 0, "the pod's settings must turn shedding on"
    # Service time on this box, now: one request at a time.
    single = [pod_load.send(HOST, run.port, request) for _ in range(15)]
    assert all(o.status == 200 for o in single), single[:3]
    service = pod_load.percentile([o.seconds for o in single], 0.5)
    watches = watch_all(run)
    with contextlib.ExitStack() as stack:
        for watch in watches:
            stack.enter_context(watch)
        outcomes = pod_load.closed_loop(HOST, run.port, request, connections=64, seconds=8.0)
    v = pod_load.overload(outcomes, watches, max_queue, service)
    served, shed, other, failures, p99, bound = v.served, v.shed, v.other, v.failures, v.p99, v.bound
    show(
        capsys,
        f"\npod overload: 64 connections for 8 s, max_queue_ms {run.pod.max_queue_ms}, service p50 "
        f"{service * 1000:.0f} ms: {len(served)} served (p50 {pod_load.percentile(served, 0.5) * 1000:.0f} ms, "
        f"p99 {p99 * 1000:.0f} ms, bound {bound * 1000:.0f} ms), {len(shed)} shed (503), {len(other)} other; "
        f"probe failures {len(failures)}",
    )
    assert not other, other[:5]
    assert shed and all(o.retry_after == "1" for o in shed), shed[:3]
    assert len(served) >= 20
    assert p99 <= bound, f"served p99 {p99:.3f} s > {bound:.3f} s"
    assert not failures, failures[:5]


def test_sigterm_to_both_containers_loses_nothing(pod: Pod, share: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """SIGTERM to nginx and gunicorn at once (the kubelet, after preStop) during requests: 0 lost.

    In flight at the signal: a ~4 s inference, a body still arriving (trickled over ~3 s, so
    nginx has not passed it on yet) and the current requests of 4 closed-loop clients (which
    start no new ones from then on, as after the preStop sleep the Service sends none). Each
    must get its 200, and both containers exit 0 within the grace period.
    """
    model = build_slow_model(share / "slow" / "slow.onnx")
    model.parent.chmod(0o755)
    model.chmod(0o644)
    # Shedding off here: behind a 4 s inference on the pod's one worker, every other request
    # waits past max_queue_ms and is rightly shed (503), which is not what this test is about.
    settings = {**server_settings(model), "ONNXPOOL_LIMITS__MAX_QUEUE_MS": "0"}
    with run_pod(pod, share, settings) as run:
        server = run.server
        path = "/v2/models/slow/infer"
        json_type = {"Content-Type": "application/json"}

        def infer(iterations: int) -> pod_load.Request:
            return ("POST", path, json.dumps(infer_body(iterations)).encode(), json_type)

        # Calibrate: iterations for a request of about 4 s on this quota (well inside graceful_timeout).
        t0 = time.monotonic()
        assert pod_load.send(HOST, run.port, infer(200_000), timeout=60).status == 200
        per_iteration = max(1e-8, (time.monotonic() - t0) / 200_000)
        long_request = infer(int(4.0 / per_iteration))
        results: dict[str, pod_load.Outcome] = {}

        def long_one() -> None:
            results["inference"] = pod_load.send(HOST, run.port, long_request, timeout=pod.grace)

        def trickled() -> None:
            method, p, body, _ = infer(1000)
            t1 = time.monotonic()
            try:
                with socket.create_connection((HOST, run.port), timeout=pod.grace) as sock:
                    head = f"{method} {p} HTTP/1.1\r\nHost: pod\r\nConnection: close\r\n"
                    head += f"Content-Length: {len(body)}\r\nContent-Type: application/json\r\n\r\n"
                    sock.sendall(head.encode())
                    pieces = 6
                    step = math.ceil(len(body) / pieces)
                    for i in range(pieces):
                        sock.sendall(body[i * step : (i + 1) * step])
                        time.sleep(0.5)
                    status, _ = pod_load.read_reply(sock)
                results["upload"] = pod_load.Outcome(status, time.monotonic() - t1)
            except OSError as exc:
                results["upload"] = pod_load.Outcome(0, time.monotonic() - t1, error=repr(exc))

        stop = threading.Event()
        loop: list[pod_load.Outcome] = []

        def short_loop() -> None:
            loop.extend(pod_load.closed_loop(HOST, run.port, infer(1000), 4, pod.grace, stop))

        threads = [threading.Thread(target=f, daemon=True) for f in (long_one, trickled, short_loop)]
        for thread in threads:
            thread.start()
        time.sleep(1.0)  # the inference is inside onnxruntime, the upload half sent, the loop running
        # By the end of the preStop sleep the endpoint removal has reached every client, so no
        # NEW connection arrives: the loop stops starting requests; the ones in flight go on.
        stop.set()
        t_term = time.monotonic()
        # What the kubelet does after both preStop hooks: SIGTERM to each container's pid 1 at once.
        os.kill(server.pid, signal.SIGTERM)
        os.kill(run.nginx.pid, signal.SIGTERM)
        exits = {}
        for name, process in ((APP, server.process), (PROXY, run.nginx)):
            try:
                process.wait(timeout=pod.grace)
            except subprocess.TimeoutExpired:
                pytest.fail(f"{name} did not exit within terminationGracePeriodSeconds {pod.grace:g} s")
            exits[name] = (process.returncode, time.monotonic() - t_term)
        for thread in threads:
            thread.join(pod.grace)
        accepted = loop
        lost = [o for o in loop if o.status != 200]
        show(
            capsys,
            f"\npod SIGTERM (both containers at once) during requests: 4 s inference -> "
            f"HTTP {results['inference'].status} after {results['inference'].seconds:.1f} s; "
            f"trickled upload -> HTTP {results['upload'].status}; short loop {len(accepted)} accepted, "
            f"{len(lost)} lost; exits "
            + ", ".join(f"{n} {code} after {s:.1f} s" for n, (code, s) in exits.items())
            + f" (grace {pod.grace:g} s)",
        )
        assert results["inference"].status == 200, (results, server.log()[-3000:])
        assert results["upload"].status == 200, (results, run.nginx_log.read_text()[-3000:])
        assert accepted and not lost, lost[:5]
        assert all(code == 0 for code, _ in exits.values()), exits
        assert "nginx finished after" in server.log(), server.log()[-3000:]
