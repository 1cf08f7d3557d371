"""Static checks of deploy/k8s: every overlay renders with `kubectl kustomize`,
validates strictly (unknown fields are errors) against the oldest and newest
Kubernetes versions we support, and holds the semantics onnxpool relies on.

Each semantic check is a function returning a list of problems; it runs on
every real overlay (no problems allowed) and on a broken fixture under
tests/fixtures/k8s/ (it must find the problem), so each check is shown able
to fail.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from tests.k8s_render import (
    ALL_OVERLAYS,
    APP_OVERLAYS,
    CRD_KINDS,
    FIXTURES,
    K8S,
    K8S_VERSIONS,
    OVERLAYS,
    REPO,
    RenderError,
    bytes_quantity,
    container,
    cpu_quantity,
    env_of,
    in_ci,
    need_tool,
    objects,
    one,
    render,
)

if TYPE_CHECKING:
    from onnxpool.config.settings import Settings

Docs = list[dict[str, Any]]


# Measured (deployment.yaml's comments): RSS of the gunicorn master and of one
# worker with the demo model, rounded up. Memory limits must cover them plus a
# memory-backed emptyDir's sizeLimit (tmpfs pages count against the limit).
MASTER_MEMORY = 96 * 2**20
WORKER_MEMORY = 160 * 2**20
HEALTH_LIVE, HEALTH_READY = "/v2/health/live", "/v2/health/ready"
NGINX_LIVE = "/nginx/live"  # answered by nginx itself (config/nginx/onnxpool.conf.template)
APP, PROXY = "onnxpool", "nginx"  # the pod's two containers
DEFAULT_GRACEFUL_TIMEOUT = 30
DEFAULT_TIMEOUT = 30
DEFAULT_MAX_BODY_BYTES = 16777216
IMAGE_CONFIG = "/etc/onnxpool/onnxpool.toml"  # the Dockerfile's ENV ONNXPOOL_CONFIG


@cache
def rendered(directory: Path) -> Docs:
    return render(directory)


def overlay(name: str) -> Docs:
    return rendered(OVERLAYS / name)


def fixture(name: str) -> Docs:
    return rendered(FIXTURES / name)


def deployment(docs: Docs) -> dict[str, Any]:
    return one(docs, "Deployment")


def pod_labels(docs: Docs) -> dict[str, str]:
    labels: dict[str, str] = deployment(docs)["spec"]["template"]["metadata"].get("labels", {})
    return labels


def selects(selector: dict[str, str] | None, labels: dict[str, str]) -> bool:
    """A non-empty matchLabels selector that the labels satisfy."""
    return bool(selector) and all(labels.get(k) == v for k, v in (selector or {}).items())


def main_container(docs: Docs) -> str:
    """The container whose settings the checks read: onnxpool's, or in the zoo pod (no such container,
    one per model) the front door's, which reads the whole several-models file."""
    return APP if any(c["name"] == APP for c in containers(docs)) else PROXY


def config_path(docs: Docs) -> str:
    """The settings file the onnxpool container reads: `--config FILE`, else $ONNXPOOL_CONFIG, else the image's."""
    c = container(deployment(docs), main_container(docs))
    argv = [*c.get("command", []), *c.get("args", [])]
    for index, arg in enumerate(argv):
        if arg == "--config" and index + 1 < len(argv):
            return str(argv[index + 1])
        if arg.startswith("--config="):
            return str(arg.split("=", 1)[1])
    return env_of(c).get("ONNXPOOL_CONFIG", IMAGE_CONFIG)


def settings_text(docs: Docs) -> str | None:
    """The text of that file, when it is a key of a ConfigMap the container mounts (else None)."""
    dep = deployment(docs)
    path = config_path(docs)
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"].get("volumes", [])}
    configmaps = {cm["metadata"]["name"]: cm for cm in objects(docs, "ConfigMap")}
    for mount in container(dep, main_container(docs)).get("volumeMounts", []):
        source = volumes.get(mount["name"], {}).get("configMap")
        folder = mount["mountPath"].rstrip("/") + "/"
        if source and path.startswith(folder) and "subPath" not in mount:
            data = configmaps.get(source["name"], {}).get("data", {})
            if path[len(folder) :] in data:
                return str(data[path[len(folder) :]])
    return None


def settings_toml(docs: Docs) -> dict[str, Any]:
    """The settings file the onnxpool container reads, from the generated ConfigMap it mounts ({} if none)."""
    text = settings_text(docs)
    return tomllib.loads(text) if text is not None else {}


def setting(docs: Docs, section: str, key: str, default: Any, name: str = "") -> Any:
    """A setting as container `name` sees it: its ONNXPOOL_<SECTION>__<KEY> env, else the ConfigMap's file."""
    env = env_of(container(deployment(docs), name or main_container(docs)))
    if f"ONNXPOOL_{section.upper()}__{key.upper()}" in env:
        return env[f"ONNXPOOL_{section.upper()}__{key.upper()}"]
    return settings_toml(docs).get(section, {}).get(key, default)


def server_setting(docs: Docs, key: str, default: Any) -> Any:
    return setting(docs, "server", key, default)


def containers(docs: Docs) -> list[dict[str, Any]]:
    return list(deployment(docs)["spec"]["template"]["spec"]["containers"])


def shared_empty_dirs(docs: Docs) -> list[str]:
    """Mount paths of emptyDirs both containers mount writable at the same path."""
    spec = deployment(docs)["spec"]["template"]["spec"]
    empty = {v["name"] for v in spec.get("volumes", []) if "emptyDir" in v}
    mounts = [
        {(m["name"], m["mountPath"]) for m in c.get("volumeMounts", []) if m["name"] in empty and not m.get("readOnly")}
        for c in containers(docs)
    ]
    both = set.intersection(*mounts) if mounts else set()
    return [path for _, path in both]


# ------------------------------------------------------------------ checks


def check_selectors(docs: Docs) -> list[str]:
    problems = []
    dep = deployment(docs)
    labels = pod_labels(docs)
    if not selects(dep["spec"]["selector"].get("matchLabels"), labels):
        problems.append("Deployment selector does not match its pod template labels")
    for svc in objects(docs, "Service"):
        if not selects(svc["spec"].get("selector"), labels):
            problems.append(f"Service {svc['metadata']['name']} selector {svc['spec'].get('selector')} != pod labels")
    for pdb in objects(docs, "PodDisruptionBudget"):
        if not selects(pdb["spec"].get("selector", {}).get("matchLabels"), labels):
            problems.append(f"PodDisruptionBudget {pdb['metadata']['name']} does not select the pods")
    for tsc in dep["spec"]["template"]["spec"].get("topologySpreadConstraints", []):
        if not selects(tsc.get("labelSelector", {}).get("matchLabels"), labels):
            problems.append(f"topologySpreadConstraint on {tsc['topologyKey']} does not select the pods")
    services = objects(docs, "Service")
    for sm in objects(docs, "ServiceMonitor"):
        wanted = sm["spec"].get("selector", {}).get("matchLabels")
        if not any(selects(wanted, s["metadata"].get("labels", {})) for s in services):
            problems.append(f"ServiceMonitor {sm['metadata']['name']} selects no Service")
    return problems


