"""The fault table of a several-models host (docs/DEPLOYING.md, "When something breaks"): each fault caused
for real (real supervisord, gunicorn pools, nginx; loopback only) while a client loops on ANOTHER model
through the front door, counting what that loop lost and what the host says and leaves behind.

- kill -9 of a worker, of a pool master, of nginx, of the host's routes: supervisord (or gunicorn, for a
  worker) replaces it alone; the loop on iris loses 0 requests; /v2/models says LOADING/UNAVAILABLE then
  READY again; nothing of the killed process is left.
- kill -9 of supervisord (exit 1) or of the host process (its supervisord stops everything): nothing of
  the host is left (processes of its session, its run folder, the pools' run folders, its cgroups).
- SIGTERM while the models start, and during a reload: exit 0, nothing left.
- start with a bad file (bad TOML, a `name` key, an unknown key, a missing model, a corrupt model, a task
  that raises in bind, a second text model where nginx lacks its js module): one line, exit 1, nothing
  left; the same mistakes on a HUP: the running models keep serving (0 lost), a broken hot-added model is
  UNAVAILABLE with its pool's error line and the host stays ready.
- API keys on: the probes and the host's own checks need no key; every model's route and the host's
  lists ask for one.

Each case adds a row to the table printed at the end of the module (run `pytest -s` to see it as it goes).
"""

from __future__ import annotations

import os
import signal
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from tests.host_harness import (
    HOST_TEST_MARKS,
    NGINX,
    SETOSA,
    Host,
    image_table,
    iris_table,
    loop_on,
    model_list,
    one_worker,
    run_once,
    running_host,
    session_members,
    spawn_host,
    start_host,
    states,
    text_table,
    two_models,
    wait_gone,
    write_settings,
)
from tests.text_models import build_text_model_folder
from tests.v2client import LoadRunner, LoadStats

pytestmark = HOST_TEST_MARKS

LOOP_SECONDS = 90.0
RECOVER_SECONDS = 30.0


@dataclass
class Row:
    fault: str
    loop: str
    state: str
    left: str


ROWS: list[Row] = []


@pytest.fixture(scope="module", autouse=True)
def fault_table(request: pytest.FixtureRequest) -> Iterator[None]:
    """Print every case's figures as one table once the module ran."""
    yield
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None or not ROWS:
        return
    with capture.global_and_fixture_disabled():  # to the terminal, passed or not
        reporter.write_line("")
        reporter.write_line("fault | the loop on iris (ok / sent, failed) | what /v2/models said | left behind")
        for row in ROWS:
            reporter.write_line(f"{row.fault} | {row.loop} | {row.state} | {row.left}")


def record(fault: str, stats: LoadStats | None, state: str, left: list[str]) -> None:
    loop = (
        f"{stats.ok} / {stats.sent}, {len(stats.failures)} failed, {stats.stale} sent again (stale keep-alive)"
        if stats is not None
        else "-"
    )
    ROWS.append(Row(fault, loop, state, "nothing" if not left else "; ".join(left)))
    print(f"\n{fault}: loop {loop}; {state}; left {left or 'nothing'}")


def iris_loop(host: Host) -> LoadRunner:
    return loop_on(host, "iris", seconds=LOOP_SECONDS)


