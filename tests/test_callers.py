"""Callers (config/callers.py, workers/lanes.py, config/nginx_callers.py): real hosts, nginx and gunicorn.

A host serves a slow model (each request as long as it asks, tests/slow_model.py) and iris; callers
are named by their keys (nginx's js module hashes them). Checked: a flooding caller cannot starve a
second one, and a caller alone has every worker; quotas answer 429 with Retry-After in each API's
shape; a caller limited to one model gets 403 on another; per-caller metrics and the access log
name callers and never a key; a quota change applies on HUP without dropping a request. One model
behind `onnxpool nginx` (a VM's or a pod's nginx) keeps callers named by a header apart the same
way; with no callers, nothing of this is rendered or bound. The fair choice itself is tested as
pure logic at the end.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pytest
import requests

from onnxpool.config.callers import (
    ANONYMOUS,
    caller_book,
    caller_book_of,
    key_digest,
    lane_addresses,
    read_keys_file,
)
from onnxpool.config.loader import ConfigError
from onnxpool.config.nginx import RENDERED_DEFAULT, render_site
from onnxpool.config.settings import CallerSettings, CallersSettings, Settings
from onnxpool.measure.servers import wait_http_ok
from onnxpool.workers.lanes import Choice, LanePlan, choose
from tests.deploy_harness import stop_together
from tests.harness import clean_env, free_port, port_with_free_lanes, running_server, spawn_logged
from tests.host_harness import (
    NGINX,
    Host,
    iris_table,
    kserve,
    need_js_module,
    one_worker,
    running_host,
    two_workers,
    write_settings,
)
from tests.slow_model import build_slow_model, infer_body
from tests.v2client import closed_as_sent

ITERATIONS = 20_000
"""Loop iterations of one slow request: tens of milliseconds of one worker's core."""
KEYS = {name: f"sk-{name}-{secrets.token_hex(12)}" for name in ("steady", "flood", "limited", "irisonly", "capped")}
UNNAMED_KEY = f"sk-{secrets.token_hex(16)}"


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name]}"}


@dataclass
class CallerLoop:
    """`connections` threads of one caller, each in a closed loop on the slow model's v2 infer."""

    url: str
    headers: dict[str, str]
    connections: int = 1
    statuses: Counter[int] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    stale: int = 0
    """Sent again on a new connection: nginx 1.22 closes idle keep-alive connections when it reloads, and
    one on its way was never read (tests/v2client.py, `closed_as_sent`); not lost, and not an answer."""
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> CallerLoop:
        self._threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(self.connections)]
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def _loop(self) -> None:
        with requests.Session() as session:
            while not self._stop.is_set():
                try:
                    reply = self._send(session)
                except requests.RequestException as exc:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                    continue
                self.statuses[reply.status_code] += 1

    def _send(self, session: requests.Session) -> requests.Response:
        try:
            return session.post(self.url, json=infer_body(ITERATIONS), headers=self.headers, timeout=30)
        except requests.ConnectionError as exc:
            if not closed_as_sent(exc):
                raise
        self.stale += 1
        session.close()
        return session.post(self.url, json=infer_body(ITERATIONS), headers=self.headers, timeout=30)

    @property
    def answers(self) -> int:
        return self.statuses[200]


def _replaced(host: Host, killed: int) -> bool:
    workers = host.workers("slow")
    return len(workers) == 2 and killed not in workers


def slow_url(host_url: str) -> str:
    return f"{host_url}/v2/models/slow/infer"


def answers_in(seconds: float, *loops: CallerLoop) -> list[int]:
    """Each loop's answers within `seconds` (counted from now)."""
    before = [loop.answers for loop in loops]
    time.sleep(seconds)
    return [loop.answers - start for loop, start in zip(loops, before, strict=True)]


def host_file(folder: Path, extra: str = "") -> Path:
    keys = folder / "keys.txt"
    keys.write_text(
        "# caller key\n" + "".join(f"{name} {key}\n" for name, key in KEYS.items()) + f"{UNNAMED_KEY}\n",
        encoding="utf-8",
    )
    model = build_slow_model(folder / "slow.onnx")
    callers = (
        f'[auth]\napi_keys_file = "{keys}"\n\n[callers]\n\n'
        '[caller.limited]\nrate = 1\n\n[caller.irisonly]\nmodels = ["iris"]\n\n[caller.capped]\nconcurrency = 1\n\n'
        f"{extra}"
    )
    # wide_threads off: these tests count workers shared between callers; a lone caller's wide runs
    # (on the idle worker's core too, workers/wide.py) would blur "a caller alone has one worker".
    slow = (
        f'[models.slow]\npath = "{model}"\ntask = "tensors"\nwarmup_runs = 1\nwide_threads = "off"\n{two_workers(1.0)}'
    )
    return write_settings(
        folder / "host.toml",
        callers,
        slow,
        iris_table("iris", one_worker(0.25)),
        server=f'[nginx]\naccess_log = "{folder / "access.log"}"\n',
    )


