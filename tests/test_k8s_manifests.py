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
from typing import Any

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


def settings_toml(docs: Docs) -> dict[str, Any]:
    """The onnxpool.toml carried by the generated ConfigMap the pod mounts."""
    volumes = deployment(docs)["spec"]["template"]["spec"].get("volumes", [])
    names = {v["configMap"]["name"] for v in volumes if "configMap" in v}
    for cm in objects(docs, "ConfigMap"):
        if cm["metadata"]["name"] in names and "onnxpool.toml" in cm.get("data", {}):
            return tomllib.loads(cm["data"]["onnxpool.toml"])
    return {}


def setting(docs: Docs, section: str, key: str, default: Any, name: str = APP) -> Any:
    """A setting as container `name` sees it: its ONNXPOOL_<SECTION>__<KEY> env, else the ConfigMap's file."""
    env = env_of(container(deployment(docs), name))
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
    c = container(deployment(docs))
    live = c.get("livenessProbe", {})
    # The earliest kill: the first failed probe's timeout, then failureThreshold - 1 more periods.
    live_budget = (live.get("failureThreshold", 3) - 1) * live.get("periodSeconds", 10) + live.get("timeoutSeconds", 1)
    if live_budget <= timeout:
        problems.append(f"liveness budget {live_budget}s <= server.timeout {timeout}s: kubelet kills before gunicorn")
    start = c.get("startupProbe", {})
    if start.get("periodSeconds", 10) * start.get("failureThreshold", 3) < 20:
        problems.append("startup budget under 20 s (10x the measured model load + warm-up)")
    return problems


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
        if c["name"] == APP:
            paths["ONNXPOOL_SERVER__RUN_DIR"] = env.get("ONNXPOOL_SERVER__RUN_DIR", "")
            paths["metrics.dir"] = env.get("ONNXPOOL_METRICS__DIR", toml.get("metrics", {}).get("dir", ""))
            paths["server.pidfile"] = toml.get("server", {}).get("pidfile", "")
            paths["server.control_socket"] = toml.get("server", {}).get("control_socket", "")
            if not paths["ONNXPOOL_SERVER__RUN_DIR"]:
                problems.append("ONNXPOOL_SERVER__RUN_DIR unset: the server would write to the read-only root")
        else:
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
    "monitoring": check_monitoring,
}

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
    "bad-monitoring": ("monitoring", "differs from deploy/monitoring/onnxpool-rules.yml"),
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


@pytest.mark.parametrize("name", NEGATIVE)
def test_semantic_check_catches_fixture(name):
    check, words = NEGATIVE[name]
    problems = CHECKS[check](fixture(name))
    assert any(words in p for p in problems), f"{check} missed {name}: {problems}"


def test_every_semantic_check_has_a_negative_fixture():
    assert set(CHECKS) == {check for check, _ in NEGATIVE.values()}
    assert {p.name for p in FIXTURES.iterdir() if p.is_dir()} >= set(NEGATIVE)


def test_overlays_choose_the_cpu_layouts_they_promise():
    def layout(name: str) -> str:
        return str(deployment(overlay(name))["spec"]["template"]["metadata"]["annotations"]["onnxpool.io/cpu-layout"])

    assert layout("pinned") == "pinned"
    assert layout("shared") == "unpinned"
    assert objects(overlay("monitoring"), "ServiceMonitor")
    assert objects(overlay("monitoring"), "PrometheusRule")
    assert objects(overlay("ingress-nginx"), "Ingress")