def alive(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return False
    return fields[0] != "Z"


# --- kill -9 of each process the host runs, one after the other, on one host ---------------------


def test_each_process_killed_is_replaced_alone_and_the_loop_on_another_model_loses_nothing(tmp_path: Path) -> None:
    with running_host(tmp_path, two_models(tmp_path)) as host:
        for victim in ("worker", "pool master", "nginx", "routes"):
            loop = iris_loop(host)
            try:
                before = loop.stats.ok
                seen: list[str] = []
                if victim == "worker":
                    (pid,) = host.workers("tiny")
                    group = [pid]
                elif victim == "pool master":
                    pid = host.masters()["tiny"]
                    group = [pid, *host.workers("tiny")]
                else:
                    pid = host.program(victim)
                    group = [pid]
                os.kill(pid, signal.SIGKILL)
                deadline = time.monotonic() + RECOVER_SECONDS
                while time.monotonic() < deadline:
                    try:
                        now = states(host)["tiny"]
                        if not seen or seen[-1] != now:
                            seen.append(now)
                        replaced = replaced_after_kill(host, victim, pid)
                        back = replaced and seen[-1] == "READY" and tiny_answers(host)
                        if back and not any(alive(p) for p in group) and len(host.workers("tiny")) == 1:
                            break
                    except (requests.RequestException, KeyError, ValueError, AssertionError):
                        pass  # the host's routes restarting, a model list without tiny for a moment
                    time.sleep(0.1)
                else:
                    raise AssertionError(f"kill -9 {victim}: not back after {RECOVER_SECONDS} s\n{host.log()[-3000:]}")
                loop.wait_for(before + 50)  # the loop went on after the recovery too
            finally:
                stats = loop.stop()
            left = [f"process {p}" for p in group if alive(p)]
            record(f"kill -9 tiny's {victim}" if victim in ("worker", "pool master") else f"kill -9 {victim}",
                   stats, f"tiny: {' -> '.join(seen)}", left)  # fmt: skip
            assert stats.failures == [], (victim, stats.failures[:5])
            assert left == [], (victim, left)
            assert states(host) == {"iris": "READY", "tiny": "READY"}
        restarts = requests.get(host.url + "/metrics", timeout=10).text
        assert 'onnxpool_model_pool_restarts_total{model="tiny"} 1.0' in restarts
        assert 'onnxpool_model_pool_restarts_total{model="iris"} 0.0' in restarts


def replaced_after_kill(host: Host, victim: str, pid: int) -> bool:
    """The killed process's replacement runs (a worker's: gunicorn's, checked by the worker count)."""
    if victim == "worker":
        return True
    if victim == "pool master":
        return host.masters()["tiny"] != pid
    return host.program(victim) != pid


def tiny_answers(host: Host) -> bool:
    reply = requests.post(f"{host.url}/v2/models/tiny/infer", json=_zeros(), timeout=5)
    return reply.status_code == 200 and requests.get(host.url + "/metrics", timeout=5).status_code == 200


def _zeros() -> dict[str, object]:
    return {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3, 224, 224], "data": [0.0] * 150528}]}


# --- the whole host killed ------------------------------------------------------------------------


@pytest.mark.parametrize("victim", ["supervisord", "host"])
def test_the_whole_host_killed_leaves_nothing(tmp_path: Path, victim: str) -> None:
    host = start_host(tmp_path, two_models(tmp_path))
    try:
        members = session_members(host.pid)
        assert len(members) >= 8, members  # host, supervisord, janitor, routes (2), 2 pools (4), nginx (2)
        target = host.supervisord() if victim == "supervisord" else host.pid
        os.kill(target, signal.SIGKILL)
        host.server.process.wait(60)
        status = host.server.process.returncode
        left = wait_gone(host)
        record(f"kill -9 the {victim}", None, f"host exit status {status}", left)
        assert status == (1 if victim == "supervisord" else -signal.SIGKILL), host.log()[-3000:]
        assert left == [], left
        if victim == "supervisord":
            assert "supervisord exited (status -9)" in host.log()
    finally:
        host.stop()


# --- SIGTERM while starting, while reloading --------------------------------------------------------


def slow_image(folder: Path, name: str) -> str:
    """The demo image model with a long warm-up: its pool takes seconds to be ready."""
    from tests.host_harness import IMAGE_MODEL

    return image_table(name, IMAGE_MODEL, one_worker(0.5)).replace("warmup_runs = 1", "warmup_runs = 200")