def check_ports(docs: Docs) -> list[str]:
    problems = []
    dep = deployment(docs)
    port_names = {p["name"]: p["containerPort"] for c in containers(docs) for p in c.get("ports", []) if "name" in p}
    port_numbers = set(port_names.values())

    def resolves(port: int | str) -> bool:
        return port in port_names if isinstance(port, str) else port in port_numbers

    for c in containers(docs):
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            port = c.get(probe, {}).get("httpGet", {}).get("port")
            if port is not None and not resolves(port):
                problems.append(f"{c['name']} {probe} port {port!r} is not a container port")
    services = objects(docs, "Service")
    nginx_ports = {p["name"] for p in container(dep, PROXY).get("ports", []) if "name" in p}
    for svc in services:
        for sp in svc["spec"].get("ports", []):
            target = sp.get("targetPort", sp["port"])
            if not resolves(target):
                problems.append(f"Service {svc['metadata']['name']} targetPort {sp.get('targetPort')!r} unresolved")
            elif target not in nginx_ports:
                problems.append(f"Service {svc['metadata']['name']} targetPort {target!r} bypasses nginx")
    service_ports = {s["metadata"]["name"]: s["spec"].get("ports", []) for s in services}
    for ing in objects(docs, "Ingress"):
        for rule in ing["spec"].get("rules", []):
            for path in rule.get("http", {}).get("paths", []):
                backend = path["backend"]["service"]
                ports = service_ports.get(backend["name"])
                wanted = backend["port"]
                if ports is None:
                    problems.append(f"Ingress backend Service {backend['name']} does not exist")
                elif not any(p.get("name") == wanted.get("name") or p["port"] == wanted.get("number") for p in ports):
                    problems.append(f"Ingress backend port {wanted} is not a port of Service {backend['name']}")
    for sm in objects(docs, "ServiceMonitor"):
        for ep in sm["spec"].get("endpoints", []):
            if not any(ep.get("port") == p.get("name") for ports in service_ports.values() for p in ports):
                problems.append(f"ServiceMonitor endpoint port {ep.get('port')!r} is not a named Service port")
    annotations = dep["spec"]["template"]["metadata"].get("annotations", {})
    if "prometheus.io/port" in annotations and int(annotations["prometheus.io/port"]) not in port_numbers:
        problems.append(f"prometheus.io/port {annotations['prometheus.io/port']} is not a container port")
    # gunicorn on a unix socket both containers share; nginx listens on its container port.
    for name in (APP, PROXY):
        bind = str(setting(docs, "server", "bind", "127.0.0.1:8000", name))
        if not (bind.startswith("unix:") and _under(bind[len("unix:") :], shared_empty_dirs(docs))):
            problems.append(f"{name}: server.bind {bind} is not a unix socket on an emptyDir both containers share")
    listen = str(setting(docs, "nginx", "listen", "80", PROXY))
    if int(listen.rsplit(":", 1)[-1]) not in {p["containerPort"] for p in container(dep, PROXY).get("ports", [])}:
        problems.append(f"nginx.listen {listen} is not a port of the nginx container")
    return problems


def _count(value: int | str, total: int, round_up: bool) -> int:
    if isinstance(value, str) and value.endswith("%"):
        share = int(value[:-1]) * total / 100
        return math.ceil(share) if round_up else math.floor(share)
    return int(value)


def check_hpa_pdb(docs: Docs) -> list[str]:
    problems = []
    dep = deployment(docs)
    hpas = objects(docs, "HorizontalPodAutoscaler")
    if not hpas:
        problems.append("no HorizontalPodAutoscaler")
    min_replicas = dep["spec"].get("replicas", 1)
    for hpa in hpas:
        ref = hpa["spec"]["scaleTargetRef"]
        if (ref.get("apiVersion"), ref["kind"], ref["name"]) != ("apps/v1", "Deployment", dep["metadata"]["name"]):
            problems.append(f"HPA targets {ref}, not Deployment {dep['metadata']['name']}")
        min_replicas = hpa["spec"].get("minReplicas", 1)
        if hpa["spec"]["maxReplicas"] < min_replicas:
            problems.append("HPA maxReplicas < minReplicas")
    pdbs = objects(docs, "PodDisruptionBudget")
    if not pdbs:
        problems.append("no PodDisruptionBudget")
    for pdb in pdbs:
        spec = pdb["spec"]
        if not selects(spec.get("selector", {}).get("matchLabels"), pod_labels(docs)):
            problems.append("PDB does not target the Deployment's pods")
        if "minAvailable" in spec:
            available = _count(spec["minAvailable"], min_replicas, round_up=True)
            allowed = min_replicas - available
        else:
            allowed = _count(spec.get("maxUnavailable", 0), min_replicas, round_up=True)
            available = min_replicas - allowed
        if allowed < 1:
            problems.append(f"PDB allows no disruption at {min_replicas} replicas: node drains would block")
        if available < 1:
            problems.append(f"PDB lets every one of {min_replicas} replicas go at once")
    return problems


def check_resources(docs: Docs) -> list[str]:
    """Requests/limits match the worker layout the overlay promises."""
    problems = []
    dep = deployment(docs)
    annotations = dep["spec"]["template"]["metadata"].get("annotations", {})
    layout, workers = annotations.get("onnxpool.io/cpu-layout"), annotations.get("onnxpool.io/workers")
    if layout not in ("pinned", "unpinned") or workers is None:
        return ["pod template lacks onnxpool.io/cpu-layout (pinned|unpinned) and onnxpool.io/workers"]
    for c in containers(docs):
        res = c.get("resources", {})
        req, lim = res.get("requests", {}), res.get("limits", {})
        if "cpu" not in lim or "memory" not in lim or "cpu" not in req or "memory" not in req:
            return [f"{c['name']}: cpu and memory requests and limits must all be set"]
        if layout == "pinned" and not all(str(req[k]) == str(lim[k]) for k in ("cpu", "memory")):
            problems.append(f"pinned needs Guaranteed QoS (every container): {c['name']} requests {req} limits {lim}")
    res = container(dep).get("resources", {})
    req, lim = res["requests"], res["limits"]
    cpu = cpu_quantity(lim["cpu"])
    guaranteed = all(str(req[k]) == str(lim[k]) for k in ("cpu", "memory"))
    whole = cpu == int(cpu)
    if layout == "pinned":
        if not (guaranteed and whole):
            problems.append(f"pinned needs Guaranteed QoS with whole CPUs: requests {req} limits {lim}")
        expected = int(cpu)
    else:
        if whole and guaranteed:
            problems.append("unpinned layout but whole-CPU Guaranteed resources (static CPU manager would pin)")
        expected = max(1, math.floor(cpu))
    if int(workers) != expected:
        problems.append(f"onnxpool.io/workers {workers} but limits.cpu {lim['cpu']} gives {expected} ({layout})")
    tmpfs = sum(
        bytes_quantity(v["emptyDir"].get("sizeLimit", 0))
        for v in dep["spec"]["template"]["spec"].get("volumes", [])
        if v.get("emptyDir", {}).get("medium") == "Memory"
    )
    need = MASTER_MEMORY + expected * WORKER_MEMORY + tmpfs
    if bytes_quantity(lim["memory"]) < need:
        problems.append(f"limits.memory {lim['memory']} < master + {expected} workers + tmpfs = {need >> 20}Mi")
    if bytes_quantity(req["memory"]) != bytes_quantity(lim["memory"]):
        problems.append("memory request != limit: a worker OOM-killed under node pressure restarts its model load")
    return problems


def _prestop_sleep(c: dict[str, Any]) -> int | None:
    command = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    sleep = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds")
    if sleep is None and len(command) == 2 and command[0].endswith("sleep"):
        sleep = int(command[1])
    return None if sleep is None else int(sleep)


