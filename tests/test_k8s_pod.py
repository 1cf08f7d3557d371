"""The pod contract: the rendered `shared` Deployment's own command, args and env, run under
the pod's conditions emulated on this machine (as root, which CI is):

- the manifest's numeric uid/gid (`setpriv --reuid --regid --clear-groups`, no new privileges);
- a read-only root filesystem, writable ONLY at the manifest's emptyDir paths (a private
  mount namespace, `unshare -m`: every mount remounted read-only, tmpfs at the emptyDirs);
- a CPU quota equal to `limits.cpu` in a cgroup made here (v1 `cpu.cfs_quota_us`, or v2
  `cpu.max`), with the affinity mask (all of this machine's cores) wider than the quota.

Checked: ready within the startup probe's budget, both probe paths, /metrics, one
classification of the cat photo, the unpinned quota-sized layout line, and SIGTERM
during a slow request: that request finishes with 200 and the server exits within
`terminationGracePeriodSeconds`.

What stands in for the image (checked for real by deploy/container/ci_image.py): the
command's venv (/opt/onnxpool in the image) is this checkout's .venv; the ConfigMap's
onnxpool.toml is written to a temp folder and bind-mounted read-only at the manifest's
mount path; the model paths (/models in the image) point at this checkout's demo model;
the bind port is a free one (other runs share this host). A mount point missing on the
host (e.g. /run/onnxpool) is created as an empty folder and left there: another run may
be using it as a mount point in its own namespace.

Needs root, kubectl, unshare, setpriv and a writable cgroup CPU controller: without them
it fails when CI=true and skips elsewhere.
"""

from __future__ import annotations

import contextlib
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.harness import DEMO_MODEL, REPO, Server, free_port, spawn_logged
from tests.k8s_render import OVERLAYS, in_ci, need_tool, render
from tests.slow_model import build_slow_model, infer_body, server_settings

pytestmark = [pytest.mark.slow, pytest.mark.pod]

OVERLAY = "shared"
CAT = REPO / "models" / "samples" / "chelsea-cat.jpg"
CGROUP = Path("/sys/fs/cgroup")
# Kernel filesystems a pod has as well (the runtime mounts them); everything else goes read-only.
KERNEL_MOUNTS = ("/proc", "/sys", "/dev")


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
class Pod:
    """What the rendered Deployment says about its one container."""

    argv: list[str]
    env: dict[str, str]
    uid: int
    gid: int
    empty_dirs: dict[str, str]  # mount path -> tmpfs size
    config_maps: dict[str, dict[str, str]]  # mount path -> file name -> text
    cpu_limit: float
    startup_budget: float
    grace: float
    image_venv: Path