def test_sigterm_while_the_models_start_leaves_nothing(tmp_path: Path) -> None:
    config = write_settings(tmp_path / "host.toml", iris_table("iris", one_worker(0.5)), slow_image(tmp_path, "slow"))
    host = spawn_host(tmp_path, config)
    process, log = host.server.process, host.server.log_path
    try:
        deadline = time.monotonic() + 60
        while "worker ready" not in log.read_text(errors="replace") and time.monotonic() < deadline:
            time.sleep(0.05)  # iris is up, slow is warming up: the host is starting
        assert "front door:" not in log.read_text(errors="replace")
        process.send_signal(signal.SIGTERM)
        process.wait(60)
        left = wait_gone(host)
        record("SIGTERM while starting", None, f"host exit status {process.returncode}", left)
        assert process.returncode == 0, host.log()[-3000:]
        assert left == [], left
    finally:
        host.stop()


def test_sigterm_during_a_reload_leaves_nothing(tmp_path: Path) -> None:
    config = two_models(tmp_path)
    host = start_host(tmp_path, config)
    try:
        tiny = image_table("tiny", tmp_path / "tiny.onnx", one_worker(0.5))
        write_settings(config, iris_table("iris", one_worker(0.5)), tiny, slow_image(tmp_path, "slow"))
        host.server.signal(signal.SIGHUP)
        host.wait_for("the reload to start the slow model", lambda: "model slow added" in host.log())
        host.server.signal(signal.SIGTERM)
        host.server.process.wait(60)
        left = wait_gone(host)
        record("SIGTERM during a reload", None, f"host exit status {host.server.process.returncode}", left)
        assert host.server.process.returncode == 0, host.log()[-3000:]
        assert left == [], left
    finally:
        host.stop()


# --- bad files at start and on a reload ------------------------------------------------------------


def raising_task(folder: Path) -> str:
    """A task of one's own whose bind raises (its labels service is down, say)."""
    source = folder / "raising.py"
    source.write_text(
        "from onnxpool.tasks.tabular.task import Tabular\n\n\n"
        "class Raising(Tabular):\n"
        "    def bind(self, model):\n"
        '        raise RuntimeError("the labels service is unreachable")\n'
    )
    return iris_table("broken", one_worker(0.25)).replace('task = "tabular"', f'task = "{source}:Raising"')


def corrupt_model(folder: Path) -> str:
    path = folder / "corrupt.onnx"
    path.write_bytes(b"this is not an ONNX model\n" * 100)
    return image_table("broken", path, one_worker(0.25))


def nginx_without_js(folder: Path) -> Path:
    """A PATH folder whose `nginx` is the real one, built (as `nginx -V` says) without the js module."""
    assert NGINX is not None
    bin_dir = folder / "bin"
    bin_dir.mkdir(exist_ok=True)
    wrapper = bin_dir / "nginx"
    wrapper.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-V" ]; then echo "nginx version: nginx (test)\n'
        f'configure arguments: --modules-path={folder / "no-modules"}" >&2; exit 0; fi\n'
        f'exec {NGINX} "$@"\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return bin_dir


def two_text_models(folder: Path) -> list[str]:
    return [
        text_table("text-a", build_text_model_folder(folder / "text-a"), one_worker(0.25)),
        text_table("text-b", build_text_model_folder(folder / "text-b"), one_worker(0.25)),
    ]


BAD_STARTS: dict[str, tuple[Callable[[Path], list[str]], str]] = {
    "bad TOML": (lambda folder: ["[models.iris\npath = 1\n"], "config file"),
    "a name key": (lambda folder: [iris_table("iris", 'name = "flowers"\n')], "[models.iris] name: not a key here"),
    "an unknown key": (lambda folder: [iris_table("iris", "colour = 1\n")], "models.iris.colour: unknown key"),
    "a missing model file": (
        lambda folder: [iris_table("iris"), image_table("ghost", folder / "ghost.onnx")],
        "ghost.onnx does not exist",
    ),
    "a corrupt model": (lambda folder: [iris_table("iris"), corrupt_model(folder)], "model broken:"),
    "a task raising in bind": (
        lambda folder: [iris_table("iris"), raising_task(folder)],
        "bind() raised RuntimeError: the labels service is unreachable",
    ),
    "two text models, no js module": (lambda folder: two_text_models(folder), "js module"),
}