def check_grace(docs: Docs) -> list[str]:
    problems = []
    spec = deployment(docs)["spec"]["template"]["spec"]
    sleeps = {c["name"]: _prestop_sleep(c) for c in containers(docs)}
    if None in sleeps.values():
        return [f"no preStop sleep in {sleeps}: requests still routed to a terminating pod get refused"]
    sleep = max(s for s in sleeps.values() if s is not None)
    graceful = int(server_setting(docs, "graceful_timeout", DEFAULT_GRACEFUL_TIMEOUT))
    grace = spec.get("terminationGracePeriodSeconds", 30)
    # nginx finishes within graceful_timeout, gunicorn waits for it and then drains within it.
    if not grace > sleep + 2 * graceful:
        problems.append(
            f"terminationGracePeriodSeconds {grace} <= preStop {sleep} + 2 x graceful_timeout {graceful} "
            "(nginx's graceful stop, then gunicorn's drain)"
        )
    timeout = int(server_setting(docs, "timeout", DEFAULT_TIMEOUT))
    for c in server_containers(docs):
        live = c.get("livenessProbe", {})
        # The earliest kill: the first failed probe's timeout, then failureThreshold - 1 more periods.
        live_budget = (live.get("failureThreshold", 3) - 1) * live.get("periodSeconds", 10) + live.get(
            "timeoutSeconds", 1
        )
        if live_budget <= timeout:
            problems.append(
                f"{c['name']}: liveness budget {live_budget}s <= server.timeout {timeout}s: "
                "kubelet kills before gunicorn"
            )
        start = c.get("startupProbe", {})
        if start.get("periodSeconds", 10) * start.get("failureThreshold", 3) < 20:
            problems.append(f"{c['name']}: startup budget under 20 s (10x the measured model load + warm-up)")
    return problems


MODEL_PREFIX = "model-"
"""The zoo pod's model containers: `model-<name>` serves [models.<name>]."""


def server_containers(docs: Docs) -> list[dict[str, Any]]:
    """The containers running gunicorn on a model: onnxpool's, or the zoo pod's model-<name> ones."""
    return [c for c in containers(docs) if c["name"] == APP or c["name"].startswith(MODEL_PREFIX)]


def _under(path: str, mounts: list[str]) -> bool:
    return any(path == m or path.startswith(m.rstrip("/") + "/") for m in mounts)


def check_writable(docs: Docs) -> list[str]:
    problems = []
    spec = deployment(docs)["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    toml = settings_toml(docs)
    for c in containers(docs):
        if c.get("securityContext", {}).get("readOnlyRootFilesystem") is not True:
            problems.append(f"{c['name']}: readOnlyRootFilesystem is not true")
        writable = []
        for m in c.get("volumeMounts", []):
            if m["name"] not in volumes:
                problems.append(f"volumeMount {m['name']} has no volume")
            elif "emptyDir" in volumes[m["name"]] and not m.get("readOnly"):
                writable.append(m["mountPath"])
        env = env_of(c)
        paths = {k: env.get(k, "") for k in ("TMPDIR", "HOME")}
        if env.get("ONNXPOOL_HOST_DIR"):
            paths["ONNXPOOL_HOST_DIR (the shared run folder)"] = env["ONNXPOOL_HOST_DIR"]
        if c["name"] == APP or c["name"].startswith(MODEL_PREFIX):
            paths["ONNXPOOL_SERVER__RUN_DIR"] = env.get("ONNXPOOL_SERVER__RUN_DIR", "")
            paths["metrics.dir"] = env.get("ONNXPOOL_METRICS__DIR", toml.get("metrics", {}).get("dir", ""))
            paths["server.pidfile"] = toml.get("server", {}).get("pidfile", "")
            paths["server.control_socket"] = toml.get("server", {}).get("control_socket", "")
            if not paths["ONNXPOOL_SERVER__RUN_DIR"]:
                problems.append("ONNXPOOL_SERVER__RUN_DIR unset: the server would write to the read-only root")
        elif c["name"] == PROXY and not env.get("ONNXPOOL_HOST_DIR"):
            paths["nginx.pidfile (and nginx's files beside it)"] = str(setting(docs, "nginx", "pidfile", "", c["name"]))
        for what, path in paths.items():
            if path and not _under(path, writable):
                problems.append(f"{c['name']}: {what} = {path} is not on a writable emptyDir ({writable})")
    return problems


def check_security(docs: Docs) -> list[str]:
    problems = []
    spec = deployment(docs)["spec"]["template"]["spec"]
    pod = spec.get("securityContext", {})
    for c in containers(docs):
        sc, name = c.get("securityContext", {}), c["name"]
        uid = sc.get("runAsUser", pod.get("runAsUser"))
        if not (sc.get("runAsNonRoot", pod.get("runAsNonRoot")) is True and isinstance(uid, int) and uid > 0):
            problems.append(f"{name}: not runAsNonRoot with a numeric non-zero uid (uid {uid!r})")
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation is not false")
        if sc.get("privileged"):
            problems.append(f"{name}: privileged")
        if "ALL" not in sc.get("capabilities", {}).get("drop", []) or sc.get("capabilities", {}).get("add"):
            problems.append(f"{name}: capabilities: must drop ALL and add none")
        seccomp = sc.get("seccompProfile", pod.get("seccompProfile", {}))
        if seccomp.get("type") != "RuntimeDefault":
            problems.append(f"{name}: seccompProfile is not RuntimeDefault")
    if spec.get("automountServiceAccountToken") is not False:
        problems.append("the pod mounts a service account token it never uses")
    if not spec.get("serviceAccountName") or not any(
        sa["metadata"]["name"] == spec["serviceAccountName"] for sa in objects(docs, "ServiceAccount")
    ):
        problems.append("serviceAccountName does not name the ServiceAccount shipped with it")
    return problems


def served_routes() -> set[str]:
    """Paths the app registers (route decorators in the package sources)."""
    routes = set()
    pattern = re.compile(r"""\.(?:get|post|route)\(\s*["'](/[^"']*)["']""")
    for py in REPO.rglob("*.py"):
        rel = py.relative_to(REPO).parts
        if rel[0] in ("tests", "deploy", "bench", ".venv", "build", "dist") or "site-packages" in rel:
            continue
        routes.update(pattern.findall(py.read_text(encoding="utf-8", errors="replace")))
    return routes


def nginx_own_paths() -> set[str]:
    """Exact locations the nginx site answers itself (`location = /path`)."""
    text = (REPO / "config" / "nginx" / "onnxpool.conf.template").read_text(encoding="utf-8")
    return set(re.findall(r"location = (/\S+) \{", text))


def check_probes(docs: Docs) -> list[str]:
    """gunicorn's own probes over its socket (exec); readiness through nginx (the whole path)."""
    problems = []
    routes = served_routes()
    app = container(deployment(docs), APP)
    bind = str(setting(docs, "server", "bind", "", APP))
    for probe, path in {"startupProbe": HEALTH_READY, "livenessProbe": HEALTH_LIVE}.items():
        command = app.get(probe, {}).get("exec", {}).get("command", [])
        if command[-3:] != ["onnxpool.probe", bind, path] or path not in routes:
            problems.append(f"{APP} {probe} {command!r}: expected `python -m onnxpool.probe {bind} {path}`")
    proxy = container(deployment(docs), PROXY)
    wanted = {"readinessProbe": (HEALTH_READY, routes), "livenessProbe": (NGINX_LIVE, nginx_own_paths())}
    for probe, (path, served) in wanted.items():
        got = proxy.get(probe, {}).get("httpGet", {}).get("path")
        if got != path:
            problems.append(f"{PROXY} {probe} path {got!r}, expected {path}")
        elif got not in served:
            problems.append(f"{PROXY} {probe} path {got} is not answered")
    return problems


def check_nginx(docs: Docs) -> list[str]:
    """The pod's nginx: `onnxpool nginx` from the same image, shedding on, gunicorn waiting for it."""
    problems = []
    app, proxy = container(deployment(docs), APP), container(deployment(docs), PROXY)
    if proxy.get("image") != app.get("image"):
        problems.append(f"nginx runs image {proxy.get('image')}, not onnxpool's {app.get('image')}")
    if [Path(a).name for a in proxy.get("command", [])] != ["onnxpool", "nginx"]:
        problems.append(f"nginx container command {proxy.get('command')} is not `onnxpool nginx`")
    pidfiles = {name: str(setting(docs, "nginx", "pidfile", "", name)) for name in (APP, PROXY)}
    if len(set(pidfiles.values())) != 1 or not pidfiles[APP]:
        problems.append(f"nginx.pidfile differs or is unset ({pidfiles}): gunicorn would not wait for nginx")
    elif not _under(pidfiles[APP], shared_empty_dirs(docs)):
        problems.append(f"nginx.pidfile {pidfiles[APP]} is not on an emptyDir both containers share")
    if int(setting(docs, "limits", "max_queue_ms", 0)) <= 0:
        problems.append("limits.max_queue_ms is off: an overloaded pod queues without bound")
    return problems


LOOPBACK = ("127.0.0.1", "localhost", "[::1]")


def check_grpc(docs: Docs) -> list[str]:
    """gRPC through the pod's nginx: the Service's port grpc reaches nginx's [nginx] grpc_listen, which passes
    to the workers' [server] grpc_bind on loopback (only nginx reaches them: quotas, X-Request-Start)."""
    problems = []
    proxy = container(deployment(docs), PROXY)
    port = next((p["containerPort"] for p in proxy.get("ports", []) if p.get("name") == "grpc"), None)
    listen = str(setting(docs, "nginx", "grpc_listen", "", PROXY))
    bind = str(setting(docs, "server", "grpc_bind", "", APP))
    targeted = [
        sp for svc in objects(docs, "Service") for sp in svc["spec"].get("ports", []) if sp.get("name") == "grpc"
    ]
    if port is None:
        return [f"Service port grpc targets no container port grpc of {PROXY}"] if targeted else []
    if listen.rpartition(":")[2] != str(port):
        problems.append(f"nginx.grpc_listen {listen!r} is not the container port grpc ({port})")
    host = bind.rpartition(":")[0]
    if not bind or host not in LOOPBACK:
        problems.append(f"server.grpc_bind {bind!r}: the workers' gRPC must be on loopback, behind nginx")
    if str(setting(docs, "server", "grpc_bind", "", PROXY)) != bind:
        problems.append("server.grpc_bind differs between the containers: nginx would pass gRPC elsewhere")
    for sp in targeted:
        if sp.get("targetPort") not in ("grpc", port) or sp.get("appProtocol") != "kubernetes.io/h2c":
            problems.append(f"Service port grpc {sp}: targetPort grpc, appProtocol kubernetes.io/h2c expected")
    if not targeted:
        problems.append("nginx serves gRPC but no Service port is named grpc")
    return problems


def check_scrape(docs: Docs) -> list[str]:
    annotations = deployment(docs)["spec"]["template"]["metadata"].get("annotations", {})
    scraped = annotations.get("prometheus.io/scrape") == "true" and annotations.get("prometheus.io/path") == "/metrics"
    monitors = objects(docs, "ServiceMonitor")
    if monitors and scraped:
        return ["both a ServiceMonitor and prometheus.io annotations: every pod scraped twice"]
    if not monitors and not scraped:
        return ["no prometheus.io/scrape annotations (path /metrics) and no ServiceMonitor"]
    if any(ep.get("path", "/metrics") != "/metrics" for m in monitors for ep in m["spec"].get("endpoints", [])):
        return ["ServiceMonitor path is not /metrics"]
    return []


def _nginx_size(text: str) -> int:
    match = re.fullmatch(r"(\d+)([kKmMgG]?)", text.strip())
    assert match, f"bad nginx size {text!r}"
    return int(match.group(1)) * {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}[match.group(2).lower()]


def check_ingress(docs: Docs) -> list[str]:
    problems = []
    body = int(server_setting(docs, "max_body_bytes", DEFAULT_MAX_BODY_BYTES))
    timeout = int(server_setting(docs, "timeout", DEFAULT_TIMEOUT))
    prefix = "nginx.ingress.kubernetes.io/"
    for ing in objects(docs, "Ingress"):
        ann = ing["metadata"].get("annotations", {})
        size = ann.get(prefix + "proxy-body-size")
        if size is None or _nginx_size(size) != body:
            problems.append(f"proxy-body-size {size!r} != server.max_body_bytes {body}")
        for key in ("proxy-read-timeout", "proxy-send-timeout"):
            if ann.get(prefix + key) != str(timeout):
                problems.append(f"{key} {ann.get(prefix + key)!r} != server.timeout {timeout}")
    return problems


MONITORING = REPO / "deploy" / "monitoring"


def check_monitoring(docs: Docs) -> list[str]:
    """With a ServiceMonitor come onnxpool's alerts and dashboard, as in deploy/monitoring/."""
    monitors = objects(docs, "ServiceMonitor")
    rules = objects(docs, "PrometheusRule")
    boards = [cm for cm in objects(docs, "ConfigMap") if cm["metadata"].get("labels", {}).get("grafana_dashboard")]
    if not monitors:
        return [] if not rules and not boards else ["alert rules or a dashboard without a ServiceMonitor"]
    problems = []
    if len(rules) != 1:
        problems.append(f"{len(rules)} PrometheusRules, expected onnxpool's one")
    wanted = yaml.safe_load((MONITORING / "onnxpool-rules.yml").read_text(encoding="utf-8"))
    for rule in rules:
        if rule["spec"] != wanted:
            problems.append(
                f"PrometheusRule {rule['metadata']['name']} differs from deploy/monitoring/onnxpool-rules.yml"
            )
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text(encoding="utf-8"))
    shipped = [json.loads(text) for cm in boards for text in cm.get("data", {}).values()]
    if shipped != [dashboard] or any(cm["metadata"]["labels"]["grafana_dashboard"] != "1" for cm in boards):
        problems.append('no ConfigMap labelled grafana_dashboard: "1" holding deploy/monitoring/grafana-dashboard.json')
    # The rules' up{job="onnxpool"}: a ServiceMonitor's job is the selected Service's name (no jobLabel).
    for sm in monitors:
        wanted_labels = sm["spec"].get("selector", {}).get("matchLabels")
        jobs = {
            s["metadata"]["name"]
            for s in objects(docs, "Service")
            if selects(wanted_labels, s["metadata"].get("labels", {}))
        }
        if sm["spec"].get("jobLabel") or jobs != {"onnxpool"}:
            problems.append(
                f"ServiceMonitor {sm['metadata']['name']} scrapes as job {jobs}: the alerts expect onnxpool"
            )
    return problems


