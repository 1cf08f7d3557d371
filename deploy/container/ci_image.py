#!/usr/bin/env python3
"""Build the real onnxpool image and run it the way the pod runs it, with no registry.

CI runs this after `make test` (as root):  .venv/bin/python deploy/container/ci_image.py

1. Base image: the Dockerfile's default BASE_IMAGE (debian:bookworm-slim) is made
   here, from this machine's apt sources, with `mmdebstrap --variant=minbase`
   and `podman import`ed under that SAME name, so the Dockerfile is built
   unchanged with `--pull=never`. Reused when already imported (and the rootfs
   tarball is cached in $ONNXPOOL_CI_CACHE, default /var/cache/onnxpool-ci).
2. `podman build --pull=never` of the Dockerfile; the host CA bundle, when
   present, is given to pip as a build secret (never a layer).
3. `podman run` like the rendered Deployment (kubectl kustomize of an overlay,
   default `shared`): its command, args and env, its numeric uid/gid,
   `--read-only` with tmpfs ONLY at its emptyDir paths, its ConfigMap files
   mounted read-only, `--cpus` = limits.cpu, `--memory` = limits.memory, all
   capabilities dropped, no-new-privileges. Then: start-up within the startup
   probe's budget, both probes, /metrics, one /predict of a cat photo, the
   layout line ("cpu: unpinned" / "cpu: pinned", per the overlay's
   onnxpool.io/cpu-layout), and a clean stop. Then once more with a slow model
   (tests/slow_model.py) mounted in: `podman stop` during a ~4 s inference
   must let it finish (200) and exit 0 within terminationGracePeriodSeconds.

Known snags of this host handled here: podman's default crun refuses the
hybrid cgroup setup, so runc is used (`podman --runtime runc`); runc cannot
raise rlimits above the caller's hard limits (nor RLIMIT_NPROC above
kernel.pid_max, seen here), so --ulimit values are read from this process.
Exit status 0 only if every check passed; the last line is "N passed, N failed".
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("ONNXPOOL_CI_CACHE", "/var/cache/onnxpool-ci"))
CAT = REPO / "models" / "samples" / "chelsea-cat.jpg"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
PODMAN = ["podman", "--runtime", "runc"]
# What debian:*-slim leaves out (docs, man pages, locales), kept out of the rootfs too.
SLIM_DPKG = [
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/info/*",
]

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


def apt_sources() -> str:
    """This machine's apt sources file (deb822 preferred), for mmdebstrap."""
    for pattern in ("/etc/apt/sources.list.d/*.sources", "/etc/apt/sources.list"):
        for path in sorted(glob.glob(pattern)):
            if "deb.debian.org" in Path(path).read_text(encoding="utf-8") or "debian" in path:
                return path
    sys.exit("no Debian apt sources found in /etc/apt")


