#!/usr/bin/env python3
"""Build the real onnxpool image and run it the way the pod runs it, with no registry.

CI runs this after `make test` (as root):  .venv/bin/python deploy/container/ci_image.py

1. Base image: the Dockerfile's default BASE_IMAGE (debian:bookworm-slim) is made
   by deploy/container/base-image.sh (the documented commands: mmdebstrap
   --variant=minbase from this machine's apt sources, `podman import`ed under
   that SAME name), so the Dockerfile is built unchanged with `--pull=never`.
   Reused when already imported (the rootfs tarball is cached in
   $ONNXPOOL_CI_CACHE, default /var/cache/onnxpool-ci).
2. `podman build --pull=never` of the Dockerfile; the host CA bundle, when
   present, is given to pip as a build secret (never a layer).
3. The image itself: its size, no apt lists or .deb files, nginx present, and what a
   several-model host (the zoo overlay) needs besides: nginx's js module, the demo models
   at /opt/onnxpool/models.
4. The README's quick start (one container, development): serves the cat, writes
   nothing of onnxruntime's telemetry; a broken model mounted at /models is
   refused with one line, never replaced by the demo.
5. A podman pod like the rendered Deployment (kubectl kustomize of an overlay,
   default `shared`): both containers with their commands, args and env, the
   numeric uid/gid, `--read-only --read-only-tmpfs=false` with the emptyDir as
   one tmpfs volume both mount, the ConfigMap files read-only, each
   container's `--cpus` / `--memory` limits, all capabilities dropped,
   no-new-privileges, the pod's port published. Then: ready through nginx within
   the startup budget, every probe (nginx's httpGet ones; gunicorn's exec
   liveness via `podman exec`), /metrics, /docs and its files, a cat, one gRPC ModelInfer
   (tritonclient.grpc) through the pod's port grpc, the layout line; 2 slow clients
   (1 byte/s) with requests and probes still answered; a closed loop of
   overload (503 + Retry-After, probes green, served p99 bounded; its connections
   set from the measured service time, so it is overload on any CPU); a clean
   `podman pod stop`. Then once more with a slow model (tests/slow_model.py):
   `podman pod stop` (SIGTERM to both containers at once) during a ~4 s
   inference and a closed loop of requests loses none, and both exit 0 within
   terminationGracePeriodSeconds.
6. The zoo overlay as a podman pod: a container per model (each with its cpu
   request as its cgroup weight, read from /proc and /sys), the host's routes, the
   front door; a cat and a setosa through it, and a setosa over gRPC (the router, by model
   name); kill -9 of iris's container (its pid 1) during a loop on efficientnet-lite0, `podman start` as the kubelet's
   restart: the loop loses nothing, iris is READY again; every container stops
   with exit 0 at once.

Known snags of this host handled here: podman's default crun refuses the
hybrid cgroup setup, so runc is used (`podman --runtime runc`); runc cannot
raise rlimits above the caller's hard limits (nor RLIMIT_NPROC above
kernel.pid_max, seen here), so --ulimit values are read from this process.
Exit status 0 only if every check passed; the last line is "N passed, N failed".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from tests import pod_load  # noqa: E402  (the checkout's load helpers, standard library only)

CACHE = Path(os.environ.get("ONNXPOOL_CI_CACHE", "/var/cache/onnxpool-ci"))
CAT = REPO / "models" / "samples" / "chelsea-cat.jpg"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
PODMAN = ["podman", "--runtime", "runc"]

results: list[tuple[str, bool, str]] = []


def log(msg: str) -> None:
    print(f"[ci-image {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def record(name: str, ok: bool, detail: str = "") -> bool:
    results.append((name, ok, detail))
    log(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}")
    return ok


def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    kw.setdefault("text", True)
    kw.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.run(cmd, check=False, **kw)


def default_base() -> str:
    text = (REPO / "Dockerfile").read_text(encoding="utf-8")
    match = re.search(r"^ARG BASE_IMAGE=(\S+)", text, re.M)
    if not match:
        sys.exit("Dockerfile has no ARG BASE_IMAGE=... default")
    return match.group(1)


def qualified(name: str) -> str:
    """What a Dockerfile's `FROM debian:bookworm-slim` means: docker.io/library/debian:bookworm-slim."""
    first = name.split("/", 1)[0]
    if "/" in name and ("." in first or ":" in first or first == "localhost"):
        return name
    return f"docker.io/{name}" if "/" in name else f"docker.io/library/{name}"


def ensure_base(base: str, rebuild: bool) -> bool:
    """The base image, made by deploy/container/base-image.sh (the documented commands) unless present."""
    image = qualified(base)
    if not rebuild and run([*PODMAN, "image", "exists", image]).returncode == 0:
        return record("base image", True, f"{image} already imported (reused)")
    if image != "docker.io/library/debian:bookworm-slim":
        sys.exit(f"base-image.sh makes debian:bookworm-slim, the Dockerfile's default; not {base}")
    CACHE.mkdir(parents=True, exist_ok=True)
    tarball = CACHE / "bookworm-minbase.tar"
    if rebuild:
        tarball.unlink(missing_ok=True)
    t0 = time.monotonic()
    proc = run(["sh", str(REPO / "deploy" / "container" / "base-image.sh"), str(tarball)], capture_output=True)
    if proc.returncode != 0:
        return record("base image (base-image.sh)", False, proc.stderr[-2000:])
    return record("base image (base-image.sh)", True, f"{image} from {tarball} in {time.monotonic() - t0:.1f} s")