# ------------------------------------------------------ several models: the zoo pod

# The zoo pod (overlays/zoo): the platform supervises. One container per model (`model-<name>`,
# `onnxpool serve` with $ONNXPOOL_POOL on a file with [models.<name>] tables), the host's routes
# (`onnxpool routes`) and the front door (`onnxpool nginx` on the same file), all sharing one run
# folder ($ONNXPOOL_HOST_DIR on an emptyDir). Measured (the 2-core VM): the host's routes (a gunicorn
# master and its worker) ~80 MiB RSS; the front door's watching process ~45 MiB beside nginx.
ROUTES_MEMORY = 128 * 2**20
FRONT_DOOR_MEMORY = 192 * 2**20
ROUTES = "routes"
IMAGE_MODELS = "/opt/onnxpool/models"  # the Dockerfile links the package's models/ folder here
DEFAULT_CACHE_BYTES = 64 * 2**20  # [cache] max_bytes
RELOAD_COPIES = 4  # a reload holds the old copy (mapped), the next one and the bytes it is made from
PROBE_MODULE = "onnxpool.probe"


def base_nginx() -> dict[str, Any]:
    """The base's nginx container: its resources are nginx's share of a pod."""
    return container(deployment(rendered(K8S / "base")), PROXY)


def model_containers(docs: Docs) -> dict[str, dict[str, Any]]:
    """The zoo pod's model containers, by the model they serve ($ONNXPOOL_POOL)."""
    return {env_of(c).get("ONNXPOOL_POOL", ""): c for c in containers(docs) if c["name"].startswith(MODEL_PREFIX)}