def rendered_pod() -> Pod:
    docs = render(OVERLAYS / OVERLAY)
    dep = next(d for d in docs if d["kind"] == "Deployment")
    spec = dep["spec"]["template"]["spec"]
    c = spec["containers"][0]
    sc = {**spec.get("securityContext", {}), **c.get("securityContext", {})}
    assert sc.get("readOnlyRootFilesystem") and sc.get("runAsNonRoot"), "the pod must be non-root with a read-only root"
    volumes = {v["name"]: v for v in spec["volumes"]}
    configmaps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    empty_dirs, config_maps = {}, {}
    for m in c["volumeMounts"]:
        vol = volumes[m["name"]]
        if "emptyDir" in vol:
            empty_dirs[m["mountPath"]] = memory_quantity(str(vol["emptyDir"].get("sizeLimit", "64Mi")))
        elif "configMap" in vol:
            config_maps[m["mountPath"]] = dict(configmaps[vol["configMap"]["name"]]["data"])
        else:
            raise AssertionError(f"volume {m['name']}: only emptyDir and configMap are emulated")
    probe = c["startupProbe"]
    command = [*c["command"], *c.get("args", [])]
    return Pod(
        argv=command,
        env={e["name"]: str(e["value"]) for e in c.get("env", [])},
        uid=int(sc["runAsUser"]),
        gid=int(sc.get("runAsGroup", sc["runAsUser"])),
        empty_dirs=empty_dirs,
        config_maps=config_maps,
        cpu_limit=cpu_quantity(str(c["resources"]["limits"]["cpu"])),
        startup_budget=probe.get("initialDelaySeconds", 0) + probe["periodSeconds"] * probe["failureThreshold"],
        grace=float(spec["terminationGracePeriodSeconds"]),
        image_venv=Path(command[0]).parent.parent,
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
    q = shlex.quote
    # All sources are bound aside first: a tmpfs over /root hides every path under it.
    lines = [
        f"mkdir -p {stage} && mount --bind {q(str(path))} {stage}"
        for (path, _), stage in zip(hidden, stages, strict=True)
    ]
    lines += [f"mount -t tmpfs -o mode=755,size=1m exposed {q(str(b))}" for b in sorted({b for _, b in hidden})]
    lines += [
        f"mkdir -p {q(str(path))} && mount --move {stage} {q(str(path))}"
        for (path, _), stage in zip(hidden, stages, strict=True)
    ]
    return lines


def mount_script(pod: Pod, config_dirs: dict[str, Path], workdir: str, staging: Path) -> str:
    """Shell run as root in the new mount namespace; it ends by exec'ing the pod's command."""
    lines = ["set -eu", "mount --make-rprivate /"]
    lines += expose_lines([Path(sys.base_prefix), REPO], staging)
    for path, size in pod.empty_dirs.items():
        lines.append(f"mkdir -p {shlex.quote(path)}")
        lines.append(f"mount -t tmpfs -o rw,nosuid,nodev,size={size},mode=1777 emptydir {shlex.quote(path)}")
    for path, source in config_dirs.items():
        lines.append(f"mkdir -p {shlex.quote(path)}")
        lines.append(f"mount --bind {shlex.quote(str(source))} {shlex.quote(path)}")
        lines.append(f"mount -o remount,bind,ro {shlex.quote(path)}")
    # Every other mount read-only (the root first, then submounts), except the kernel's own
    # filesystems a pod has too and the writable paths made above.
    keep = [*pod.empty_dirs, *KERNEL_MOUNTS]
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
    user = ["setpriv", f"--reuid={pod.uid}", f"--regid={pod.gid}", "--clear-groups", "--no-new-privs"]
    lines.append("exec " + " ".join(map(shlex.quote, user)) + ' -- env -i "$@"')
    return "\n".join(lines)


@dataclass
class PodRun:
    server: Server
    quota: CpuQuota
    started: float
    ready_after: float


@contextlib.contextmanager
def run_pod(pod: Pod, share: Path, extra_env: dict[str, str] | None = None) -> Iterator[PodRun]:
    """Start the pod's command under the emulated conditions; stop it and remove its cgroup after."""
    for tool in ("unshare", "nsenter", "setpriv", "findmnt", "mount"):
        need_tool(tool)
    if os.geteuid() != 0:
        unavailable("needs root (setpriv to the pod's uid, mount namespaces, cgroups)")
    affinity = len(os.sched_getaffinity(0))
    if affinity <= pod.cpu_limit:
        unavailable(
            f"needs an affinity mask wider than limits.cpu {pod.cpu_limit:g}; this machine has {affinity} cores"
        )
    try:
        quota = CpuQuota(pod.cpu_limit)
    except OSError as exc:
        unavailable(f"cannot make a cgroup with a CPU quota: {exc}")
        raise
    try:
        share = Path(tempfile.mkdtemp(prefix="run-", dir=share))  # one per start
        share.chmod(0o755)
        config_dirs: dict[str, Path] = {}
        for index, (path, files) in enumerate(pod.config_maps.items()):
            folder = share / f"configmap-{index}"
            folder.mkdir(mode=0o755)
            for name, text in files.items():
                (folder / name).write_text(text, encoding="utf-8")
                (folder / name).chmod(0o644)
            config_dirs[path] = folder
        port = free_port()
        host = pod.env.get("ONNXPOOL_SERVER__BIND", "0.0.0.0:8000").rpartition(":")[0]
        venv = Path(sys.prefix)  # this checkout's .venv (the test runs in it)
        argv = [
            str(venv / Path(a).relative_to(pod.image_venv)) if a.startswith(f"{pod.image_venv}/") else a
            for a in pod.argv
        ]
        env = {
            # What the image's ENV gives every container (PATH to its venv first, no .pyc writes).
            "PATH": f"{venv}/bin:/usr/local/bin:/usr/bin:/bin",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
            **pod.env,
            "ONNXPOOL_SERVER__BIND": f"{host}:{port}",
            # /models is the image's: here the checkout's demo model.
            "ONNXPOOL_MODEL__PATH": str(DEMO_MODEL),
            "ONNXPOOL_MODEL__LABELS": str(DEMO_MODEL.parent / "labels.txt"),
            **(extra_env or {}),
        }
        workdir = env.get("ONNXPOOL_SERVER__RUN_DIR", next(iter(pod.empty_dirs)))
        script = mount_script(pod, config_dirs, workdir, share)
        join = f'echo $$ > {shlex.quote(str(quota.path / "cgroup.procs"))} && exec "$@"'
        command = ["sh", "-c", join, "sh", "unshare", "-m", "--propagation", "private", "sh", "-c", script, "pod"]
        command += [f"{k}={v}" for k, v in env.items()] + argv
        log_path = share / f"pod-{port}.log"
        t0 = time.monotonic()
        process = spawn_logged(command, log_path, {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, cwd=share)
        server = Server(process=process, port=port, log_path=log_path, env=env)
        try:
            server.wait_ready(max(1, math.floor(pod.cpu_limit)), timeout=pod.startup_budget)
            yield PodRun(server=server, quota=quota, started=t0, ready_after=time.monotonic() - t0)
        finally:
            server.stop(timeout=pod.grace)  # its own process group only
    finally:
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


def layout_line(log: str) -> str:
    return next((line for line in log.splitlines() if "cpu: " in line), "")


def show(capsys: pytest.CaptureFixture[str], text: str) -> None:
    """Into the test log even when pytest captures output (`make test`): CI's record of the layout."""
    with capsys.disabled():
        print(text, flush=True)


def test_pod_serves_under_its_own_conditions(pod: Pod, share: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with run_pod(pod, share) as run:
        server = run.server
        show(
            capsys,
            f"\npod contract ({OVERLAY}, cgroup {run.quota.version}, limits.cpu {pod.cpu_limit:g}, uid {pod.uid}): "
            f"ready after {run.ready_after:.1f} s (startup probe budget {pod.startup_budget:g} s)",
        )
        assert run.ready_after < pod.startup_budget
        for path in ("/v2/health/live", "/v2/health/ready"):
            assert requests.get(server.url + path, timeout=5).status_code == 200, path
        metrics = requests.get(server.url + "/metrics", timeout=10)
        assert metrics.status_code == 200 and "# TYPE" in metrics.text
        with CAT.open("rb") as photo:
            answer = requests.post(server.url + "/predict", files={"image": photo}, timeout=30)
        assert answer.status_code == 200, answer.text
        assert "cat" in answer.text.lower(), answer.text[:300]

        log = server.log()
        line = layout_line(log)
        show(capsys, f"pod contract layout line: {line}")
        expected_workers = max(1, math.floor(pod.cpu_limit))
        assert f"cpu: unpinned (affinity {len(os.sched_getaffinity(0))} cores > quota {pod.cpu_limit:g})" in line
        assert f"-> {expected_workers} workers x 1 threads" in line
        master = server.pid
        uids = next(ln for ln in Path(f"/proc/{master}/status").read_text().splitlines() if ln.startswith("Uid:"))
        assert uids.split()[1:] == [str(pod.uid)] * 4, uids  # real, effective, saved, fs: the pod's uid
        workers = server.workers()
        assert len(workers) == expected_workers
        for pid in workers:  # not pinned: each worker keeps the whole mask
            assert os.sched_getaffinity(pid) == os.sched_getaffinity(0)
            assert str(run.quota.path.name) in Path(f"/proc/{pid}/cgroup").read_text()
        assert "Read-only file system" not in log and "Permission denied" not in log, log[-3000:]
        # The emulation holds: as the pod's uid, in the pod's mounts, only the emptyDirs are writable.
        for path, writable in [*((p, True) for p in pod.empty_dirs), ("/tmp", False), (str(REPO), False)]:
            probe = subprocess.run(
                ["nsenter", f"--target={master}", "--mount", "--", "setpriv", f"--reuid={pod.uid}",
                 f"--regid={pod.gid}", "--clear-groups", "touch", f"{path}/.pod-write-probe"],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            assert (probe.returncode == 0) == writable, (path, probe.stderr)


def test_pod_drains_a_slow_request_on_sigterm(pod: Pod, share: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = build_slow_model(share / "slow" / "slow.onnx")
    model.parent.chmod(0o755)
    model.chmod(0o644)
    with run_pod(pod, share, server_settings(model)) as run:
        server = run.server
        url = f"{server.url}/v2/models/slow/infer"
        # Calibrate: iterations for a request of about 4 s on this quota (well inside graceful_timeout).
        t0 = time.monotonic()
        assert requests.post(url, json=infer_body(200_000), timeout=60).status_code == 200
        per_iteration = max(1e-8, (time.monotonic() - t0) / 200_000)
        iterations = int(4.0 / per_iteration)
        result: dict[str, Any] = {}

        def slow_request() -> None:
            start = time.monotonic()
            try:
                result["status"] = requests.post(url, json=infer_body(iterations), timeout=pod.grace).status_code
            except requests.RequestException as exc:
                result["error"] = exc
            result["seconds"] = time.monotonic() - start

        client = threading.Thread(target=slow_request)
        client.start()
        time.sleep(1.0)  # the request is inside onnxruntime now
        assert client.is_alive(), result
        t_term = time.monotonic()
        server.signal(signal.SIGTERM)
        try:
            server.process.wait(timeout=pod.grace)
        except subprocess.TimeoutExpired:
            pytest.fail(f"no exit within terminationGracePeriodSeconds {pod.grace:g} s:\n{server.log()[-3000:]}")
        exited = time.monotonic() - t_term
        client.join(timeout=pod.grace)
        show(
            capsys,
            f"\npod drain: SIGTERM {1.0:.1f} s into a {result.get('seconds', 0):.1f} s request -> "
            f"HTTP {result.get('status')}; exit {server.process.returncode} {exited:.1f} s after SIGTERM "
            f"(grace {pod.grace:g} s)",
        )
        assert result.get("status") == 200, (result, server.log()[-3000:])
        assert server.process.returncode == 0
        assert exited < pod.grace