def ulimits() -> list[str]:
    """--ulimit values no higher than this process's hard limits (runc cannot raise them)."""
    args = []
    nofile_soft, nofile_hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    args += ["--ulimit", f"nofile={min(nofile_soft, nofile_hard)}:{nofile_hard}"]
    _, nproc_hard = resource.getrlimit(resource.RLIMIT_NPROC)
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    cap = pid_max if nproc_hard == resource.RLIM_INFINITY else min(nproc_hard, pid_max)
    args += ["--ulimit", f"nproc={cap}:{cap}"]
    return args


def build(tag: str, logfile: Path) -> bool:
    cmd = [*PODMAN, "build", "--pull=never", "--layers", *ulimits(), "-t", tag, "-f", "Dockerfile"]
    if HOST_CA.is_file():
        cmd += ["--secret", f"id=host-ca,src={HOST_CA}"]
    cmd.append(".")
    log("$ " + " ".join(cmd) + f"  (log: {logfile})")
    t0 = time.monotonic()
    with logfile.open("w") as out:
        proc = run(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    took = time.monotonic() - t0
    if proc.returncode != 0:
        tail = "".join(logfile.read_text(errors="replace").splitlines(keepends=True)[-40:])
        return record("podman build", False, f"exit {proc.returncode} after {took:.1f} s; last lines:\n{tail}")
    return record("podman build", True, f"{tag} in {took:.1f} s")


# ----------------------------------------------------------------- run phase


def rendered_pod(overlay: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    import yaml  # PyYAML: a dev dependency of the project

    kubectl = shutil.which("kubectl")
    if not kubectl:
        sys.exit("kubectl not found: it renders the manifest the container is run like")
    out = run([kubectl, "kustomize", str(REPO / "deploy" / "k8s" / "overlays" / overlay)], capture_output=True)
    if out.returncode != 0:
        sys.exit(out.stderr)
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    return deployment, docs


def cpus(q: str) -> str:
    return str(int(q[:-1]) / 1000) if q.endswith("m") else str(float(q))


def memory(q: str) -> str:
    units = {"Ki": "k", "Mi": "m", "Gi": "g"}
    for suffix, unit in units.items():
        if q.endswith(suffix):
            return q[: -len(suffix)] + unit
    return q


def size_bytes(q: str) -> int:
    for suffix, factor in (("Ki", 2**10), ("Mi", 2**20), ("Gi", 2**30)):
        if q.endswith(suffix):
            return int(q[: -len(suffix)]) * factor
    return int(q)


def cpu_shares(q: str) -> int:
    millicores = int(q[:-1]) if q.endswith("m") else round(float(q) * 1000)
    return max(2, millicores * 1024 // 1000)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def container_args(
    spec: dict[str, Any], c: dict[str, Any], docs: list[dict[str, Any]], workdir: Path, volumes: dict[str, str]
) -> list[str]:
    """`podman run` arguments for one container of the rendered pod (without --pod, image, args)."""
    sc = {**spec.get("securityContext", {}), **c.get("securityContext", {})}
    uid, gid = sc["runAsUser"], sc.get("runAsGroup", sc["runAsUser"])
    args = ["run", "-d", "--name", f"onnxpool-ci-{c['name']}-{uuid.uuid4().hex[:8]}", *ulimits()]
    args += ["--user", f"{uid}:{gid}"]
    if sc.get("readOnlyRootFilesystem"):
        # podman's --read-only adds tmpfs at /run, /tmp, /var/tmp unless told not to:
        # only the manifest's emptyDirs may be writable.
        args += ["--read-only", "--read-only-tmpfs=false"]
    if sc.get("allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges"]
    for cap in sc.get("capabilities", {}).get("drop", []):
        args += ["--cap-drop", cap]
    limits = c.get("resources", {}).get("limits", {})
    if "cpu" in limits:
        args += ["--cpus", cpus(str(limits["cpu"]))]
    requests = c.get("resources", {}).get("requests", {})
    if "cpu" in requests:
        # The kubelet's cgroup weight for a cpu request: shares = millicores x 1024 / 1000.
        args += ["--cpu-shares", str(cpu_shares(str(requests["cpu"])))]
    if "memory" in limits:
        args += ["--memory", memory(str(limits["memory"]))]
    pod_volumes = {v["name"]: v for v in spec.get("volumes", [])}
    configmaps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    for m in c.get("volumeMounts", []):
        vol = pod_volumes[m["name"]]
        if "emptyDir" in vol:
            # An emptyDir both containers mount: one podman volume (tmpfs, the pod's uid) for both.
            args += ["-v", f"{volumes[m['name']]}:{m['mountPath']}"]
        elif "configMap" in vol:
            folder = workdir / m["name"]
            folder.mkdir(exist_ok=True)
            for key, value in configmaps[vol["configMap"]["name"]].get("data", {}).items():
                (folder / key).write_text(value, encoding="utf-8")
            args += ["-v", f"{folder}:{m['mountPath']}:ro"]
        else:
            sys.exit(f"volume {m['name']}: only emptyDir and configMap are emulated")
    deployment = next(d for d in docs if d["kind"] == "Deployment")["metadata"]
    # The downward API's fields the manifests read (valueFrom.fieldRef), filled as the kubelet does.
    namespace = deployment.get("namespace", "default")
    pod_fields = {"metadata.name": f"{deployment['name']}-0", "metadata.namespace": namespace}
    for e in c.get("env", []):
        if "value" in e:
            args += ["-e", f"{e['name']}={e['value']}"]
            continue
        field = e["valueFrom"]["fieldRef"]["fieldPath"]
        if field not in pod_fields:
            sys.exit(f"env {e['name']}: only {sorted(pod_fields)} of the downward API are emulated")
        args += ["-e", f"{e['name']}={pod_fields[field]}"]
    if c.get("command"):
        args += ["--entrypoint", json.dumps(c["command"])]
    return args


def http(
    method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None, timeout: float = 10
) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return int(resp.status), bytes(resp.read())
    except urllib.error.HTTPError as error:
        return error.code, error.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return 0, b""


def multipart(field: str, path: Path) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="{field}"; filename="{path.name}"\r\n'
        "Content-Type: image/jpeg\r\n\r\n"
    ).encode()
    return head + path.read_bytes() + f"\r\n--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


@dataclass
class Pod:
    """The rendered Deployment's numbers the run phase checks against."""

    dep: dict[str, Any]
    docs: list[dict[str, Any]]
    budget: float
    grace: float
    layout: str

    @property
    def spec(self) -> dict[str, Any]:
        return dict(self.dep["spec"]["template"]["spec"])

    def container(self, name: str) -> dict[str, Any]:
        return dict(next(c for c in self.spec["containers"] if c["name"] == name))

    @property
    def port(self) -> int:
        return int(next(p["containerPort"] for p in self.container(PROXY)["ports"] if p.get("name") == "http"))

    @property
    def grpc_port(self) -> int | None:
        """The port the Service's port grpc targets (nginx's gRPC listener; the zoo's router), if any."""
        ports = [
            p["containerPort"] for c in self.spec["containers"] for p in c.get("ports", []) if p.get("name") == "grpc"
        ]
        return int(ports[0]) if ports else None


@dataclass
class Running:
    """A started podman pod: its name, its containers, the pod's port on 127.0.0.1."""

    name: str
    cids: dict[str, str]
    volume: str
    port: int
    grpc_port: int = 0
    """The pod's port grpc, published on 127.0.0.1 (0: the pod has none)."""
    ready_after: float = 0.0

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


APP, PROXY = "onnxpool", "nginx"


def start_pod(pod: Pod, tag: str, workdir: Path, extra: dict[str, list[str]] | None = None) -> Running | None:
    """A podman pod like the Deployment's: the pod's port published, one tmpfs volume per emptyDir."""
    name = f"onnxpool-ci-{uuid.uuid4().hex[:8]}"
    running = Running(name=name, cids={}, volume="", port=free_port())
    empty = [v for v in pod.spec.get("volumes", []) if "emptyDir" in v]
    sc = pod.spec.get("securityContext", {})
    volumes = {}
    for v in empty:
        # tmpfs size in 4 KiB pages: podman takes `size=` in a volume's options for a disk quota.
        pages = size_bytes(str(v["emptyDir"].get("sizeLimit", "256Mi"))) // 4096
        volume = f"{name}-{v['name']}"
        opts = f"nr_blocks={pages},uid={sc.get('runAsUser', 10001)},gid={sc.get('fsGroup', 10001)},mode=0770"
        made = run([*PODMAN, "volume", "create", "--opt", "type=tmpfs", "--opt", "device=tmpfs", "--opt", f"o={opts}",
                    volume], capture_output=True)  # fmt: skip
        if made.returncode != 0:
            record("podman volume create (emptyDir)", False, made.stderr[-2000:])
            return None
        volumes[v["name"]] = volume
        running.volume = volume
    published = ["-p", f"127.0.0.1:{running.port}:{pod.port}"]
    if pod.grpc_port is not None:
        running.grpc_port = free_port()
        published += ["-p", f"127.0.0.1:{running.grpc_port}:{pod.grpc_port}"]
    created = run([*PODMAN, "pod", "create", "--name", name, *published], capture_output=True)
    if created.returncode != 0:
        record("podman pod create", False, created.stderr[-2000:])
        return None
    t0 = time.monotonic()
    for c in pod.spec["containers"]:
        args = container_args(pod.spec, c, pod.docs, workdir, volumes)
        args = [*args[:2], "--pod", name, *args[2:], *(extra or {}).get(c["name"], []), tag, *c.get("args", [])]
        log("$ podman " + " ".join(args))
        started = run([*PODMAN, *args], capture_output=True)
        if started.returncode != 0:
            record(f"podman run ({c['name']})", False, started.stderr[-2000:])
            return running
        running.cids[c["name"]] = started.stdout.strip()
    while time.monotonic() - t0 < pod.budget:
        if http("GET", running.base + "/v2/health/ready", timeout=2)[0] == 200:
            running.ready_after = time.monotonic() - t0
            return running
        states = [run([*PODMAN, "inspect", "-f", "{{.State.Running}}", cid], capture_output=True).stdout.strip()
                  for cid in running.cids.values()]  # fmt: skip
        if "false" in states:
            break
        time.sleep(0.2)
    return running


def container_log(cid: str) -> str:
    out = run([*PODMAN, "logs", cid], capture_output=True)
    return out.stdout + out.stderr


def remove_pod(running: Running) -> None:
    run([*PODMAN, "pod", "rm", "-f", running.name], capture_output=True)
    for volume in {running.volume} - {""}:
        run([*PODMAN, "volume", "rm", "-f", volume], capture_output=True)


def stop_pod(pod: Pod, running: Running) -> tuple[bool, str]:
    """SIGTERM to both containers at once (`podman stop A B` stops them in parallel), as the kubelet
    after preStop; then `podman pod stop` for the infra container. Not `podman pod stop` alone: it
    stops the infra container, which holds the published port's forwarding, at the same time, and
    the replies of requests still in flight would never reach their clients."""
    t1 = time.monotonic()
    stop = run([*PODMAN, "stop", "-t", str(int(pod.grace)), *running.cids.values()], capture_output=True)
    took = time.monotonic() - t1
    run([*PODMAN, "pod", "stop", "-t", "5", running.name], capture_output=True)
    codes = {
        n: run([*PODMAN, "inspect", "-f", "{{.State.ExitCode}}", cid], capture_output=True).stdout.strip()
        for n, cid in running.cids.items()
    }
    waited = "nginx finished after" in container_log(running.cids[APP])
    ok = stop.returncode == 0 and set(codes.values()) == {"0"} and took < pod.grace and waited
    return ok, f"exit codes {codes} after {took:.1f} s (grace {pod.grace:g} s), gunicorn waited for nginx: {waited}"


def dump_logs(running: Running) -> None:
    for n, cid in running.cids.items():
        log(f"{n} container log:\n" + container_log(cid)[-4000:])


def run_like_pod(tag: str, overlay: str) -> None:
    dep, docs = rendered_pod(overlay)
    spec = dep["spec"]["template"]["spec"]
    startup = next(c for c in spec["containers"] if c["name"] == APP)["startupProbe"]
    pod = Pod(
        dep=dep,
        docs=docs,
        budget=startup["periodSeconds"] * startup["failureThreshold"],
        grace=float(spec["terminationGracePeriodSeconds"]),
        layout=dep["spec"]["template"]["metadata"].get("annotations", {}).get("onnxpool.io/cpu-layout", "unpinned"),
    )
    with tempfile.TemporaryDirectory(prefix="onnxpool-ci-") as tmp:
        workdir = Path(tmp)
        os.chmod(workdir, 0o755)
        image_contents(tag)
        quick_start(tag, workdir)
        serve_like_pod(pod, tag, workdir)
        drain_like_pod(pod, tag, workdir)


# What a several-model host (the zoo overlay) needs of the image besides nginx: nginx's js module, found
# the way the host finds it (onnxpool.proxy.js_module), and the demo models at the path the zoo's
# and scale-out's settings name (deploy/k8s/overlays/zoo/zoo.toml).
SEVERAL_MODELS_CHECK = (
    "import sys; from pathlib import Path; "
    "from onnxpool.proxy import js_module, nginx_binary; "
    "module = js_module(nginx_binary() or 'nginx'); print('js module:', module); "
    "files = [Path('/opt/onnxpool/models', m, 'model.onnx') for m in ('efficientnet-lite0', 'iris')]; "
    "missing = [str(f) for f in files if not f.is_file()]; print('demo models missing:', missing); "
    "sys.exit(1 if module is None or missing else 0)"
)


def image_contents(tag: str) -> None:
    """Size, no apt lists or .deb files, nginx present: what the image is, before running it."""
    size = run([*PODMAN, "image", "inspect", "-f", "{{.Size}}", tag], capture_output=True).stdout.strip()
    record("image size", size.isdigit(), f"{int(size or 0) / 1e6:.0f} MB")
    script = (
        "n=$(find /var/lib/apt/lists /var/cache/apt -type f 2>/dev/null | wc -l); echo apt-files=$n; "
        "nginx -v 2>&1; test $n -eq 0 && command -v nginx >/dev/null"
    )
    out = run([*PODMAN, "run", "--rm", *ulimits(), "--entrypoint", "/bin/sh", tag, "-c", script], capture_output=True)
    record("no apt lists or .deb files; nginx in the image", out.returncode == 0, (out.stdout + out.stderr).strip())
    python = "/opt/onnxpool/bin/python"
    out = run([*PODMAN, "run", "--rm", *ulimits(), "--entrypoint", python, tag, "-I", "-c", SEVERAL_MODELS_CHECK],
              capture_output=True)  # fmt: skip
    record("several models: nginx's js module and the demo models at /opt/onnxpool/models", out.returncode == 0,
           (out.stdout + out.stderr).strip()[-600:])  # fmt: skip


def quick_start(tag: str, workdir: Path) -> None:
    """The README's single-container run (development), and a broken model at /models refused in one line."""
    port = free_port()
    base = ["run", "-d", *ulimits(), "-p", f"127.0.0.1:{port}:8000", "--read-only", "--read-only-tmpfs=false",
            "--tmpfs", "/run/onnxpool:rw,mode=1777,U"]  # fmt: skip
    started = run([*PODMAN, *base, tag], capture_output=True)
    cid = started.stdout.strip()
    try:
        ready = False
        t0 = time.monotonic()
        while cid and time.monotonic() - t0 < 60 and not ready:
            ready = http("GET", f"http://127.0.0.1:{port}/v2/health/ready", timeout=2)[0] == 200
            time.sleep(0.2)
        payload, ctype = multipart("image", CAT)
        status, body = http("POST", f"http://127.0.0.1:{port}/predict", payload, {"Content-Type": ctype}, timeout=30)
        written = run([*PODMAN, "exec", cid, "find", "/run/onnxpool", "-maxdepth", "2"], capture_output=True).stdout
        telemetry = ".cache" in written or "Microsoft" in written
        record(
            "quick start (single container, as README)",
            ready and status == 200 and b"cat" in body.lower() and not telemetry,
            f"ready {ready}, /predict HTTP {status}; written under /run/onnxpool: "
            + " ".join(sorted(line.removeprefix("/run/onnxpool/") for line in written.split()[1:])),
        )
    finally:
        if cid:
            run([*PODMAN, "rm", "-f", cid], capture_output=True)
    bad = workdir / "bad-model"
    bad.mkdir()
    (bad / "model.onnx").write_bytes(b"this is not an onnx model\n")
    (bad / "labels.txt").write_text("a\nb\n")
    for path in (bad, bad / "model.onnx", bad / "labels.txt"):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    refused = run([*PODMAN, "run", "--rm", *ulimits(), "--read-only", "--read-only-tmpfs=false",
                   "--tmpfs", "/run/onnxpool:rw,mode=1777,U", "-v", f"{bad}:/models:ro", tag],
                  capture_output=True, timeout=120)  # fmt: skip
    text = refused.stdout + refused.stderr
    lines = [ln for ln in text.splitlines() if "/models/model.onnx" in ln]
    record(
        "a broken /models/model.onnx is refused, never replaced by the demo",
        refused.returncode != 0 and bool(lines) and "efficientnet" not in text.split("/models/model.onnx")[0][-200:],
        f"exit {refused.returncode}: {lines[:1]}",
    )


def probe_checks(pod: Pod, running: Running) -> list[pod_load.Check]:
    """The pod's probes as the kubelet runs them: nginx's httpGet ones, gunicorn's exec liveness in its container."""
    checks: list[pod_load.Check] = []
    for kind in ("readinessProbe", "livenessProbe"):
        probe = pod.container(PROXY)[kind]
        checks.append(pod_load.http_check("127.0.0.1", running.port, probe["httpGet"]["path"], probe["timeoutSeconds"]))
    live = pod.container(APP)["livenessProbe"]

    def exec_live() -> tuple[bool, str]:
        try:
            done = run([*PODMAN, "exec", running.cids[APP], *live["exec"]["command"]], capture_output=True,
                       timeout=live["timeoutSeconds"] + 5)  # fmt: skip
        except subprocess.TimeoutExpired:
            return False, "exec liveness: no answer"
        return done.returncode == 0, f"exec liveness: exit {done.returncode} {done.stderr.strip()}"

    checks.append(exec_live)
    return checks


def serve_like_pod(pod: Pod, tag: str, workdir: Path) -> None:
    """The demo model: start-up, probes, /metrics, /docs, a cat, the layout line; slow clients; overload; clean stop."""
    running = start_pod(pod, tag, workdir)
    if running is None:
        return
    try:
        ready = running.ready_after
        record("ready through nginx within the startup probe budget", ready > 0, f"{ready:.1f} s of {pod.budget:g} s")
        if not ready:
            dump_logs(running)
            return
        for check in probe_checks(pod, running):
            ok, detail = check()
            record(f"probe {detail.split(':')[0]}", ok, detail)
        status, body = http("GET", running.base + "/metrics")
        record("GET /metrics", status == 200 and b"# TYPE" in body, f"HTTP {status}, {len(body)} bytes")
        # The API page and Swagger UI's files (the locked flask-swagger-ui's copy), through nginx.
        for path, marker in (("/docs", b"swagger-ui-bundle.js"), ("/docs/swagger-ui-bundle.js", b"SwaggerUIBundle")):
            status, body = http("GET", running.base + path)
            record(f"GET {path}", status == 200 and marker in body, f"HTTP {status}, {len(body)} bytes")
        payload, ctype = multipart("image", CAT)
        status, body = http("POST", running.base + "/predict", payload, {"Content-Type": ctype}, timeout=30)
        record("POST /predict (cat photo)", status == 200 and b"cat" in body.lower(), f"HTTP {status} {body[:120]!r}")
        grpc_infer(running, "efficientnet-lite0", "input", (1, 3, 224, 224), "logits")
        text = container_log(running.cids[APP])
        want = f"cpu: {pod.layout}"
        line = next((ln for ln in text.splitlines() if "cpu: " in ln), "")
        record(f"layout line '{want}'", want in line, line[:300])
        request: pod_load.Request = ("POST", "/predict", payload, {"Content-Type": ctype, "Cache-Control": "no-store"})
        slow_clients(pod, running, request)
        overload(pod, running, request)
        ok, detail = stop_pod(pod, running)
        record("clean stop (podman stop of both containers at once)", ok, detail)
        if not all(good for _, good, _ in results):
            dump_logs(running)
    finally:
        remove_pod(running)


def grpc_infer(running: Running, model: str, name: str, shape: tuple[int, ...], output: str, prefix: str = "") -> None:
    """One ModelInfer with tritonclient.grpc, unchanged, through the pod's port grpc (nginx's gRPC listener,
    or in the zoo the host's gRPC router, which finds the model by the name in the message)."""
    import numpy as np  # the checkout's venv (dev extras), as the rest of this script's clients
    import tritonclient.grpc as grpcclient

    if not running.grpc_port:
        record(f"{prefix}gRPC ModelInfer ({model}) through the pod's port grpc", False, "the pod has no port grpc")
        return
    try:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{running.grpc_port}")
        tensor = grpcclient.InferInput(name, list(shape), "FP32")
        tensor.set_data_from_numpy(np.full(shape, 0.5, np.float32))
        result = client.infer(model, [tensor], client_timeout=30).as_numpy(output)
        ok, detail = result is not None and result.shape[0] == 1, f"{output} {None if result is None else result.shape}"
    except Exception as exc:  # the check's record says what failed, whatever it was
        ok, detail = False, f"{type(exc).__name__}: {exc}"
    record(f"{prefix}gRPC ModelInfer ({model}) through the pod's port grpc (tritonclient.grpc)", ok, detail)


def watching(pod: Pod, running: Running) -> list[pod_load.Watch]:
    return [pod_load.Watch(check, 1.0) for check in probe_checks(pod, running)]


def slow_clients(pod: Pod, running: Running, request: pod_load.Request) -> None:
    slow = pod_load.SlowClients("127.0.0.1", running.port, request, count=2).start()
    watches = watching(pod, running)
    try:
        for watch in watches:
            watch.__enter__()
        time.sleep(1.0)
        outcomes = pod_load.closed_loop("127.0.0.1", running.port, request, connections=2, seconds=5.0)
    finally:
        for watch in watches:
            watch.__exit__()
        slow.finish()
    good = sum(1 for o in outcomes if o.status == 200)
    failures = [r for w in watches for r in w.failures]
    record(
        "2 slow clients (1 byte/s): requests and probes answered",
        outcomes != [] and good / len(outcomes) >= 0.99 and not failures and not slow.cut,
        f"{good}/{len(outcomes)} HTTP 200, probe failures {failures[:2]}, slow bytes sent {slow.bytes_sent}",
    )


OVERLOAD_MAX_CONNECTIONS = 400
"""Threads of the test's closed loop at most (each waits on its socket: no CPU while it waits)."""


def overload(pod: Pod, running: Running, request: pod_load.Request) -> None:
    settings = tomllib.loads(next(d for d in pod.docs if d["kind"] == "ConfigMap")["data"]["onnxpool.toml"])
    max_queue = settings["limits"]["max_queue_ms"] / 1000
    single = [pod_load.send("127.0.0.1", running.port, request) for _ in range(10)]
    service = pod_load.percentile([o.seconds for o in single], 0.5)
    # Past the shedding limit on any CPU: a closed loop of N connections queues about N x service per
    # worker, so N is set from the service time just measured (4x the queue limit with one worker, 2x
    # with two), never fewer than 32. A fixed 32 queued only ~0.11 s on a fast CPU: nothing to shed.
    connections = min(OVERLOAD_MAX_CONNECTIONS, max(32, math.ceil(4 * max_queue / service)))
    watches = watching(pod, running)
    try:
        for watch in watches:
            watch.__enter__()
        outcomes = pod_load.closed_loop("127.0.0.1", running.port, request, connections=connections, seconds=5.0)
    finally:
        for watch in watches:
            watch.__exit__()
    v = pod_load.overload(outcomes, watches, max_queue, service)
    record(
        "overload: shed with Retry-After, probes green, served p99 bounded",
        v.ok,
        f"{connections} connections (service {service * 1000:.1f} ms): {len(v.served)} served "
        f"(p99 {v.p99 * 1000:.0f} ms, bound {v.bound * 1000:.0f} ms), {len(v.shed)} shed, "
        f"{len(v.other)} other, probe failures {v.failures[:2]}",
    )


def drain_like_pod(pod: Pod, tag: str, workdir: Path) -> None:
    """A slow model (tests/slow_model.py) mounted in: `podman pod stop` during requests loses none."""
    from tests.slow_model import build_slow_model, infer_body, server_settings  # needs onnx (dev extra)

    folder = workdir / "slow"
    folder.mkdir()
    os.chmod(folder, 0o755)
    model = build_slow_model(folder / "slow.onnx")
    os.chmod(model, 0o644)
    settings = {**server_settings(Path("/slow/slow.onnx")), "ONNXPOOL_LIMITS__MAX_QUEUE_MS": "0"}
    extra = ["-v", f"{folder}:/slow:ro", *(arg for k, v in settings.items() for arg in ("-e", f"{k}={v}"))]
    running = start_pod(pod, tag, workdir, {APP: extra})
    if running is None:
        return
    try:
        if not record("slow model ready", running.ready_after > 0, f"{running.ready_after:.1f} s"):
            dump_logs(running)
            return
        path = f"/v2/models/{settings['ONNXPOOL_MODEL__NAME']}/infer"
        json_type = {"Content-Type": "application/json"}

        def infer(iterations: int) -> pod_load.Request:
            return ("POST", path, json.dumps(infer_body(iterations)).encode(), json_type)

        t0 = time.monotonic()
        pod_load.send("127.0.0.1", running.port, infer(200_000), timeout=60)
        iterations = int(4.0 / max(1e-8, (time.monotonic() - t0) / 200_000))
        answer: dict[str, pod_load.Outcome] = {}
        stop = threading.Event()
        loop: list[pod_load.Outcome] = []

        def long_one() -> None:
            answer["inference"] = pod_load.send("127.0.0.1", running.port, infer(iterations), timeout=pod.grace)

        def short_loop() -> None:
            loop.extend(pod_load.closed_loop("127.0.0.1", running.port, infer(1000), 2, pod.grace, stop))

        threads = [threading.Thread(target=f, daemon=True) for f in (long_one, short_loop)]
        for thread in threads:
            thread.start()
        time.sleep(1.0)  # inside onnxruntime by now
        stop.set()  # no new requests from here (the endpoint is gone after preStop); in-flight ones go on
        t_stop = time.monotonic()
        ok, detail = stop_pod(pod, running)
        for thread in threads:
            thread.join(pod.grace)
        inference = answer.get("inference")
        lost = [o for o in loop if o.status != 200]
        good = ok and inference is not None and inference.status == 200 and bool(loop) and not lost
        record(
            "podman stop of both containers at once during requests: 0 lost",
            good,
            f"4 s inference HTTP {inference.status if inference else None} "
            f"{(inference.seconds if inference else 0) - (t_stop - t0):.1f} s; short loop {len(loop)} in flight, "
            f"{len(lost)} lost; {detail}",
        )
        if not good:
            dump_logs(running)
    finally:
        remove_pod(running)


# --- the zoo pod: one container per model, the kubelet's restarts played by `podman start` ----------


def container_pid(cid: str) -> int:
    return int(run([*PODMAN, "inspect", "-f", "{{.State.Pid}}", cid], capture_output=True).stdout.strip() or 0)


def cgroup_cpu_weight(pid: int) -> str:
    """The cpu weight the kernel applies to process `pid`'s cgroup, read from /proc and /sys (v1 cpu.shares,
    v2 cpu.weight)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return "?"
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(",") and controllers:
            folder = Path("/sys/fs/cgroup") / controllers.replace("cpuacct,cpu", "cpu,cpuacct") / path.lstrip("/")
            for name in ("cpu.shares",):
                with contextlib.suppress(OSError):
                    return f"cpu.shares {(folder / name).read_text().strip()}"
        if controllers == "":
            with contextlib.suppress(OSError):
                return f"cpu.weight {(Path('/sys/fs/cgroup') / path.lstrip('/') / 'cpu.weight').read_text().strip()}"
    return "?"


def zoo_states(running: Running) -> dict[str, str]:
    status, body = http("GET", running.base + "/v2/models", timeout=5)
    if status != 200:
        return {}
    return {m["name"]: m.get("state", "") for m in json.loads(body).get("models", [])}


def serve_like_zoo(tag: str) -> None:
    """The zoo overlay as a podman pod: a container per model with its cpu request as its cgroup weight,
    the routes, the front door; kill -9 of one model's container during a loop on another loses nothing."""
    dep, docs = rendered_pod("zoo")
    spec = dep["spec"]["template"]["spec"]
    models = {c["name"]: c for c in spec["containers"] if c["name"].startswith("model-")}
    startup = max(c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] for c in models.values())
    pod = Pod(dep=dep, docs=docs, budget=startup, grace=float(spec["terminationGracePeriodSeconds"]), layout="unpinned")
    with tempfile.TemporaryDirectory(prefix="onnxpool-ci-zoo-") as tmp:
        workdir = Path(tmp)
        os.chmod(workdir, 0o755)
        running = start_pod(pod, tag, workdir)
        if running is None:
            return
        try:
            _zoo_checks(pod, running, models)
        finally:
            remove_pod(running)