def ensure_base(base: str, rebuild: bool) -> bool:
    image = qualified(base)
    if not rebuild and run([*PODMAN, "image", "exists", image]).returncode == 0:
        return record("base image", True, f"{image} already imported (reused)")
    suite = base.rsplit(":", 1)[1].split("-")[0] if ":" in base else "bookworm"
    CACHE.mkdir(parents=True, exist_ok=True)
    tarball = CACHE / f"{suite}-minbase.tar"
    t0 = time.monotonic()
    if rebuild or not tarball.exists():
        partial = tarball.with_suffix(".partial.tar")
        cmd = ["mmdebstrap", "--variant=minbase", "--quiet"]
        cmd += [f"--dpkgopt={opt}" for opt in SLIM_DPKG]
        # The sources file as the mirror argument: never read from stdin (CI has none).
        cmd += [suite, str(partial), apt_sources()]
        proc = run(cmd, capture_output=True)
        if proc.returncode != 0:
            return record("base rootfs (mmdebstrap)", False, proc.stderr[-2000:])
        partial.rename(tarball)
        record("base rootfs (mmdebstrap)", True, f"{tarball} in {time.monotonic() - t0:.1f} s")
    t1 = time.monotonic()
    proc = run([*PODMAN, "import", "--change", 'CMD ["bash"]', str(tarball), image], capture_output=True)
    if proc.returncode != 0:
        return record("base image (podman import)", False, proc.stderr[-2000:])
    return record("base image (podman import)", True, f"{image} in {time.monotonic() - t1:.1f} s")


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def podman_run_args(
    dep: dict[str, Any], docs: list[dict[str, Any]], tag: str, workdir: Path, port: int, extra: list[str] | None = None
) -> list[str]:
    spec = dep["spec"]["template"]["spec"]
    c = spec["containers"][0]
    sc = {**spec.get("securityContext", {}), **c.get("securityContext", {})}
    uid, gid = sc["runAsUser"], sc.get("runAsGroup", sc["runAsUser"])
    args = ["run", "-d", "--name", f"onnxpool-ci-{uuid.uuid4().hex[:8]}", *ulimits()]
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
    if "memory" in limits:
        args += ["--memory", memory(str(limits["memory"]))]
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    configmaps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    for m in c.get("volumeMounts", []):
        vol = volumes[m["name"]]
        if "emptyDir" in vol:
            size = memory(str(vol["emptyDir"].get("sizeLimit", "256Mi")))
            # An emptyDir is empty and writable by the pod's uid/fsGroup. podman 4.3 gives a
            # tmpfs the image folder's mode (0700 here) and root as owner, ignoring mode=;
            # `U` chowns it to the --user, which is what the pod's fsGroup amounts to.
            args += ["--tmpfs", f"{m['mountPath']}:rw,size={size},mode=1777,U"]
        elif "configMap" in vol:
            folder = workdir / m["name"]
            folder.mkdir(exist_ok=True)
            for key, value in configmaps[vol["configMap"]["name"]].get("data", {}).items():
                (folder / key).write_text(value, encoding="utf-8")
            args += ["-v", f"{folder}:{m['mountPath']}:ro"]
        else:
            sys.exit(f"volume {m['name']}: only emptyDir and configMap are emulated")
    for e in c.get("env", []):
        args += ["-e", f"{e['name']}={e['value']}"]
    container_port = next(p["containerPort"] for p in c["ports"] if p.get("name") == "http")
    args += ["-p", f"127.0.0.1:{port}:{container_port}"]
    command = c.get("command")
    if command:
        args += ["--entrypoint", json.dumps(command)]
    return [*args, *(extra or []), tag, *c.get("args", [])]


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


def start_container(pod: Pod, tag: str, workdir: Path, extra: list[str] | None = None) -> tuple[str, str, float]:
    """`podman run` like the pod; returns (container id or "", base URL, seconds until ready or 0)."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    args = podman_run_args(pod.dep, pod.docs, tag, workdir, port, extra)
    log("$ podman " + " ".join(args))
    t0 = time.monotonic()
    started = run([*PODMAN, *args], capture_output=True)
    if started.returncode != 0:
        record("podman run", False, started.stderr[-2000:])
        return "", base, 0.0
    cid = started.stdout.strip()
    while time.monotonic() - t0 < pod.budget:
        if http("GET", base + "/v2/health/ready", timeout=2)[0] == 200:
            return cid, base, time.monotonic() - t0
        state = run([*PODMAN, "inspect", "-f", "{{.State.Running}}", cid], capture_output=True).stdout
        if state.strip() == "false":
            break
        time.sleep(0.2)
    return cid, base, 0.0


def container_log(cid: str) -> str:
    out = run([*PODMAN, "logs", cid], capture_output=True)
    return out.stdout + out.stderr


def stop_container(pod: Pod, cid: str) -> tuple[bool, str]:
    """`podman stop` with the pod's grace period: (exited 0 in time after handling SIGTERM, detail)."""
    t1 = time.monotonic()
    stop = run([*PODMAN, "stop", "-t", str(int(pod.grace)), cid], capture_output=True)
    took = time.monotonic() - t1
    code = run([*PODMAN, "inspect", "-f", "{{.State.ExitCode}}", cid], capture_output=True).stdout.strip()
    drained = "Handling signal: term" in container_log(cid)
    ok = stop.returncode == 0 and code == "0" and took < pod.grace and drained
    return ok, f"exit {code} after {took:.1f} s (grace {pod.grace:g} s), SIGTERM handled: {drained}"


def run_like_pod(tag: str, overlay: str) -> None:
    dep, docs = rendered_pod(overlay)
    spec = dep["spec"]["template"]["spec"]
    startup = spec["containers"][0]["startupProbe"]
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
        serve_like_pod(pod, tag, workdir)
        drain_like_pod(pod, tag, workdir)