@pytest.fixture(scope="module")
def keyed_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    if NGINX is None:
        pytest.skip("nginx binary not installed (apt-get install nginx-light)")
    need_js_module()
    folder = tmp_path_factory.mktemp("callers")
    with running_host(folder, host_file(folder)) as host:
        yield host


@pytest.mark.nginx
@pytest.mark.slow
class TestHostCallers:
    def test_a_flood_cannot_starve_a_steady_caller_and_a_caller_alone_has_every_worker(self, keyed_host: Host) -> None:
        url = slow_url(keyed_host.url)
        with CallerLoop(url, auth("steady")) as steady:
            (alone,) = answers_in(3.0, steady)
        with CallerLoop(url, auth("flood"), connections=8) as flood:
            (flood_alone,) = answers_in(3.0, flood)
            with CallerLoop(url, auth("steady")) as steady:
                time.sleep(0.5)
                steady_share, flood_share = answers_in(4.0, steady, flood)
        # In one queue the steady caller would have 1 of 9 connections' answers (~11 %); on its own lane it
        # holds one of the two workers whenever it has a request (~45 %).
        assert steady_share >= 0.25 * (steady_share + flood_share), (steady_share, flood_share)
        assert steady.errors == [] and set(steady.statuses) == {200}, (steady.statuses, steady.errors[:3])
        # Work-conserving: the flood alone has both workers, twice what one caller on one connection gets.
        assert flood_alone >= 1.5 * alone, (flood_alone, alone)
        assert flood.errors == [] and set(flood.statuses) == {200}, flood.statuses

    def test_kill_9_of_the_workers_mid_request_leaves_the_shares_whole(self, keyed_host: Host) -> None:
        """Each slow worker killed while it serves (a flood and a steady caller loop on slow, a client on iris):
        iris loses nothing; slow loses at most the requests the killed workers held; the replacements choose
        by lane like the dead (the seat a dead worker held on the board is its replacement's), so afterwards
        the flood alone has both workers again and the steady caller keeps its share."""
        url = slow_url(keyed_host.url)
        iris_ok = {"ok": 0, "failed": 0}
        stop = threading.Event()

        def loop_on_iris() -> None:
            while not stop.is_set():
                reply = requests.post(f"{keyed_host.url}/v1/models/iris:predict", headers=auth("irisonly"),
                                      json={"instances": [[5.1, 3.5, 1.4, 0.2]]}, timeout=30)  # fmt: skip
                iris_ok["ok" if reply.status_code == 200 else "failed"] += 1

        iris = threading.Thread(target=loop_on_iris, daemon=True)
        iris.start()
        try:
            with CallerLoop(url, auth("flood"), connections=6) as flood, CallerLoop(url, auth("steady")) as steady:
                time.sleep(1.0)
                for pid in list(keyed_host.workers("slow")):
                    os.kill(pid, signal.SIGKILL)  # a worker of our own host, by pid, busy with a request
                    keyed_host.wait_for("its replacement", partial(_replaced, keyed_host, pid))
                time.sleep(1.0)
        finally:
            stop.set()
            iris.join(30)
        lost = len(flood.errors) + len(steady.errors) + flood.statuses[503] + steady.statuses[503]
        assert lost <= 2 and flood.answers > 0 and steady.answers > 0, (flood.statuses, steady.statuses, lost)
        assert iris_ok["failed"] == 0 and iris_ok["ok"] > 20, iris_ok
        with CallerLoop(url, auth("steady")) as alone:
            (steady_alone,) = answers_in(2.0, alone)
        with CallerLoop(url, auth("flood"), connections=6) as flood:
            (flood_alone,) = answers_in(2.0, flood)
            with CallerLoop(url, auth("steady")) as steady:
                time.sleep(0.5)
                steady_share, flood_share = answers_in(3.0, steady, flood)
        assert flood_alone >= 1.5 * steady_alone, (flood_alone, steady_alone)  # no seat left marked busy
        assert steady_share >= 0.25 * (steady_share + flood_share), (steady_share, flood_share)

    def test_a_rate_quota_answers_429_with_retry_after_in_each_apis_shape(self, keyed_host: Host) -> None:
        headers = auth("limited")
        url = keyed_host.url
        kserve_v1 = [requests.post(f"{url}/v1/models/iris:predict", json={"instances": [[5.1, 3.5, 1.4, 0.2]]},
                                   headers=headers, timeout=10) for _ in range(2)]  # fmt: skip
        assert [reply.status_code for reply in kserve_v1] == [200, 429]
        refused = kserve_v1[1]
        assert refused.headers["Retry-After"] == "1" and refused.headers["X-Request-ID"]
        assert refused.json() == {"error": "caller limited is over its quota ([caller.limited]); retry after 1 s"}, (
            refused.text
        )
        v2 = [requests.post(slow_url(url), json=infer_body(0), headers=headers, timeout=10) for _ in range(2)]
        assert [reply.status_code for reply in v2] == [200, 429], "counted per model: iris's use is not slow's"
        assert set(v2[1].json()) == {"error"}
        # OpenAI's error object on /v1/embeddings (nginx refuses before any pool sees it).
        openai_shape = [requests.post(f"{url}/v1/embeddings", json={"model": "m", "input": "hi"}, headers=headers,
                                      timeout=10) for _ in range(2)]  # fmt: skip
        assert openai_shape[1].status_code == 429, [reply.text for reply in openai_shape]
        error = openai_shape[1].json()["error"]
        assert error["code"] == "rate_limit_exceeded" and "caller limited is over its quota" in error["message"]
        assert openai_shape[1].headers["Retry-After"] == "1"

    def test_a_concurrency_cap_answers_429_and_other_callers_are_not_capped(self, keyed_host: Host) -> None:
        url = slow_url(keyed_host.url)
        with CallerLoop(url, auth("capped"), connections=3) as capped, CallerLoop(url, auth("flood"), 3) as other:
            time.sleep(2.0)
        assert capped.statuses[200] > 0 and capped.statuses[429] > 0, capped.statuses
        assert set(other.statuses) == {200}, other.statuses

    def test_a_caller_limited_to_one_model_gets_403_on_another(self, keyed_host: Host) -> None:
        headers = auth("irisonly")
        assert kserve(keyed_host, "iris").status_code == 401  # no key: auth is on
        ok = requests.post(f"{keyed_host.url}/v1/models/iris:predict", json={"instances": [[5.1, 3.5, 1.4, 0.2]]},
                           headers=headers, timeout=10)  # fmt: skip
        assert ok.status_code == 200, ok.text
        refused = requests.post(slow_url(keyed_host.url), json=infer_body(0), headers=headers, timeout=10)
        assert refused.status_code == 403
        assert refused.json() == {
            "error": "caller irisonly may not use model slow (its [caller.irisonly] models: iris)"
        }

    def test_metrics_and_the_access_log_name_callers_never_keys(self, keyed_host: Host) -> None:
        unnamed = requests.post(slow_url(keyed_host.url), json=infer_body(0), timeout=10,
                                headers={"Authorization": f"Bearer {UNNAMED_KEY}"})  # fmt: skip
        assert unnamed.status_code == 200
        text = requests.get(keyed_host.url + "/metrics", headers=auth("steady"), timeout=10).text
        counted = {
            (found["caller"], found["model"], found["status"])
            for found in re.finditer(
                r'onnxpool_caller_requests_total\{caller="(?P<caller>[^"]+)",model="(?P<model>[^"]+)",'
                r'status="(?P<status>\d+)"\} [1-9]',
                text,
            )
        }
        unnamed_caller = caller_book(CallersSettings(), {}, (UNNAMED_KEY,), None).callers[0].name
        assert {("steady", "slow", "200"), ("irisonly", "slow", "403"), ("irisonly", "iris", "200")} <= counted
        assert (unnamed_caller, "slow", "200") in counted, sorted(counted)
        assert 'onnxpool_caller_request_duration_seconds_count{caller="flood",model="slow"}' in text
        log = Path(keyed_host.config.parent / "access.log").read_text(encoding="utf-8")
        assert " caller=steady" in log and " caller=limited" in log and f" caller={unnamed_caller}" in log
        assert " caller=anonymous" in log  # the 401 without a key
        pools = keyed_host.log()  # the pools' access lines: the caller nginx found
        assert re.search(r'"POST /v2/models/slow/infer HTTP/1.1" 200 \d+ \d+ms rid=\w+ caller=steady', pools)
        everything = log + text + pools
        assert not [key for key in (*KEYS.values(), UNNAMED_KEY) if key in everything]