def _zoo_checks(pod: Pod, running: Running, models: dict[str, dict[str, Any]]) -> None:
    ready = running.ready_after
    if not record("zoo: ready through the front door within the startup budget", ready > 0,
                  f"{ready:.1f} s of {pod.budget:g} s; states {zoo_states(running)}"):  # fmt: skip
        dump_logs(running)
        return
    weights = {}
    for name, c in models.items():
        shares = cpu_shares(str(c["resources"]["requests"]["cpu"]))
        # cgroup v2: runc's conversion of shares to cpu.weight.
        want = {f"cpu.shares {shares}", f"cpu.weight {1 + ((shares - 2) * 9999) // 262142}"}
        weights[name] = (shares, cgroup_cpu_weight(container_pid(running.cids[name])), want)
    record("zoo: each model's container has its cpu request as its cgroup weight",
           all(got in want for _, got, want in weights.values()),
           "; ".join(f"{n}: request -> {w}, kernel: {g}" for n, (w, g, _) in weights.items()))  # fmt: skip
    payload, ctype = multipart("image", CAT)
    status, body = http("POST", running.base + "/predict", payload, {"Content-Type": ctype}, timeout=30)
    iris = json.dumps({"instances": [[5.1, 3.5, 1.4, 0.2]]}).encode()
    json_type = {"Content-Type": "application/json"}
    iris_status, iris_body = http("POST", running.base + "/v1/models/iris:predict", iris, json_type, timeout=10)
    record("zoo: a cat (efficientnet-lite0) and a setosa (iris) through the front door",
           status == 200 and b"cat" in body.lower() and iris_status == 200 and b"setosa" in iris_body.lower(),
           f"/predict HTTP {status}, iris HTTP {iris_status} {iris_body[:80]!r}")  # fmt: skip
    grpc_infer(running, "iris", "input", (1, 4), "probabilities", "zoo: ")
    request: pod_load.Request = ("POST", "/predict", payload, {"Content-Type": ctype, "Cache-Control": "no-store"})
    stop = threading.Event()
    loop: list[pod_load.Outcome] = []
    looping = threading.Thread(
        target=lambda: loop.extend(pod_load.closed_loop("127.0.0.1", running.port, request, 2, 120.0, stop)),
        daemon=True,
    )
    looping.start()
    time.sleep(2.0)
    victim = running.cids["model-iris"]
    os.kill(container_pid(victim), signal.SIGKILL)  # the container's pid 1: the container dies with it
    seen: list[str] = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < 20 and (not seen or seen[-1] == "READY"):
        seen.append(zoo_states(running).get("iris", "?"))
        time.sleep(0.1)
    restarted = run([*PODMAN, "start", victim], capture_output=True)  # the kubelet's restart
    back = False
    while time.monotonic() - t0 < 120 and not back:
        state = zoo_states(running).get("iris", "?")
        if state != seen[-1]:
            seen.append(state)
        back = state == "READY" and http("POST", running.base + "/v1/models/iris:predict", iris, json_type)[0] == 200
        time.sleep(0.2)
    time.sleep(2.0)  # the loop goes on after the restart too
    stop.set()
    looping.join(60)
    failed = [o for o in loop if o.status != 200]
    record("zoo: kill -9 of iris's container during a loop on efficientnet-lite0: 0 failed, iris back",
           bool(loop) and not failed and back and restarted.returncode == 0,
           f"loop {len(loop) - len(failed)} / {len(loop)} answered, {len(failed)} failed "
           f"{[o.status for o in failed][:5]}; iris {' -> '.join(seen)}")  # fmt: skip
    t1 = time.monotonic()
    stopped = run([*PODMAN, "stop", "-t", str(int(pod.grace)), *running.cids.values()], capture_output=True)
    took = time.monotonic() - t1
    codes = {n: run([*PODMAN, "inspect", "-f", "{{.State.ExitCode}}", cid], capture_output=True).stdout.strip()
             for n, cid in running.cids.items()}  # fmt: skip
    ok = stopped.returncode == 0 and set(codes.values()) == {"0"} and took < pod.grace
    record("zoo: clean stop (every container at once)", ok, f"exit codes {codes} after {took:.1f} s")
    if not all(good for name, good, _ in results if name.startswith("zoo")):
        dump_logs(running)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--overlay", default="shared", help="deploy/k8s/overlays/NAME to run the image like")
    parser.add_argument("--tag", default="localhost/onnxpool:ci")
    parser.add_argument("--until", choices=["base", "build", "run"], default="run")
    parser.add_argument("--rebuild-base", action="store_true", help="make the base rootfs again")
    parser.add_argument("--zoo-only", action="store_true", help="after the build, run only the zoo pod")
    opts = parser.parse_args()
    missing = [tool for tool in ("podman", "runc", "mmdebstrap") if not shutil.which(tool)]
    if missing:
        print(f"missing {missing}: apt-get install podman runc mmdebstrap uidmap", file=sys.stderr)
        return 2
    os.chdir(REPO)
    # The pod's infra (pause) container takes no --ulimit, and runc cannot start it with
    # podman's default rlimits here: the same limits as --ulimit, as containers.conf defaults.
    conf = Path(tempfile.mkdtemp(prefix="onnxpool-ci-conf-")) / "containers.conf"
    limits = ulimits()[1::2]
    conf.write_text(f'[containers]\ndefault_ulimits = {json.dumps(limits)}\n[engine]\nruntime = "runc"\n')
    os.environ["CONTAINERS_CONF"] = str(conf)
    t0 = time.monotonic()
    ok = ensure_base(default_base(), opts.rebuild_base)
    if ok and opts.until != "base":
        logfile = Path(tempfile.gettempdir()) / "onnxpool-ci-image-build.log"
        ok = build(opts.tag, logfile)
        if ok and opts.until == "run":
            if not opts.zoo_only:
                run_like_pod(opts.tag, opts.overlay)
            serve_like_zoo(opts.tag)
    passed = sum(1 for _, good, _ in results if good)
    failed = len(results) - passed
    log(f"total {time.monotonic() - t0:.1f} s")
    print(f"ci-image: {passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