def mounted_volumes(docs: Docs, name: str = "") -> list[str]:
    """Mount paths of container `name`'s volumes that bring files in (not emptyDirs, not ConfigMaps)."""
    dep = deployment(docs)
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"].get("volumes", [])}
    return [
        m["mountPath"]
        for m in container(dep, name or main_container(docs)).get("volumeMounts", [])
        if not {"emptyDir", "configMap"} & set(volumes.get(m["name"], {}))
    ]


@cache
def _package_globs() -> tuple[list[str], list[str]]:
    """setup.cfg's package data globs of onnxpool.models (what the wheel, hence the image, carries)."""
    import configparser

    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")

    def globs(section: str) -> list[str]:
        raw = config[section].get("onnxpool.models", "") if config.has_section(section) else ""
        return [g.strip() for g in raw.split(",") if g.strip()]

    return globs("options.package_data"), globs("options.exclude_package_data")


def image_file(path: str) -> Path | None:
    """The checkout's copy of a file the image holds at `path` (under IMAGE_MODELS), else None."""
    from fnmatch import fnmatch

    linked = re.search(rf"ln -s .*\s{re.escape(IMAGE_MODELS)}\s", (REPO / "Dockerfile").read_text(encoding="utf-8"))
    if not linked or not path.startswith(IMAGE_MODELS + "/"):
        return None
    relative = path[len(IMAGE_MODELS) + 1 :]
    shipped, excluded = _package_globs()
    if not any(fnmatch(relative, g) for g in shipped) or any(fnmatch(relative, g) for g in excluded):
        return None
    found = REPO / "models" / relative
    return found if found.is_file() else None


def zoo_models(docs: Docs) -> dict[str, dict[str, Any]]:
    models: dict[str, dict[str, Any]] = settings_toml(docs).get("models", {})
    return models


def held_models(docs: Docs) -> tuple[dict[str, Path | None], list[str]]:
    """The models whose file their container has: name -> the checkout's copy (image) or None (a volume's)."""
    held: dict[str, Path | None] = {}
    problems = []
    served = model_containers(docs)
    for name, entry in zoo_models(docs).items():
        path = str(entry.get("path", ""))
        if name in served and _under(path, mounted_volumes(docs, served[name]["name"])):
            held[name] = None
        elif (copy := image_file(path)) is not None:
            held[name] = copy
        elif not entry.get("optional", False):
            problems.append(
                f"model {name}: {path} is neither in the image (package data at {IMAGE_MODELS}) nor on a volume "
                "of its container: it would never start (optional = true serves the others without it)"
            )
    return held, problems


def probe_command(c: dict[str, Any], probe: str) -> list[str]:
    return list(c.get(probe, {}).get("exec", {}).get("command", []))


def check_zoo_pod(docs: Docs) -> list[str]:
    """A container per model the pod holds, the routes, the front door on the pod's port; one shared folder."""
    problems = []
    dep = deployment(docs)
    names = [c["name"] for c in containers(docs)]
    held, _ = held_models(docs)
    served = model_containers(docs)
    wanted = {PROXY, ROUTES, *(MODEL_PREFIX + name for name in held)}
    if set(names) != wanted or len(names) != len(wanted):
        problems.append(f"containers {names}, expected {sorted(wanted)}: nginx, the routes and one per held model")
    path = config_path(docs)
    text = settings_text(docs)
    if text is None:
        return [*problems, f"settings file {path} is not a file of a ConfigMap the front door mounts"]
    if not zoo_models(docs):
        problems.append(f"{path} has no [models.<name>] tables: no several models to serve")
    host_dirs = {c["name"]: env_of(c).get("ONNXPOOL_HOST_DIR", "") for c in containers(docs)}
    if len(set(host_dirs.values())) != 1 or not next(iter(host_dirs.values())):
        problems.append(f"ONNXPOOL_HOST_DIR differs or is unset {host_dirs}: the containers share one run folder")
    host_dir = host_dirs.get(PROXY, "")
    if host_dir and not _under(host_dir, shared_empty_dirs(docs)):
        problems.append(f"ONNXPOOL_HOST_DIR {host_dir} is not on an emptyDir every container mounts")
    commands = {PROXY: ["onnxpool", "nginx"], ROUTES: ["onnxpool", "routes"]}
    for c in containers(docs):
        want = commands.get(c["name"], ["onnxpool", "serve"])
        if [Path(a).name for a in c.get("command", [])] != want:
            problems.append(f"{c['name']}: command {c.get('command')} is not `{' '.join(want)}`")
        argv = [*c.get("args", [])]
        config = argv[argv.index("--config") + 1] if "--config" in argv else env_of(c).get("ONNXPOOL_CONFIG")
        if config != path or env_of(c).get("ONNXPOOL_CONFIG", path) != path:
            problems.append(f"{c['name']}: reads {config}, not the file the front door routes by ({path})")
    from onnxpool.host.state import pool_socket

    problems += _load_problems(text, env_of(container(dep, PROXY)), pool="")
    for name, c in served.items():
        env = env_of(c)
        if c["name"] != MODEL_PREFIX + name:
            problems.append(f"{c['name']} serves {name!r} ($ONNXPOOL_POOL): name it {MODEL_PREFIX}{name}")
        if name not in zoo_models(docs):
            problems.append(f"{c['name']}: {name!r} is not a [models.<name>] of {path}")
            continue
        problems += [f"{c['name']}: {p}" for p in _load_problems(text, env, pool=name)]
        address = zoo_models(docs)[name].get("bind") or pool_socket(Path(host_dir), name)
        if env.get("ONNXPOOL_SERVER__BIND") != address:
            problems.append(
                f"{c['name']}: binds {env.get('ONNXPOOL_SERVER__BIND')}, the front door routes it to {address}"
            )
        pidfile = str(Path(host_dir) / "nginx" / "nginx.pid")
        if env.get("ONNXPOOL_NGINX__PIDFILE") != pidfile:
            problems.append(f"{c['name']}: nginx.pidfile is not {pidfile}: gunicorn would stop before nginx finished")
        metrics = env.get("ONNXPOOL_METRICS__DIR", "")
        if metrics != str(Path(host_dir) / "metrics" / name):
            problems.append(f"{c['name']}: metrics.dir {metrics!r} is not metrics/{name} of the shared folder "
                            "(one /metrics sums them)")  # fmt: skip
    http = {p["name"]: p["containerPort"] for p in container(dep, PROXY).get("ports", []) if "name" in p}.get("http")
    bind = str(setting(docs, "server", "bind", "127.0.0.1:8000", PROXY))
    host, _, port = bind.rpartition(":")
    if http is None:
        problems.append("the front door has no container port named http")
    elif bind.startswith("unix:") or not port.isdigit() or int(port) != http or host in ("127.0.0.1", "localhost"):
        problems.append(
            f"server.bind {bind} (the front door) is not the container port http ({http}) on the pod's network"
        )
    grpc = {p["name"]: p["containerPort"] for p in container(dep, PROXY).get("ports", []) if "name" in p}.get("grpc")
    grpc_bind = str(setting(docs, "server", "grpc_bind", "", PROXY))
    for svc in objects(docs, "Service"):
        for sp in svc["spec"].get("ports", []):
            target = sp.get("targetPort", sp["port"])
            if target in ("grpc", grpc) and grpc is not None:
                # The host's gRPC router (beside nginx) on the pod's network, on the port the Service targets.
                ghost, _, gport = grpc_bind.rpartition(":")
                if not gport.isdigit() or int(gport) != grpc or ghost in LOOPBACK:
                    problems.append(f"server.grpc_bind {grpc_bind!r} (the router) is not the container port grpc")
            elif target not in ("http", http):
                problems.append(
                    f"Service {svc['metadata']['name']} targetPort {sp.get('targetPort')!r} is not port http"
                )
    if grpc_bind:
        addresses = {name: str(entry.get("grpc_bind", "")) for name, entry in zoo_models(docs).items()}
        if "" in addresses.values() or len(set(addresses.values())) != len(addresses):
            problems.append(f"[models.<name>] grpc_bind {addresses}: the router needs each model's own address")
    annotations = dep["spec"]["template"]["metadata"].get("annotations", {})
    if "prometheus.io/port" in annotations and int(annotations["prometheus.io/port"]) != http:
        problems.append(
            f"prometheus.io/port {annotations['prometheus.io/port']} is not port http (the host's /metrics)"
        )
    return problems


