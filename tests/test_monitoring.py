"""The Grafana dashboard and the alert rules (deploy/monitoring/), checked with the real thing.

A real Prometheus (Debian's `prometheus`, installed by .ci/run) on a free loopback port, with
its own config and data folder, scrapes a real onnxpool (gunicorn, 2 workers, the demo model)
every second, with onnxpool's rules loaded, while a short load runs: photos (cache misses,
then hits) with nginx's `X-Request-Start`, a client error or two, requests shed past
`max_queue_ms`, and one worker killed (a restart). Then, through Prometheus' HTTP API:

- every dashboard panel's query (variables set to the scraped pod's values) returns at least
  one finite number: no typo in a metric or label name survives, and no histogram is used
  without `sum by (le)`;
- every alert expression is valid PromQL, each of its selectors' positive matchers selects
  series of that metric, every label it names exists on them, the quantity it compares with
  its threshold is measured (but for the two that only exist when something is wrong), and
  Prometheus evaluates every rule without error;
- the dashboard's variable queries find the pod's namespace, pod and model.

`promtool check rules` passes on the plain rules file and on the PrometheusRule's groups.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from onnxpool.measure.servers import start_command
from tests.harness import DATA, REPO, Server, free_port, start_server
from tests.k8s_render import in_ci
from tests.otlp_receiver import Receiver, otlp_receiver

MONITORING = REPO / "deploy" / "monitoring"
DASHBOARD = MONITORING / "grafana-dashboard.json"
RULES = MONITORING / "onnxpool-rules.yml"
PROMETHEUS_RULE = MONITORING / "prometheusrule.yaml"

INT8_CONFIG = MODEL = "efficientnet-lite0-int8"  # the shipped settings file of that name serves this model
# The scraped server as Kubernetes service discovery would label it.
JOB, NAMESPACE, POD = "onnxpool", "onnxpool-test", "onnxpool-test-0"
VARIABLES = {
    "$namespace": NAMESPACE,
    "$pod": POD,
    "$model": MODEL,
    "$__rate_interval": "1m",
    "$__range": "5m",
}

SELECTOR = re.compile(r"(?<![\w:])([a-zA-Z_:][\w:]*)\s*\{([^}]*)\}")
MATCHER = re.compile(r'([a-zA-Z_]\w*)\s*(=~|!=|!~|=)\s*"((?:[^"\\]|\\.)*)"')
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return loaded


def panels() -> list[dict[str, Any]]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def panel_queries() -> list[tuple[str, str]]:
    """(panel title and ref, expression) of every target of every panel."""
    return [(f"{p['title']} [{t['refId']}]", t["expr"]) for p in panels() for t in p["targets"]]


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    return [rule for group in groups for rule in group["rules"]]


def substituted(expr: str) -> str:
    for name, value in sorted(VARIABLES.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(name, value)
    assert "$" not in expr, f"unknown variable in {expr}"
    return expr


def selectors(expr: str) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """(metric, [(label, op, value)]) of each vector selector of an expression."""
    return [(m.group(1), MATCHER.findall(m.group(2))) for m in SELECTOR.finditer(expr)]


def metric_names(expr: str) -> set[str]:
    return {metric for metric, _ in selectors(expr)}


def need(tool: str) -> str:
    found = shutil.which(tool)
    if found is None:
        if in_ci():
            pytest.fail(f"{tool} is not installed: .ci/run installs Debian's prometheus")
        pytest.skip(f"{tool} is not installed (apt-get install prometheus)")
    return found


# ------------------------------------------------------------------ the files themselves


def test_dashboard_is_built_on_every_metric_and_the_variables() -> None:
    board = dashboard()
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    names = {v["name"] for v in board["templating"]["list"]}
    assert {"datasource", "namespace", "pod", "model"} <= names
    for panel in panels():
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            expr = target["expr"]
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            # Every onnxpool selector has braces (so the checks below see it) and the pod filters.
            assert re.findall(r"onnxpool_\w+(?!\w|\s*\{)", expr) == [], expr
            for metric, matchers in selectors(expr):
                labels = {label for label, _, _ in matchers}
                assert {"namespace", "pod"} <= labels, f"{panel['title']}: {metric} lacks $namespace/$pod"
    # Every metric onnxpool exports (server/metrics.py) is on the dashboard.
    from onnxpool.server import metrics

    shown = " ".join(expr for _, expr in panel_queries())
    exported = {m._name for m in vars(metrics).values() if hasattr(m, "_name") and hasattr(m, "_type")}
    assert exported, "no metric found in onnxpool.server.metrics"
    missing = {name for name in exported if not re.search(rf"\b{name}(_total|_bucket|_sum|_count)?\{{", shown)}
    assert missing == set(), f"metrics not on the dashboard: {missing}"


def test_promtool_checks_both_rule_files(tmp_path: Path) -> None:
    promtool = need("promtool")
    spec = yaml.safe_load(PROMETHEUS_RULE.read_text(encoding="utf-8"))["spec"]
    assert spec == yaml.safe_load(RULES.read_text(encoding="utf-8")), "prometheusrule.yaml != onnxpool-rules.yml"
    from_crd = tmp_path / "prometheusrule-groups.yml"
    from_crd.write_text(yaml.safe_dump(spec), encoding="utf-8")
    for path in (RULES, from_crd):
        proc = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"SUCCESS: {len(alert_rules())} rules found" in proc.stdout


def test_prometheusrule_is_rendered_from_the_rules_file() -> None:
    proc = subprocess.run(
        [sys.executable, str(MONITORING / "render.py"), "--check"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr


def test_every_alert_says_what_to_do() -> None:
    for rule in alert_rules():
        notes = rule["annotations"]
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
        assert notes["summary"] and len(notes["description"]) > 120, rule["alert"]


# ------------------------------------------------------------------ with a real Prometheus


class Prometheus:
    def __init__(self, server: Server) -> None:
        self.server = server

    @property
    def url(self) -> str:
        return self.server.url

    def get(self, path: str, **params: Any) -> Any:
        reply = requests.get(self.url + path, params=params, timeout=10)
        body = reply.json()
        assert reply.status_code == 200 and body["status"] == "success", f"{path} {params}: {body}"
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.get("/api/v1/query", query=expr)
        assert data["resultType"] == "vector", f"{expr}: {data['resultType']}"
        result: list[dict[str, Any]] = data["result"]
        return result

    def series(self, selector: str) -> list[dict[str, str]]:
        result: list[dict[str, str]] = self.get("/api/v1/series", **{"match[]": selector, "start": time.time() - 600})
        return result


@pytest.fixture(scope="module")
def collector() -> Iterator[Receiver]:
    """An OTLP receiver the monitored server traces to (the Tracing row's spans counter)."""
    with otlp_receiver() as receiver:
        yield receiver


@pytest.fixture(scope="module")
def onnxpool(tmp_path_factory: pytest.TempPathFactory, collector: Receiver) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("monitored")
    # The INT8 demo: its build's target and this CPU's fit are labels of onnxpool_model_cpu_fit.
    settings = {"ONNXPOOL_CONFIG": INT8_CONFIG, "ONNXPOOL_SERVER__WORKERS": "2", "ONNXPOOL_LIMITS__MAX_QUEUE_MS": "250"}
    # Callers told apart by a header (none sent: every request is `anonymous`'s), for the Callers row.
    settings |= {"ONNXPOOL_CALLERS__IDENTIFY": "header", "ONNXPOOL_CALLERS__LANES": "1"}
    # Traced, to a real OTLP receiver: onnxpool_trace_spans_total for the Tracing row.
    settings |= {"ONNXPOOL_TRACING__ENDPOINT": collector.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "200"}
    # An inference log to files: onnxpool_inference_log_* for the Inference log row.
    settings |= {
        "ONNXPOOL_INFERENCE_LOG__PATH": str(tmp / "inference-log"),
        "ONNXPOOL_INFERENCE_LOG__FLUSH_SECONDS": "0.2",
    }
    server = start_server(tmp, settings, workers=2, lanes=1)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory, onnxpool: Server) -> Iterator[Prometheus]:
    binary = need("prometheus")
    tmp = tmp_path_factory.mktemp("prometheus")
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {
                "job_name": JOB,
                "static_configs": [
                    {"targets": [f"127.0.0.1:{onnxpool.port}"], "labels": {"namespace": NAMESPACE, "pod": POD}}
                ],
            }
        ],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    port = free_port()
    argv = [
        binary,
        f"--config.file={tmp / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    server = start_command(argv, tmp, port, "/-/ready", name="prometheus", cwd=tmp)
    try:
        yield Prometheus(server)
    finally:
        server.stop()


RESET = 0  # a request the killed worker was answering: its connection closes unanswered


def _post_image(url: str, photo: Path, headers: dict[str, str]) -> int:
    with photo.open("rb") as f:
        try:
            return requests.post(url + "/predict?top_k=3", files={"image": f}, headers=headers, timeout=30).status_code
        except requests.ConnectionError:
            return RESET


def _load(server: Server, seconds: float) -> dict[int, int]:
    """Photos (misses, then hits), client errors and shed requests, spread over `seconds`; status counts."""
    statuses: dict[int, int] = {}
    photos = sorted(DATA.glob("*.jpg"))
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        fresh = {"X-Request-Start": f"t={time.time():.3f}"}
        for photo in photos:
            for headers in (fresh, {**fresh, "Cache-Control": "no-store"}):
                status = _post_image(server.url, photo, headers)
                statuses[status] = statuses.get(status, 0) + 1
        stale = {"X-Request-Start": f"t={time.time() - 5:.3f}"}  # waited 5 s in "nginx": shed (503)
        extra = [
            _post_image(server.url, photos[0], stale),
            requests.post(server.url + "/predict", data=b"not an image", timeout=10).status_code,  # 4xx
            requests.get(server.url + "/v2/models/no-such-model", timeout=10).status_code,  # 404
        ]
        for status in extra:
            statuses[status] = statuses.get(status, 0) + 1
        time.sleep(0.1)
    return statuses


@pytest.fixture(scope="module")
def scraped(onnxpool: Server, prometheus: Prometheus) -> Prometheus:
    """Load with a worker killed half-way (a restart), then enough scrapes that rate() sees it all."""
    results: list[dict[int, int]] = []
    loader = threading.Thread(target=lambda: results.append(_load(onnxpool, 8.0)))
    loader.start()
    time.sleep(3.0)
    victim = onnxpool.workers()[0]
    os.kill(victim, signal.SIGKILL)  # our own server's worker, by pid
    loader.join()
    onnxpool.wait_ready(2, exclude={victim})
    statuses = results[0]
    assert statuses.get(200, 0) > 10 and statuses.get(503, 0) > 0 and statuses.get(404, 0) > 0, statuses
    assert any(400 <= s < 500 and s != 404 for s in statuses), statuses
    assert statuses.get(RESET, 0) <= 1, statuses  # only the one in flight on the killed worker
    # Two more scrapes of the final counts (scrape_interval 1 s).
    time.sleep(3.0)
    return prometheus


def name_problems(prometheus: Prometheus, what: str, expr: str) -> list[str]:
    """What in `expr` names nothing real: a metric without series, a label those series lack,
    a positive matcher (= or =~) that alone selects none of them, a `by`/`without` label that
    none of the expression's series carry."""
    problems = []
    labels_seen: set[str] = set()
    for metric, matchers in selectors(expr):
        found = prometheus.series(metric)
        if not found:
            problems.append(f"{what}: no series of {metric}")
            continue
        names = {name for series in found for name in series}
        labels_seen |= names
        for label, op, value in matchers:
            if label not in names:
                problems.append(f"{what}: {metric} has no label {label}")
            elif op in ("=", "=~") and not prometheus.series(f'{metric}{{{label}{op}"{value}"}}'):
                problems.append(f'{what}: no series {metric}{{{label}{op}"{value}"}}')
    for group in GROUPING.findall(expr):
        for label in (name.strip() for name in group.split(",")):
            if label and label != "le" and label not in labels_seen:
                problems.append(f"{what}: groups by {label}, a label none of its series has")
    return problems


@pytest.mark.slow
def test_every_panel_returns_data(scraped: Prometheus) -> None:
    problems = []
    for title, expr in panel_queries():
        query = substituted(expr)
        problems += name_problems(scraped, title, query)
        values = [float(sample["value"][1]) for sample in scraped.query(query)]
        if any(math.isfinite(v) for v in values):
            continue
        problems.append(f"{title}: {query} -> {values}")
    assert problems == [], "\n".join(problems)


@pytest.mark.slow
def test_dashboard_variables_find_the_pod(scraped: Prometheus) -> None:
    expected = {"namespace": NAMESPACE, "pod": POD, "model": MODEL}
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match = re.fullmatch(r"label_values\((.*), (\w+)\)", variable["query"])
        assert match, variable["query"]
        selector, label = substituted(match.group(1)), match.group(2)
        values = {s.get(label) for s in scraped.series(selector)}
        assert expected[variable["name"]] in values, f"{variable['name']}: {selector} gives {values}"


# Alerts whose measured quantity has no series at all on a healthy server: no 500 answer
# (onnxpool answers bad input with a 4xx), an INT8 build on the CPU it was made for.
SILENT_WHEN_HEALTHY = {"OnnxpoolServerErrors", "OnnxpoolModelCpuMismatch"}
THRESHOLD = re.compile(r"(?s)(.*\S)\s*(?:>=|<=|==|!=|>|<)\s*[0-9.]+")


@pytest.mark.slow
def test_every_alert_expression_names_real_series(scraped: Prometheus) -> None:
    problems = []
    for rule in alert_rules():
        scraped.query(rule["expr"])  # valid PromQL (a non-firing alert is an empty vector)
        problems += name_problems(scraped, rule["alert"], rule["expr"])
        # What the alert compares with its threshold is measured: e.g. a ratio whose two sides
        # group by different labels matches nothing and could never fire.
        match = THRESHOLD.fullmatch(rule["expr"].strip())
        assert match, f"{rule['alert']}: expected `<quantity> <comparison> <threshold>`"
        values = [float(sample["value"][1]) for sample in scraped.query(match.group(1))]
        measured = any(math.isfinite(v) for v in values)
        if measured == (rule["alert"] in SILENT_WHEN_HEALTHY):
            problems.append(f"{rule['alert']}: {match.group(1)} -> {values}")
    assert problems == [], "\n".join(problems)


@pytest.mark.slow
def test_prometheus_evaluates_every_rule(scraped: Prometheus) -> None:
    deadline = time.monotonic() + 10
    while True:
        groups = scraped.get("/api/v1/rules")["groups"]
        rules = {r["name"]: r for g in groups for r in g["rules"]}
        if all(r["health"] != "unknown" for r in rules.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert set(rules) == {r["alert"] for r in alert_rules()}
    bad = {name: (r["health"], r.get("lastError")) for name, r in rules.items() if r["health"] != "ok"}
    assert bad == {}, bad
    with contextlib.suppress(KeyError):  # what is firing on the test server, for the log
        print({name: r["state"] for name, r in rules.items()})