@pytest.mark.parametrize("case", list(BAD_STARTS))
def test_a_bad_start_is_one_line_exit_1_and_leaves_nothing(tmp_path: Path, case: str) -> None:
    tables, message = BAD_STARTS[case]
    config = write_settings(tmp_path / "host.toml", *tables(tmp_path))
    env = {"PATH": f"{nginx_without_js(tmp_path)}:{os.environ['PATH']}"} if "js module" in case else None
    before = set(tmp_path.parent.glob("*"))
    done = run_once(config, timeout=120, env_extra=env)
    errors = [line for line in done.stderr.splitlines() if line.startswith("onnxpool: error: ")]
    record(f"start with {case}", None, f"exit {done.returncode}: {errors[-1] if errors else done.stderr[-200:]}", [])
    assert done.returncode == 1, done.stderr[-3000:]
    assert len(errors) == 1 and message in errors[0], done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert set(tmp_path.parent.glob("*")) == before
    left = leftovers_of(done.stderr)
    assert left == [], left


def leftovers_of(text: str) -> list[str]:
    """Processes whose command line names a run folder or socket the host's log printed (none may be left)."""
    folders = {word.split("/pools/")[0] for word in text.split() if "/pools/" in word}
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_text(errors="replace")
            except OSError:
                continue
            if any(folder and folder in command for folder in folders):
                found.append(f"process {entry.name}: {command[:80]}")
    return found + [f"folder {folder}" for folder in folders if folder and Path(folder).exists()]


BAD_RELOADS: dict[str, tuple[Callable[[Path], str], str]] = {
    "bad TOML": (lambda folder: "[models.iris\n", "reload: refused"),
    "a name key": (lambda folder: iris_table("added", 'name = "x"\n'), "reload: refused"),
    "an unknown key": (lambda folder: iris_table("added", "colour = 1\n"), "reload: refused"),
    "a missing model file": (
        lambda folder: image_table("added", folder / "ghost.onnx"),
        "reload: refused",
    ),
    "a corrupt model": (lambda folder: corrupt_model(folder).replace("broken", "added"), "UNAVAILABLE"),
    "a task raising in bind": (lambda folder: raising_task(folder).replace("broken", "added"), "UNAVAILABLE"),
}


def test_bad_reloads_keep_the_running_models_and_tell_the_truth(tmp_path: Path) -> None:
    """One host, one HUP per mistake while a client loops on iris: nothing lost; a rejected file changes
    nothing; a broken hot-added model is UNAVAILABLE with its pool's error line, the host stays ready."""
    config = two_models(tmp_path)
    tiny = image_table("tiny", tmp_path / "tiny.onnx", one_worker(0.5))
    with running_host(tmp_path, config) as host:
        for case, (table, outcome) in BAD_RELOADS.items():
            loop = iris_loop(host)
            try:
                mark = len(host.log())
                write_settings(config, iris_table("iris", one_worker(0.5)), tiny, table(tmp_path))
                host.server.signal(signal.SIGHUP)
                host.wait_for(f"{case}: {outcome}", lambda: outcome in host.log()[mark:], timeout=60)  # noqa: B023
                if outcome == "UNAVAILABLE":
                    host.wait_for("the model list", lambda: states(host).get("added") == "UNAVAILABLE")
                said = model_list(host)
                loop.wait_for(loop.stats.ok + 20)
            finally:
                stats = loop.stop()
            ready = requests.get(host.url + "/v2/health/ready", timeout=10)
            reason = str(said.get("added", {}).get("reason", ""))
            shown = {name: str(model["state"]) for name, model in said.items()}
            record(f"HUP with {case}", stats, f"{shown} {reason[:80]}".strip(), [])
            assert stats.failures == [], (case, stats.failures[:5])
            assert ready.status_code == 200, (case, ready.text)
            assert {shown["iris"], shown["tiny"]} == {"READY"}, (case, shown)
            if outcome == "UNAVAILABLE":
                assert ("bind() raised" in reason) if "task" in case else ("model" in reason), reason
                unknown = requests.post(f"{host.url}/v2/models/added/infer", json={}, timeout=10)
                assert unknown.status_code == 503 and "UNAVAILABLE" in unknown.json()["error"], unknown.text
            else:
                assert "added" not in shown, (case, shown)
            write_settings(config, iris_table("iris", one_worker(0.5)), tiny)  # back to the two models
            host.server.signal(signal.SIGHUP)
            host.wait_for("the reload back", lambda: finished(host) and "added" not in states(host), timeout=60)