def load_pod_settings(text: str, env: dict[str, str], pool: str | None = None) -> Settings:
    """Settings as onnxpool loads them in the container: its ONNXPOOL_* environment over the file's
    text (ConfigError if it refuses them). `pool` as load_settings takes it ("" = a host's view)."""
    import tempfile

    from onnxpool.config.loader import load_settings

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "settings.toml"
        path.write_text(text, encoding="utf-8")
        environ = {
            k: v for k, v in env.items() if k.startswith("ONNXPOOL_") and k not in ("ONNXPOOL_CONFIG", "ONNXPOOL_POOL")
        }
        return load_settings(path, environ=environ, pool=pool).settings


def _load_problems(text: str, env: dict[str, str], pool: str | None) -> list[str]:
    from onnxpool.config.loader import ConfigError

    try:
        load_pod_settings(text, env, pool)
    except ConfigError as exc:
        return [f"onnxpool refuses the settings: {exc}"]
    return []


def zoo_ceiling(docs: Docs) -> float:
    """What the zoo plans for in all: the budgets in its file + nginx's share (the base's)."""
    budgets = [
        float(b) for b in (e.get("cpus", "auto") for e in zoo_models(docs).values()) if isinstance(b, int | float)
    ]
    return sum(budgets) + cpu_quantity(base_nginx()["resources"]["requests"]["cpu"])


def check_zoo_resources(docs: Docs) -> list[str]:
    """Each model's container requests its budget and may use the zoo's whole CPU; memory and the run
    folder cover what each holds."""
    problems = []
    dep = deployment(docs)
    ceiling = zoo_ceiling(docs)
    entries = zoo_models(docs)
    workers = max(1, math.floor(ceiling))
    annotations = dep["spec"]["template"]["metadata"].get("annotations", {})
    if annotations.get("onnxpool.io/cpu-layout") != "unpinned" or ceiling == int(ceiling):
        problems.append(f"the zoo's cpu {ceiling:g}: each model's limit is a fractional quota, unpinned (annotated so)")
    if annotations.get("onnxpool.io/workers") != str(workers):
        problems.append(
            f"onnxpool.io/workers {annotations.get('onnxpool.io/workers')} but limits.cpu gives {workers} per model"
        )
    numbers = {n: float(e["cpus"]) for n, e in entries.items() if isinstance(e.get("cpus", "auto"), int | float)}
    if sum(numbers.values()) > workers + 1e-9:
        problems.append(f"the budgets sum to {sum(numbers.values()):g} > floor(limits.cpu) = {workers} usable cores")
    for c in containers(docs):
        res = c.get("resources", {})
        req, lim = res.get("requests", {}), res.get("limits", {})
        if not all(k in d for d in (req, lim) for k in ("cpu", "memory")):
            problems.append(f"{c['name']}: cpu and memory requests and limits must all be set")
            continue
        if bytes_quantity(req["memory"]) != bytes_quantity(lim["memory"]):
            problems.append(f"{c['name']}: memory request != limit")
    for name, c in model_containers(docs).items():
        res = c.get("resources", {})
        req, lim = res.get("requests", {}), res.get("limits", {})
        if "cpu" not in req or "cpu" not in lim or "memory" not in lim:
            continue
        if name not in numbers:
            problems.append(f"model {name}: cpus = {entries.get(name, {}).get('cpus', 'auto')!r}: its container's "
                            "cpu request needs its budget as a number")  # fmt: skip
        elif round(cpu_quantity(req["cpu"]) * 1000) != round(numbers[name] * 1000):
            problems.append(
                f"{c['name']}: requests.cpu {req['cpu']} is not its budget in {config_path(docs)} ({numbers[name]:g})"
            )
        if round(cpu_quantity(lim["cpu"]) * 1000) != round(ceiling * 1000):
            problems.append(
                f"{c['name']}: limits.cpu {lim['cpu']} is not the zoo's {ceiling:g} (its budgets + nginx's share): "
                "below it, idle cores are not lent; above it, a model could take the neighbours' planned share"
            )
        need = MASTER_MEMORY + workers * WORKER_MEMORY
        if bytes_quantity(lim["memory"]) < need:
            problems.append(
                f"{c['name']}: limits.memory {lim['memory']} < a master and {workers} workers = {need >> 20}Mi"
            )
    for name, need in ((ROUTES, ROUTES_MEMORY), (PROXY, FRONT_DOOR_MEMORY)):
        lim = container(dep, name).get("resources", {}).get("limits", {})
        if "memory" in lim and bytes_quantity(lim["memory"]) < need:
            problems.append(f"{name}: limits.memory {lim['memory']} < {need >> 20}Mi measured and counted")
    nginx_cpu = base_nginx()["resources"]["requests"]["cpu"]
    if str(container(dep, PROXY).get("resources", {}).get("requests", {}).get("cpu")) != str(nginx_cpu):
        problems.append(f"{PROXY}: requests.cpu is not nginx's share ({nginx_cpu}) the zoo's cpu counts")
    held, missing = held_models(docs)
    problems += missing
    spec = dep["spec"]["template"]["spec"]
    tmpfs = sum(
        bytes_quantity(v["emptyDir"].get("sizeLimit", 0))
        for v in spec.get("volumes", [])
        if v.get("emptyDir", {}).get("medium") == "Memory"
    )
    cache = settings_toml(docs).get("cache", {})
    cache_bytes = int(cache.get("max_bytes", DEFAULT_CACHE_BYTES)) if cache.get("enabled", True) else 0
    run_folder = sum(RELOAD_COPIES * copy.stat().st_size for copy in held.values() if copy is not None) + sum(
        cache_bytes for name in held if entries[name].get("cache", True)
    )
    if tmpfs < run_folder:
        problems.append(
            f"run folder sizeLimit {tmpfs >> 20}Mi < {RELOAD_COPIES} copies of each held model + their response "
            f"caches = {run_folder >> 20}Mi"
        )
    return problems


def check_zoo_probes(docs: Docs) -> list[str]:
    """Each model's container probed over its own socket (restarted alone); the pod's readiness through
    the front door (the readiness rule); nginx's own liveness; the routes' over their socket."""
    problems = []
    dep = deployment(docs)
    served, own = served_routes(), nginx_own_paths()
    proxy = container(dep, PROXY)
    for probe, path, answered in (("readinessProbe", HEALTH_READY, served), ("livenessProbe", NGINX_LIVE, own)):
        get = proxy.get(probe, {}).get("httpGet")
        if not get or get.get("port") not in ("http", 8000):
            problems.append(f"{PROXY} {probe}: not an httpGet probe through the front door (port http)")
        elif get.get("path") != path or path not in answered:
            problems.append(f"{PROXY} {probe} path {get.get('path')!r}, expected {path}")
    for c in model_containers(docs).values():
        bind = env_of(c).get("ONNXPOOL_SERVER__BIND", "")
        for probe, path in (("startupProbe", HEALTH_READY), ("livenessProbe", HEALTH_LIVE)):
            if probe_command(c, probe)[-3:] != [PROBE_MODULE, bind, path] or path not in served:
                problems.append(f"{c['name']} {probe} {probe_command(c, probe)!r}: expected "
                                f"`python -m {PROBE_MODULE} {bind} {path}` (its own socket)")  # fmt: skip
        if "readinessProbe" in c:
            problems.append(f"{c['name']}: a readinessProbe of its own would take every model out of the Service "
                            "for one (the front door's follows the readiness rule)")  # fmt: skip
    routes_socket = f"unix:{env_of(container(dep, ROUTES)).get('ONNXPOOL_HOST_DIR', '')}/routes.sock"
    if probe_command(container(dep, ROUTES), "livenessProbe")[-3:] != [PROBE_MODULE, routes_socket, HEALTH_LIVE]:
        problems.append(f"{ROUTES} livenessProbe: expected `python -m {PROBE_MODULE} {routes_socket} {HEALTH_LIVE}`")
    return problems