def serve_like_pod(pod: Pod, tag: str, workdir: Path) -> None:
    """The demo model: start-up time, probes, /metrics, a cat, the layout line, a clean stop."""
    cid, base, ready = start_container(pod, tag, workdir)
    if not cid:
        return
    try:
        record("ready within the startup probe budget", ready > 0, f"{ready:.1f} s of {pod.budget:g} s")
        if ready:
            record("GET /v2/health/live", http("GET", base + "/v2/health/live")[0] == 200)
            status, body = http("GET", base + "/metrics")
            record("GET /metrics", status == 200 and b"# TYPE" in body, f"HTTP {status}, {len(body)} bytes")
            payload, ctype = multipart("image", CAT)
            status, body = http("POST", base + "/predict", payload, {"Content-Type": ctype}, timeout=30)
            record(
                "POST /predict (cat photo)", status == 200 and b"cat" in body.lower(), f"HTTP {status} {body[:200]!r}"
            )
        text = container_log(cid)
        want = f"cpu: {pod.layout}"
        line = next((ln for ln in text.splitlines() if "cpu: " in ln), "")
        record(f"layout line '{want}'", want in line, line[:300])
        ok, detail = stop_container(pod, cid)
        record("clean stop on podman stop", ok, detail)
        if not all(good for _, good, _ in results):
            log("container log:\n" + container_log(cid)[-6000:])
    finally:
        run([*PODMAN, "rm", "-f", cid], capture_output=True)


def drain_like_pod(pod: Pod, tag: str, workdir: Path) -> None:
    """A slow model (tests/slow_model.py) mounted in: `podman stop` during a ~4 s inference must finish it."""
    sys.path.insert(0, str(REPO))
    from tests.slow_model import build_slow_model, infer_body, server_settings  # needs onnx (dev extra)

    folder = workdir / "slow"
    folder.mkdir()
    os.chmod(folder, 0o755)
    model = build_slow_model(folder / "slow.onnx")
    os.chmod(model, 0o644)
    settings = server_settings(Path("/slow/slow.onnx"))
    extra = ["-v", f"{folder}:/slow:ro", *(arg for k, v in settings.items() for arg in ("-e", f"{k}={v}"))]
    cid, base, ready = start_container(pod, tag, workdir, extra)
    if not cid:
        return
    try:
        if not record("slow model ready", ready > 0, f"{ready:.1f} s"):
            log("container log:\n" + container_log(cid)[-6000:])
            return
        url = base + f"/v2/models/{settings['ONNXPOOL_MODEL__NAME']}/infer"
        json_type = {"Content-Type": "application/json"}
        t0 = time.monotonic()
        http("POST", url, json.dumps(infer_body(200_000)).encode(), json_type, timeout=60)
        iterations = int(4.0 / max(1e-8, (time.monotonic() - t0) / 200_000))
        answer: dict[str, Any] = {}

        def slow_request() -> None:
            body = json.dumps(infer_body(iterations)).encode()
            answer["status"], _ = http("POST", url, body, json_type, timeout=pod.grace)
            answer["done"] = time.monotonic()

        client = threading.Thread(target=slow_request)
        client.start()
        time.sleep(1.0)  # inside onnxruntime by now
        t_stop = time.monotonic()
        ok, detail = stop_container(pod, cid)
        client.join(pod.grace)
        in_flight = answer.get("done", 0.0) > t_stop
        record(
            "drain on podman stop (request in flight)",
            ok and in_flight and answer.get("status") == 200,
            f"HTTP {answer.get('status')} {answer.get('done', t_stop) - t_stop:.1f} s after stop began; {detail}",
        )
        if not (ok and in_flight and answer.get("status") == 200):
            log("container log:\n" + container_log(cid)[-6000:])
    finally:
        run([*PODMAN, "rm", "-f", cid], capture_output=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--overlay", default="shared", help="deploy/k8s/overlays/NAME to run the image like")
    parser.add_argument("--tag", default="localhost/onnxpool:ci")
    parser.add_argument("--until", choices=["base", "build", "run"], default="run")
    parser.add_argument("--rebuild-base", action="store_true", help="make the base rootfs again")
    opts = parser.parse_args()
    missing = [tool for tool in ("podman", "runc", "mmdebstrap") if not shutil.which(tool)]
    if missing:
        print(f"missing {missing}: apt-get install podman runc mmdebstrap uidmap", file=sys.stderr)
        return 2
    os.chdir(REPO)
    t0 = time.monotonic()
    ok = ensure_base(default_base(), opts.rebuild_base)
    if ok and opts.until != "base":
        logfile = Path(tempfile.gettempdir()) / "onnxpool-ci-image-build.log"
        ok = build(opts.tag, logfile)
        if ok and opts.until == "run":
            run_like_pod(opts.tag, opts.overlay)
    passed = sum(1 for _, good, _ in results if good)
    failed = len(results) - passed
    log(f"total {time.monotonic() - t0:.1f} s")
    print(f"ci-image: {passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