@pytest.mark.nginx
@pytest.mark.slow
@pytest.mark.skipif(NGINX is None, reason="nginx binary not installed (apt-get install nginx-light)")
def test_a_quota_change_applies_on_hup_without_dropping_a_request(tmp_path: Path) -> None:
    need_js_module()
    config = host_file(tmp_path, extra="[caller.steady]\nweight = 2\n")
    with running_host(tmp_path, config) as host:
        headers = auth("limited")
        burst = [requests.post(slow_url(host.url), json=infer_body(0), headers=headers, timeout=10) for _ in range(3)]
        assert [reply.status_code for reply in burst] == [200, 429, 429]
        with CallerLoop(slow_url(host.url), auth("steady"), connections=2) as steady:
            time.sleep(1.0)
            text = config.read_text(encoding="utf-8").replace("[caller.limited]\nrate = 1\n", "[caller.limited]\n")
            config.write_text(text, encoding="utf-8")
            host.server.signal(signal.SIGHUP)
            host.wait_for("nginx's new files", lambda: "limit_req zone" not in _site(host))
            time.sleep(1.0)
        assert steady.errors == [] and set(steady.statuses) == {200}, (steady.statuses, steady.errors[:3])
        assert steady.answers > 20
        burst = [requests.post(slow_url(host.url), json=infer_body(0), headers=headers, timeout=10) for _ in range(5)]
        assert [reply.status_code for reply in burst] == [200] * 5