ZOO_CHECKS = ("selectors", "hpa_pdb", "grace", "writable", "security", "scrape", "ingress", "monitoring")
"""The one-model pod's checks that hold for the zoo pod as they are (the others name the nginx container)."""


# ------------------------------------------------------- several models: scale-out


def per_deployment(docs: Docs) -> dict[str, Docs]:
    """One model's objects of a scale-out rendering each: its Deployment, the Services, PDB, HPA,
    ServiceAccount and ConfigMaps that are its, and the Ingress with only the paths to its Services."""
    parts: dict[str, Docs] = {}
    for dep in objects(docs, "Deployment"):
        labels = dep["spec"]["template"]["metadata"].get("labels", {})
        spec = dep["spec"]["template"]["spec"]
        services = [s for s in objects(docs, "Service") if selects(s["spec"].get("selector"), labels)]
        service_names = {s["metadata"]["name"] for s in services}
        configmaps = {v["configMap"]["name"] for v in spec.get("volumes", []) if "configMap" in v}
        part: Docs = [dep, *services]
        for doc in docs:
            kind, name = doc["kind"], doc["metadata"]["name"]
            if (
                (kind == "PodDisruptionBudget" and selects(doc["spec"].get("selector", {}).get("matchLabels"), labels))
                or (
                    kind == "HorizontalPodAutoscaler"
                    and doc["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"]
                )
                or (kind == "ServiceAccount" and name == spec.get("serviceAccountName"))
                or (kind == "ConfigMap" and name in configmaps)
            ):
                part.append(doc)
        for ing in objects(docs, "Ingress"):
            rules = []
            for rule in ing["spec"].get("rules", []):
                paths = [
                    p for p in rule.get("http", {}).get("paths", []) if p["backend"]["service"]["name"] in service_names
                ]
                if paths:
                    rules.append({**rule, "http": {"paths": paths}})
            if rules:
                part.append({**ing, "spec": {**ing["spec"], "rules": rules}})
        parts[dep["metadata"]["name"]] = part
    return parts


def _loaded(docs: Docs, pool: str | None = None) -> Settings:
    """The settings a container loads (its environment over its ConfigMap's file): onnxpool's, or in
    the zoo pod the front door's (pool "") or model `pool`'s container's."""
    name = main_container(docs)
    if pool and name == PROXY and MODEL_PREFIX + pool in {c["name"] for c in containers(docs)}:
        name = MODEL_PREFIX + pool  # (a model the pod holds no file of has none: the front door's view)
    return load_pod_settings(settings_text(docs) or "", env_of(container(deployment(docs), name)), pool)


def check_scale_out(docs: Docs) -> list[str]:
    """One Deployment per model of the zoo's settings file, serving it as the zoo does, requesting its
    budget; one Ingress routing each model's paths and each task route to the model the zoo gives it."""
    from onnxpool.config.loader import ConfigError
    from onnxpool.tasks.registry import task_class

    problems = []
    zoo_docs = overlay("zoo")
    zoo_file = config_path(zoo_docs)
    zoo = _loaded(zoo_docs, pool="")
    models = list(zoo.models)  # the file's order: a shared route is the first model's
    served_by: dict[str, str] = {}  # Deployment -> the model it serves
    for name, part in per_deployment(docs).items():
        try:
            settings = _loaded(part)
        except ConfigError as exc:
            problems.append(f"Deployment {name}: onnxpool refuses its settings: {exc}")
            continue
        model = settings.model.name
        if model not in zoo.models:
            problems.append(f"Deployment {name} serves {model}, not a model of {zoo_file}")
            continue
        if model in served_by.values():
            problems.append(f"model {model} has several Deployments")
        served_by[name] = model
        pool = _loaded(zoo_docs, pool=model)
        for what in ("model", "task", "limits", "cache"):
            if getattr(settings, what) != getattr(pool, what):
                problems.append(f"Deployment {name}: [{what}] differs from {zoo_file}'s for {model}")
        budget = zoo.models[model].cpus
        cpu = container(deployment(part), APP).get("resources", {}).get("requests", {}).get("cpu")
        if not isinstance(budget, float) or cpu is None or round(cpu_quantity(cpu) * 1000) != round(budget * 1000):
            problems.append(f"Deployment {name}: requests.cpu {cpu} is not {model}'s budget ({budget}) in {zoo_file}")
    for model in set(models) - set(served_by.values()):
        problems.append(f"model {model} of {zoo_file} has no Deployment")
    # Ingress: path -> (pathType, the model whose pods the backend Service selects)
    pods = {
        d["metadata"]["name"]: d["spec"]["template"]["metadata"].get("labels", {}) for d in objects(docs, "Deployment")
    }
    services = {
        s["metadata"]["name"]: next(
            (served_by.get(d) for d, labels in pods.items() if selects(s["spec"].get("selector"), labels)), None
        )
        for s in objects(docs, "Service")
    }
    ingresses = objects(docs, "Ingress")
    if len(ingresses) != 1:
        return [*problems, f"{len(ingresses)} Ingresses: the models share one front door"]
    routes: dict[str, tuple[str, str | None]] = {}
    for rule in ingresses[0]["spec"].get("rules", []):
        for p in rule.get("http", {}).get("paths", []):
            routes[p["path"]] = (p["pathType"], services.get(p["backend"]["service"]["name"]))
    owners: dict[str, str] = {}
    for model in models:
        for route in task_class(zoo.models[model].task).routes:
            if "<model>" not in route:
                owners.setdefault(route, model)
    wanted: dict[str, tuple[set[str], str]] = {"/": ({"Prefix"}, models[0])}
    for model in models:
        for url_name in (model, *(a for a in zoo.models[model].aliases if "/" not in a)):
            wanted[f"/v2/models/{url_name}"] = ({"Prefix", "ImplementationSpecific"}, model)
            # `/v1/models/<name>:predict` is under no element-wise Prefix: ingress-nginx's plain prefix.
            wanted[f"/v1/models/{url_name}"] = ({"ImplementationSpecific"}, model)
    for route, model in owners.items():
        wanted[route] = ({"Exact", "Prefix"}, model)
    for path, (types, model) in wanted.items():
        kind, target = routes.get(path, (None, None))
        if kind is None:
            problems.append(f"the Ingress has no path {path} (for {model})")
        elif target != model or kind not in types:
            problems.append(
                f"the Ingress routes {path} ({kind}) to {target}, not to {model} ({'/'.join(sorted(types))})"
            )
    for path, (_, target) in routes.items():
        if target is None:
            problems.append(f"the Ingress path {path} goes to a Service that selects no model's pods")
    return problems


CHECKS: dict[str, Callable[[Docs], list[str]]] = {
    "selectors": check_selectors,
    "ports": check_ports,
    "hpa_pdb": check_hpa_pdb,
    "resources": check_resources,
    "grace": check_grace,
    "writable": check_writable,
    "security": check_security,
    "probes": check_probes,
    "scrape": check_scrape,
    "ingress": check_ingress,
    "nginx": check_nginx,
    "grpc": check_grpc,
    "monitoring": check_monitoring,
}

# Several models: the zoo pod's own checks (with ZOO_CHECKS of the above), and the scale-out
# form's (each of its Deployments also passes every check above, as a one-model pod).
SEVERAL_MODEL_CHECKS: dict[str, Callable[[Docs], list[str]]] = {
    "zoo_pod": check_zoo_pod,
    "zoo_resources": check_zoo_resources,
    "zoo_probes": check_zoo_probes,
    "scale_out": check_scale_out,
}
ALL_CHECKS = {**CHECKS, **SEVERAL_MODEL_CHECKS}