def finished(host: Host) -> bool:
    """The host's last reload is done (a HUP sent during a reload is handled after it)."""
    log = host.log()
    return log.rfind("reload: applied") > log.rfind("reload: re-reading")


def test_a_second_text_model_on_a_reload_without_the_js_module_is_unavailable(tmp_path: Path) -> None:
    folder_a = build_text_model_folder(tmp_path / "text-a")
    config = write_settings(tmp_path / "host.toml", iris_table("iris", one_worker(0.5)),
                            text_table("text-a", folder_a, one_worker(0.25)))  # fmt: skip
    env = {"PATH": f"{nginx_without_js(tmp_path)}:{os.environ['PATH']}"}
    with running_host(tmp_path, config, env_extra=env) as host:
        loop = iris_loop(host)
        try:
            folder_b = build_text_model_folder(tmp_path / "text-b")
            tables = [
                text_table(name, folder, one_worker(0.25))
                for name, folder in (("text-a", folder_a), ("text-b", folder_b))
            ]
            write_settings(config, iris_table("iris", one_worker(0.5)), *tables)
            host.server.signal(signal.SIGHUP)
            host.wait_for("text-b unavailable", lambda: states(host).get("text-b") == "UNAVAILABLE", timeout=60)
            said = model_list(host)
            loop.wait_for(loop.stats.ok + 20)
        finally:
            stats = loop.stop()
        reason = str(said["text-b"].get("reason", ""))
        record("HUP with a second text model, no js module", stats, f"text-b UNAVAILABLE: {reason[:60]}", [])
        assert stats.failures == [], stats.failures[:5]
        assert "js module" in reason, said
        assert states(host)["text-a"] == "READY"
        reply = requests.post(host.url + "/v1/embeddings", json={"model": "text-a", "input": "hi"}, timeout=10)
        assert reply.status_code == 200, reply.text
        assert requests.get(host.url + "/v2/health/ready", timeout=10).status_code == 200


# --- API keys ---------------------------------------------------------------------------------------


def test_api_keys_guard_every_model_and_the_host_still_starts(tmp_path: Path) -> None:
    config = two_models(tmp_path, server="")
    text = config.read_text() + '\n[auth]\napi_keys = ["s3cret-key-for-the-test"]\n'
    config.write_text(text)
    key = {"Authorization": "Bearer s3cret-key-for-the-test"}
    with running_host(tmp_path, config) as host:
        for path in ("/v2/health/ready", "/v2/health/live", "/openapi.json", "/docs"):
            assert requests.get(host.url + path, timeout=10).status_code == 200, path
        for path in ("/v2/models", "/v1/models", "/v2/models/iris", "/v2/models/tiny/ready"):
            assert requests.get(host.url + path, timeout=10).status_code == 401, path
            assert requests.get(host.url + path, headers=key, timeout=10).status_code == 200, path
        rows = {"instances": [SETOSA]}
        assert requests.post(f"{host.url}/v1/models/iris:predict", json=rows, timeout=10).status_code == 401
        ok = requests.post(f"{host.url}/v1/models/iris:predict", json=rows, headers=key, timeout=10)
        assert ok.status_code == 200, ok.text
        index = requests.post(f"{host.url}/v2/repository/index", headers=key, timeout=10).json()
        assert [entry["state"] for entry in index] == ["READY", "READY"]
        record("API keys on", None, "ready without a key; 401 without one on every model and list", [])