def _site(host: Host) -> str:
    """The front door's site as nginx reads it now, in the host's run folder."""
    found = re.search(rf"(/\S+/onnxpool-{host.pid}-[^/\s]+)/", host.log())
    assert found is not None, "the host's run folder is named in its log"
    return (Path(found.group(1)) / "nginx" / "onnxpool-site.conf").read_text(encoding="utf-8")


# --- one model behind `onnxpool nginx` (a VM's or a pod's nginx) ----------------------------------------


@pytest.mark.nginx
@pytest.mark.slow
@pytest.mark.skipif(NGINX is None, reason="nginx binary not installed (apt-get install nginx-light)")
def test_one_model_behind_onnxpool_nginx_keeps_callers_named_by_a_header_apart(tmp_path: Path) -> None:
    model = build_slow_model(tmp_path / "slow.onnx")
    port = port_with_free_lanes(3)  # a lane for each caller
    front = free_port()
    config = tmp_path / "one.toml"
    config.write_text(
        f'[server]\nbind = "127.0.0.1:{port}"\nworkers = 2\nthreads_per_worker = 1\n\n'
        f'[model]\nname = "slow"\npath = "{model}"\ntask = "tensors"\nwarmup_runs = 1\n\n'
        f'[nginx]\nlisten = "127.0.0.1:{front}"\npidfile = "{tmp_path / "nginx" / "nginx.pid"}"\naccess_log = ""\n\n'
        '[callers]\nidentify = "header"\nheader = "X-Team"\nlanes = 3\n\n[caller.steady]\n\n[caller.flood]\n'
        '[caller.other]\nmodels = ["iris"]\n',
        encoding="utf-8",
    )
    env = clean_env({"ONNXPOOL_CONFIG": str(config), "PYTHONUNBUFFERED": "1"})
    serve = spawn_logged([sys.executable, "-m", "onnxpool.cli", "serve"], tmp_path / "serve.log", env)
    nginx = spawn_logged([sys.executable, "-m", "onnxpool.cli", "nginx"], tmp_path / "nginx.log", env)
    url = f"http://127.0.0.1:{front}"
    try:
        wait_http_ok(url + "/v2/health/ready", serve, tmp_path / "serve.log")
        served = (tmp_path / "serve.log").read_text(encoding="utf-8")
        lanes = ",".join(f"http://127.0.0.1:{number}" for number in range(port, port + 4))
        assert f"Listening at: {lanes} " in served, served
        assert "callers by header" in served
        with CallerLoop(f"{url}/v2/models/slow/infer", {"X-Team": "flood"}, connections=8) as flood:
            time.sleep(0.5)
            with CallerLoop(f"{url}/v2/models/slow/infer", {"X-Team": "steady"}) as steady:
                time.sleep(0.5)
                steady_share, flood_share = answers_in(3.0, steady, flood)
        assert steady_share >= 0.25 * (steady_share + flood_share), (steady_share, flood_share)
        refused = requests.post(f"{url}/v2/models/slow/infer", json=infer_body(0), headers={"X-Team": "other"},
                                timeout=10)  # fmt: skip
        assert refused.status_code == 403 and "caller other may not use model slow" in refused.json()["error"]
        # A client cannot pose as another caller through nginx: X-Onnxpool-Caller is nginx's own.
        posed = requests.post(f"{url}/v2/models/slow/infer", json=infer_body(0), timeout=10,
                              headers={"X-Team": "other", "X-Onnxpool-Caller": "steady"})  # fmt: skip
        assert posed.status_code == 403
        # A quota added by HUP: `onnxpool nginx` writes its files again before it passes the HUP on.
        config.write_text(config.read_text().replace("[caller.steady]\n", "[caller.steady]\nrate = 1\n"))
        for process in (serve, nginx):
            process.send_signal(signal.SIGHUP)
        site = tmp_path / "nginx" / "onnxpool-site.conf"
        deadline = time.monotonic() + 30
        while "limit_req zone" not in site.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # nginx's new workers
        replies = [
            requests.post(f"{url}/v2/models/slow/infer", json=infer_body(0), headers={"X-Team": "steady"}, timeout=10)
            for _ in range(3)
        ]
        assert [reply.status_code for reply in replies] == [200, 429, 429], [reply.text for reply in replies]
        assert replies[1].headers["Retry-After"] == "1"
    finally:
        stop_together(nginx, serve)