# fixture folder -> (check that must catch it, words its message must contain)
NEGATIVE = {
    "bad-selector": ("selectors", "Service"),
    "bad-port": ("ports", "readinessProbe port"),
    "bad-pdb": ("hpa_pdb", "allows no disruption"),
    "bad-hpa": ("hpa_pdb", "HPA targets"),
    "bad-qos": ("resources", "Guaranteed"),
    "bad-memory": ("resources", "limits.memory"),
    "bad-grace": ("grace", "terminationGracePeriodSeconds"),
    "bad-writable": ("writable", "TMPDIR"),
    "bad-rootfs": ("writable", "readOnlyRootFilesystem"),
    "bad-security": ("security", "allowPrivilegeEscalation"),
    "bad-probe": ("probes", "livenessProbe path"),
    "bad-ingress": ("ingress", "proxy-body-size"),
    "bad-scrape": ("scrape", "scraped twice"),
    "bad-nginx": ("nginx", "nginx.pidfile"),
    "bad-grpc": ("grpc", "nginx.grpc_listen"),
    "bad-monitoring": ("monitoring", "differs from deploy/monitoring/onnxpool-rules.yml"),
    "bad-zoo-pod": ("zoo_pod", "is not the container port http"),
    "bad-zoo-budget": ("zoo_resources", "idle cores are not lent"),
    "bad-zoo-memory": ("zoo_resources", "limits.memory"),
    "bad-zoo-model": ("zoo_resources", "neither in the image"),
    "bad-zoo-probe": ("zoo_probes", "livenessProbe path"),
    "bad-scale-out": ("scale_out", "routes /predict"),
    "bad-scale-out-budget": ("scale_out", "budget"),
}


# ------------------------------------------------------------------- tests


def test_kubectl_is_required_in_ci(monkeypatch):
    """A missing kubectl (or any CI tool) is a failure under CI=true, not a skip."""
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI must install it"):
        need_tool("kubectl-that-does-not-exist")


@pytest.mark.parametrize("name", ALL_OVERLAYS)
def test_overlay_renders(name):
    assert overlay(name), f"overlay {name} rendered nothing"


def test_broken_kustomization_fails_to_render():
    with pytest.raises(RenderError, match="kubectl kustomize"):
        render(FIXTURES / "bad-render")


def validate_docs(docs: Docs, version: str) -> list[str]:
    try:
        import kubernetes_validate as kv
    except ImportError:
        if in_ci():
            pytest.fail("kubernetes-validate not installed: CI must install it (deploy/requirements-ci.txt)")
        pytest.skip("kubernetes-validate not installed")

    problems = []
    for doc in docs:
        key = (doc.get("apiVersion"), doc.get("kind"))
        if key in CRD_KINDS:
            problems += check_custom_resource(doc)
            continue
        try:
            kv.validate(doc, version, strict=True)
        except (kv.ValidationError, kv.SchemaNotFoundError, kv.InvalidSchemaError) as error:
            problems.append(f"{key[1]}/{doc.get('metadata', {}).get('name')} @ {version}: {error}")
    return problems


def check_custom_resource(doc: dict[str, Any]) -> list[str]:
    """Custom resources (no bundled schema): the fields we rely on exist."""
    spec = doc.get("spec", {})
    if doc["kind"] == "ServiceMonitor":
        ok = spec.get("selector", {}).get("matchLabels") and all("port" in e for e in spec.get("endpoints", [{}]))
    elif doc["kind"] == "PrometheusRule":
        groups = spec.get("groups") or [{}]
        ok = set(spec) == {"groups"} and all(
            g.get("name")
            and g.get("rules")
            and all(("alert" in r) != ("record" in r) and r.get("expr") for r in g["rules"])
            for g in groups
        )
    else:
        ok = spec.get("containers") and spec.get("supportedModelFormats") and "v2" in spec.get("protocolVersions", [])
    return [] if ok else [f"{doc['kind']} lacks required fields"]


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name", ["base", *ALL_OVERLAYS])
def test_overlay_validates_strictly(name, version):
    docs = rendered(K8S / "base") if name == "base" else overlay(name)
    assert validate_docs(docs, version) == []


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_strict_validation_catches_unknown_fields(version):
    problems = validate_docs(fixture("bad-schema"), version)
    assert any("Deployment/onnxpool" in p for p in problems), problems
    assert any("Widget" in p for p in problems), "an unknown kind must fail, not pass unchecked"


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", APP_OVERLAYS)
def test_overlay_semantics(name, check):
    assert CHECKS[check](overlay(name)) == []


@pytest.mark.parametrize("check", [*ZOO_CHECKS, "zoo_pod", "zoo_resources", "zoo_probes"])
def test_zoo_semantics(check):
    """The zoo pod: the one-model pod's checks that do not name its nginx container, and its own."""
    assert ALL_CHECKS[check](overlay("zoo")) == []


def test_scale_out_serves_the_zoo_apart():
    """One Deployment per model of the zoo's settings, each requesting its budget, behind one Ingress."""
    assert check_scale_out(overlay("scale-out")) == []


@pytest.mark.parametrize("check", CHECKS)
def test_scale_out_deployments_are_one_model_pods(check):
    """Each Deployment of the scale-out form, with its own objects, passes every one-model pod check."""
    parts = per_deployment(overlay("scale-out"))
    assert len(parts) == len(zoo_models(overlay("zoo")))
    assert {name: CHECKS[check](part) for name, part in parts.items()} == {name: [] for name in parts}


def test_zoo_cpu_is_its_budgets_plus_nginx():
    """The numbers the zoo check derives (spelled out: the ConfigMap's budgets, the base's nginx share)."""
    docs = overlay("zoo")
    budgets = {name: float(entry["cpus"]) for name, entry in zoo_models(docs).items()}
    nginx = cpu_quantity(base_nginx()["resources"]["requests"]["cpu"])
    assert len(budgets) == 3 and math.isclose(zoo_ceiling(docs), sum(budgets.values()) + nginx)
    for name, c in model_containers(docs).items():
        assert math.isclose(cpu_quantity(c["resources"]["requests"]["cpu"]), budgets[name])
        assert math.isclose(cpu_quantity(c["resources"]["limits"]["cpu"]), 2.25)
    held, _ = held_models(docs)
    assert set(held) == set(model_containers(docs)) == {"efficientnet-lite0", "iris"}, "MiniLM: optional, not held"


@pytest.mark.parametrize("name", NEGATIVE)
def test_semantic_check_catches_fixture(name):
    check, words = NEGATIVE[name]
    problems = ALL_CHECKS[check](fixture(name))
    assert any(words in p for p in problems), f"{check} missed {name}: {problems}"


def test_every_semantic_check_has_a_negative_fixture():
    assert set(ALL_CHECKS) == {check for check, _ in NEGATIVE.values()}
    assert {p.name for p in FIXTURES.iterdir() if p.is_dir()} >= set(NEGATIVE)


def test_overlays_choose_the_cpu_layouts_they_promise():
    def layout(name: str) -> str:
        return str(deployment(overlay(name))["spec"]["template"]["metadata"]["annotations"]["onnxpool.io/cpu-layout"])

    assert layout("pinned") == "pinned"
    assert layout("shared") == "unpinned"
    assert layout("zoo") == "unpinned"
    assert [c["name"] for c in containers(overlay("zoo"))] == [PROXY, ROUTES, "model-efficientnet-lite0", "model-iris"]
    assert objects(overlay("monitoring"), "ServiceMonitor")
    assert objects(overlay("monitoring"), "PrometheusRule")
    assert objects(overlay("ingress-nginx"), "Ingress")