# --- no callers: exactly as before -------------------------------------------------------------------


def test_without_keys_or_a_caller_header_a_server_binds_one_socket_for_gunicorns_sync_workers(tmp_path: Path) -> None:
    with running_server(tmp_path, workers=2) as server:
        log = server.log()
    assert f"Listening at: http://{server.bind} (" in log and "Using worker: sync" in log
    assert "caller" not in log


def test_nginx_config_writes_callers_js_beside_the_site_and_never_a_key(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text(f"checkout {KEYS['steady']}\n", encoding="utf-8")
    config = tmp_path / "vm.toml"
    config.write_text(
        f'[server]\nbind = "unix:/run/onnxpool/onnxpool.sock"\n[auth]\napi_keys_file = "{keys}"\n'
        "[caller.checkout]\nrate = 5\n",
        encoding="utf-8",
    )
    command = [sys.executable, "-m", "onnxpool.cli", "nginx-config", "--config", str(config)]
    to_stdout = subprocess.run(command, capture_output=True, text=True, check=False)
    assert to_stdout.returncode == 1 and "write it with -o FILE" in to_stdout.stderr
    written = subprocess.run([*command, "-o", str(tmp_path / "site.conf")], capture_output=True, text=True, check=False)
    assert written.returncode == 0, written.stderr
    site, script = (tmp_path / "site.conf").read_text(), (tmp_path / "callers.js").read_text()
    assert f"js_import onnxpool_callers from {tmp_path / 'callers.js'};" in site
    assert "server unix:/run/onnxpool/onnxpool.1.sock " in site and "checkout _lane1;" in site  # lanes: "auto"
    assert "limit_req zone=onnxpool_rate_checkout_1;" in site
    assert key_digest(KEYS["steady"]).hex() in script and KEYS["steady"] not in site + script


def test_without_keys_or_a_caller_header_nothing_of_callers_is_rendered_or_bound() -> None:
    settings = Settings()
    book = caller_book_of(settings)
    assert not book.enabled and book.lane_count == 0
    assert render_site(settings, callers=book) == render_site(settings) == RENDERED_DEFAULT.read_text(encoding="utf-8")
    assert "lane" not in render_site(settings) and "caller" not in render_site(settings)


def test_keys_name_callers_and_each_unnamed_key_is_a_caller_of_its_own(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text(f"# who\ncheckout {KEYS['steady']}\n{UNNAMED_KEY}\n\nbatch {KEYS['flood']}\n", encoding="utf-8")
    assert read_keys_file(keys) == [("checkout", KEYS["steady"]), (None, UNNAMED_KEY), ("batch", KEYS["flood"])]
    book = caller_book(CallersSettings(lanes=2), {"batch": CallerSettings(weight=3)}, (KEYS["limited"],), keys)
    names = [caller.name for caller in book.callers]
    assert names == sorted(names) and {"checkout", "batch"} <= set(names) and len(names) == 4
    assert [caller.lane for caller in book.callers] == [1, 2, 1, 2]  # name order, wrapping over the lanes
    assert book.caller_of_key(KEYS["steady"]) == "checkout" and book.caller_of_key("sk-unknown-key-xxxx") is None
    assert book.lane_weights()[book.callers[0].lane] == 3 + 1  # batch (3) and the caller sharing its lane
    assert ANONYMOUS not in names
    keys.write_text(f"checkout {KEYS['steady']}\nbatch {KEYS['steady']}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="the same API key is given to callers checkout and batch"):
        caller_book(CallersSettings(), {}, (), keys)
    keys.write_text("a b c\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"line 1: a line is `<key>` or `<caller> <key>`"):
        read_keys_file(keys)


def test_auto_lanes_take_no_tcp_port_unasked() -> None:
    tcp, unix = (
        caller_book(CallersSettings(), {}, (KEYS["steady"],), None, bind) for bind in ("127.0.0.1:8000", "unix:/x.sock")
    )
    assert (tcp.lane_count, tcp.callers[0].lane) == (0, 0) and (unix.lane_count, unix.callers[0].lane) == (8, 1)
    assert caller_book(CallersSettings(lanes=2), {}, (KEYS["steady"],), None, "127.0.0.1:8000").lane_count == 2


def test_lane_addresses_sit_beside_the_bind() -> None:
    assert lane_addresses("unix:/run/p/iris.sock", 2) == ("unix:/run/p/iris.1.sock", "unix:/run/p/iris.2.sock")
    assert lane_addresses("127.0.0.1:8000", 2) == ("127.0.0.1:8001", "127.0.0.1:8002")
    with pytest.raises(ValueError, match="past 65535"):
        lane_addresses("127.0.0.1:65535", 1)


# --- the fair choice (pure logic) --------------------------------------------------------------------------

NEVER = -1e9


def pick(ready: set[int], busy: list[int], answered: list[float] | None = None, workers: int = 2,
         weights: tuple[int, ...] = (1, 1, 1), now: float = 0.0) -> Choice:  # fmt: skip
    plan = LanePlan(weights, workers, hold=0.003)
    return choose(plan, ready, busy, answered or [NEVER] * len(weights), [NEVER] * len(weights), now)


def test_a_caller_alone_gets_every_worker() -> None:
    assert pick({1}, [0, 1, 0]) == Choice(1)  # its second worker: nobody else is active


def test_a_caller_at_its_share_waits_for_one_just_answered() -> None:
    held = pick({1}, [0, 1, 0], answered=[NEVER, NEVER, -0.001])
    assert held.lane is None and held.owed == (2,) and held.until == pytest.approx(0.002)
    # ...but not for longer than the hold: then the flood takes the free worker.
    assert pick({1}, [0, 1, 0], answered=[NEVER, NEVER, -0.004]) == Choice(1)


def test_the_caller_furthest_below_its_share_goes_first() -> None:
    assert pick({1, 2}, [0, 1, 0]) == Choice(2)
    assert pick({1, 2}, [0, 1, 0], weights=(1, 4, 1), workers=4) == Choice(2)  # 1/4 below 0/1
    assert pick({1, 2}, [0, 2, 0], weights=(1, 4, 1), workers=4) == Choice(2)


def test_weights_divide_the_workers() -> None:
    # Weight 3 against 1 on 4 workers: 3 and 1. Lane 1 holds 2, lane 2 holds 1 (its share): lane 1 goes on.
    assert pick({1, 2}, [0, 2, 1], weights=(1, 3, 1), workers=4) == Choice(1)
    # Lane 1 at its 3: lane 2, just answered and below nothing more, is not owed; lane 1 may still take it.
    assert pick({1}, [0, 3, 1], weights=(1, 3, 1), workers=4, answered=[NEVER, NEVER, -0.001]) == Choice(1)


def test_probes_on_lane_zero_are_a_caller_like_any_other() -> None:
    assert pick({0, 1}, [0, 1, 0]) == Choice(0)


@pytest.mark.parametrize("workers", [1, 2, 3, 8])
def test_the_flood_never_waits_when_nobody_is_owed(workers: int) -> None:
    assert pick({1}, [0, workers - 1, 0], workers=workers) == Choice(1)
