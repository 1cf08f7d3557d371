"""A routine change never takes a several-models host down: each row an operator's weekly step, caused for
real (real supervisord, gunicorn pools, nginx; loopback only) while a client loops on ANOTHER model.

- A HUP that changes `[server] graceful_timeout`: every program keeps running, well past the old and the
  new graceful_timeout + 10 s (no program section changed, nothing restarted, nothing cleaned up).
- An edited labels file and a HUP: served at once, with the response cache on (the pool's own reload).
- A pool killed until supervisord gives up: UNAVAILABLE with its own reason, the host not ready (it is
  required); a HUP starts it at once and the host is ready again; without a HUP the host's back-off does.
- A keys file edited without a HUP changes nothing anywhere; after the HUP nginx and the pools agree.
- A model removed under load: nothing lost on any model, readiness 200 throughout.
- A refused reload (a mistake, or a change only a restart applies): shown in /v2/models and /metrics.
- SIGTERM 0.2-1 s into the start: nothing left in the run folders' base (/dev/shm).
- SIGTERM with requests in flight on three models: every pool stops at once, within graceful_timeout + 5 s.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import requests

from tests.host_harness import (
    HOST_TEST_MARKS,
    IRIS,
    SETOSA,
    Host,
    image_table,
    iris_table,
    kserve,
    loop_on,
    model_list,
    one_worker,
    running_host,
    spawn_host,
    states,
    two_models,
    wait_gone,
    write_settings,
)
from tests.slow_model import FOREVER, build_slow_model, infer_body
from tests.tiny_models import build_tiny_model
from tests.v2client import LoadStats, binary_infer, closed_as_sent

pytestmark = HOST_TEST_MARKS


def hup(host: Host) -> int:
    """HUP the host; the log's length before it (what it says after is `host.log()[mark:]`)."""
    mark = len(host.log())
    host.server.signal(signal.SIGHUP)
    return mark


def assert_nothing_lost(*loops: LoadStats) -> None:
    for stats in loops:
        assert stats.failures == [], stats.failures[:5]
        assert stats.ok == stats.sent > 0


# --- graceful_timeout changed by a HUP ------------------------------------------------------------------


def test_a_hup_that_changes_graceful_timeout_keeps_every_program_running(tmp_path: Path) -> None:
    config = two_models(tmp_path, server="graceful_timeout = 6")
    with running_host(tmp_path, config) as host:
        folder = host.run_folder()
        programs = {name: host.program(name) for name in ("janitor", "nginx", "routes", "model-iris", "model-tiny")}
        loop = loop_on(host, "iris")
        try:
            write_settings(
                config,
                iris_table("iris", one_worker(0.5)),
                image_table("tiny", tmp_path / "tiny.onnx", one_worker(0.5)),
                server="graceful_timeout = 3",
            )
            mark = hup(host)
            nginx_conf = folder / "nginx" / "nginx.conf"
            host.wait_for("the reload", lambda: "worker_shutdown_timeout 3s" in nginx_conf.read_text())
            time.sleep(6 + 10 + 1)  # past the old and the new graceful_timeout + 10 s
            answered = requests.get(host.url + "/v2/health/ready", timeout=10)
        finally:
            stats = loop.stop()
        assert_nothing_lost(stats)
        assert answered.status_code == 200, answered.text
        assert folder.is_dir() and (folder / "nginx" / "nginx.conf").is_file()
        assert {name: host.program(name) for name in programs} == programs, "a program was restarted"
        said = host.log()[mark:]
        assert "changed: restarted" not in said and "ERROR" not in said, said[-3000:]
        assert kserve(host, "iris").status_code == 200


# --- an edited labels file ------------------------------------------------------------------------------


def test_an_edited_labels_file_is_served_after_hup_with_the_cache_on(tmp_path: Path) -> None:
    labels = tmp_path / "labels.txt"
    labels.write_text((IRIS / "labels.txt").read_text(encoding="utf-8"), encoding="utf-8")
    iris = iris_table("iris", one_worker(0.5)).replace(str(IRIS / "labels.txt"), str(labels))
    tiny = image_table("tiny", build_tiny_model(tmp_path / "tiny.onnx", bias=0.0), one_worker(0.5))
    config = write_settings(tmp_path / "host.toml", iris, tiny, server="[cache]\nenabled = true\n")
    with running_host(tmp_path, config) as host:
        loop = loop_on(host, "tiny", clients=1)
        try:
            first = kserve(host, "iris").json()["predictions"][0]["label"]
            assert kserve(host, "iris").json()["predictions"][0]["label"] == first == "setosa"  # the second: a hit
            labels.write_text(labels.read_text(encoding="utf-8").replace("setosa", "Iris setosa"), encoding="utf-8")
            hup(host)
            host.wait_for(
                "the new label", lambda: kserve(host, "iris").json()["predictions"][0]["label"] == "Iris setosa"
            )
        finally:
            stats = loop.stop()
        assert_nothing_lost(stats)
        assert "reload: model iris: its pool re-reads the file (HUP)" in host.log()


# --- a pool that gave up ----------------------------------------------------------------------------


def kill_until_given_up(host: Host, model: str) -> int:
    """kill -9 the model's pool master, and each restart as soon as it runs, until supervisord gives up."""
    kills = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        reason = str(model_list(host)[model].get("reason", ""))
        if "started again with back-off" in reason:
            return kills
        try:
            pid = host.program(f"model-{model}")
        except KeyError:
            time.sleep(0.02)
            continue
        os.kill(pid, signal.SIGKILL)  # a master of our own host's supervisord, by pid
        kills += 1
        while host.masters().get(model) == pid and time.monotonic() < deadline:
            time.sleep(0.02)
    raise AssertionError(f"supervisord never gave up on {model}\n{host.log()[-3000:]}")


def test_a_pool_that_gave_up_comes_back_by_hup_and_by_itself(tmp_path: Path) -> None:
    with running_host(tmp_path, two_models(tmp_path)) as host:
        folder = host.run_folder()
        loop = loop_on(host, "iris")
        try:
            kills = kill_until_given_up(host, "tiny")
            said = model_list(host)["tiny"]
            ready = requests.get(host.url + "/v2/health/ready", timeout=10)
            assert said["state"] == "UNAVAILABLE" and "Exited too quickly" not in str(said["reason"]), said
            assert "its pool's master exited without an error line" in str(said["reason"]), said
            assert ready.status_code == 503 and ready.json()["not_ready"] == ["tiny"], ready.text  # required
            assert not list((folder / "runs" / "tiny").glob("onnxpool-*")), "the dead pool's run folder was left"
            t0 = time.monotonic()
            hup(host)
            host.wait_for("tiny READY after the HUP", lambda: states(host)["tiny"] == "READY", timeout=60)
            by_hup = time.monotonic() - t0
            host.wait_for("the host ready", lambda: requests.get(host.url + "/v2/health/ready", timeout=5).ok)

            kill_until_given_up(host, "tiny")  # again, and now no HUP: the host's own back-off
            host.wait_for("tiny READY by itself", lambda: states(host)["tiny"] == "READY", timeout=60)
            host.wait_for("the host ready", lambda: requests.get(host.url + "/v2/health/ready", timeout=5).ok)
        finally:
            stats = loop.stop()
        print(f"\n{kills} kills to give up; READY {by_hup:.1f} s after the HUP")
        assert_nothing_lost(stats)
        assert host.log().count("its pool keeps failing: started again in 5 s") == 2


# --- the keys file ----------------------------------------------------------------------------------------

KEY = {name: f"sk-{name}-{'x' * 20}" for name in ("limited", "other", "newbie")}


def predict_statuses(host: Host, name: str, times: int) -> list[int]:
    headers = {"Authorization": f"Bearer {KEY[name]}"}
    return [
        requests.post(
            f"{host.url}/v1/models/iris:predict", json={"instances": [SETOSA]}, headers=headers, timeout=10
        ).status_code
        for _ in range(times)
    ]


def test_a_keys_file_edit_changes_nothing_until_hup_then_nginx_and_the_pools_together(tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text(f"limited {KEY['limited']}\nother {KEY['other']}\n", encoding="utf-8")
    callers = f'[auth]\napi_keys_file = "{keys}"\n\n[callers]\n\n[caller.limited]\nrate = 1\n\n'
    config = write_settings(
        tmp_path / "host.toml",
        callers,
        iris_table("iris", one_worker(0.5)),
        image_table("tiny", build_tiny_model(tmp_path / "tiny.onnx", bias=0.0), one_worker(0.5)),
    )
    with running_host(tmp_path, config) as host:
        assert predict_statuses(host, "limited", 3)[:2] == [200, 429]
        keys.write_text(f"other {KEY['other']}\nnewbie {KEY['newbie']}\n", encoding="utf-8")  # no HUP
        time.sleep(3.0)
        assert predict_statuses(host, "limited", 3)[:2] == [200, 429], "the removed key changed before a HUP"
        assert predict_statuses(host, "newbie", 1) == [401], "the added key changed before a HUP"
        mark = hup(host)
        host.wait_for("the reload", lambda: "reload: model tiny: its pool re-reads the file" in host.log()[mark:])
        host.wait_for("the removed key refused", lambda: predict_statuses(host, "limited", 1) == [401])
        # The pools' new workers read the file; nginx reloads once their HUPs ended: never an added key let
        # through by nginx and refused by a pool's old worker.
        assert predict_statuses(host, "newbie", 3) == [200, 200, 200]
        assert predict_statuses(host, "other", 3) == [200, 200, 200]


# --- a model removed under load --------------------------------------------------------------------------


def test_removing_a_model_under_load_loses_nothing_and_readiness_stays(tmp_path: Path) -> None:
    config = two_models(tmp_path)
    with running_host(tmp_path, config) as host:
        iris = loop_on(host, "iris")
        removed: Counter[int] = Counter()
        ready: Counter[int] = Counter()
        odd: list[str] = []
        stop = threading.Event()
        call = binary_infer("tiny", np.zeros((1, 3, 224, 224), np.float32))

        def loop(target: Counter[int], send: object) -> None:
            """Keep-alive, as a backend does; a request on a connection nginx's reload closed as it went out is
            sent again once (nginx before 1.27.4 closes idle keep-alive connections when it reloads: DEPLOYING)."""
            session = requests.Session()
            while not stop.is_set():
                try:
                    try:
                        reply = send(session)  # type: ignore[operator]
                    except requests.ConnectionError as exc:
                        if not closed_as_sent(exc):
                            raise
                        target[-1] += 1  # sent again
                        session.close()
                        reply = send(session)  # type: ignore[operator]
                except requests.RequestException as exc:
                    target[0] += 1
                    odd.append(f"{time.time():.3f} {exc}")
                    continue
                target[reply.status_code] += 1
                if reply.status_code not in (200, 404):
                    odd.append(f"{time.time():.3f} {reply.status_code} {reply.text[:200]}")
            session.close()

        threads = [
            threading.Thread(target=loop, args=(removed, lambda s: s.post(host.url + call.path, data=call.body,
                                                                          headers=call.headers, timeout=30))),
            threading.Thread(target=loop, args=(ready, lambda s: s.get(host.url + "/v2/health/ready", timeout=10))),
        ]  # fmt: skip
        for thread in threads:
            thread.start()
        try:
            time.sleep(1.0)
            write_settings(config, iris_table("iris", one_worker(0.5)))
            hup(host)
            host.wait_for("tiny's pool gone", lambda: "tiny" not in host.masters(), timeout=60)
            time.sleep(1.0)
        finally:
            stop.set()
            for thread in threads:
                thread.join(30)
            stats = iris.stop()
        print(f"\nremoval: tiny's loop {dict(removed)}, readiness {dict(ready)}, iris {stats.ok}/{stats.sent}")
        assert_nothing_lost(stats)
        assert set(ready) <= {200, -1} and ready[-1] <= 1, (ready, odd[:5])  # -1: sent again, once per reload
        assert set(removed) <= {200, 404, -1} and removed[200] > 0 and removed[404] > 0, (removed, odd[:5])
        assert list(model_list(host)) == ["iris"]


# --- a refused reload --------------------------------------------------------------------------------------


def host_metric(host: Host, name: str) -> float:
    for line in requests.get(host.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no {name} in /metrics")


def test_a_refused_reload_is_shown_with_its_reason_and_changes_nothing(tmp_path: Path) -> None:
    config = two_models(tmp_path)
    good = config.read_text(encoding="utf-8")
    with running_host(tmp_path, config) as host:
        loop = loop_on(host, "iris")
        try:
            assert reading(host)["applied"] is True
            for broken, reason in (
                ("[models.iris\n", "config file"),
                (good.replace("[server]\n", '[server]\nbudgets = "nice"\n', 1), "server.budgets changed"),
                (good + "\n[limits]\ncolour = 1\n", "limits.colour"),
            ):
                config.write_text(broken, encoding="utf-8")
                read_before = reading(host)["time"]
                hup(host)
                host.wait_for("the refusal", lambda: reading(host)["time"] != read_before)  # noqa: B023
                shown = reading(host)
                assert shown["applied"] is False and reason in str(shown["reason"]), shown
                assert host_metric(host, "onnxpool_host_settings_applied") == 0.0
                assert states(host) == {"iris": "READY", "tiny": "READY"}
            config.write_text(good, encoding="utf-8")
            hup(host)
            host.wait_for("applied", lambda: reading(host)["applied"] is True)
            assert host_metric(host, "onnxpool_host_settings_applied") == 1.0
        finally:
            stats = loop.stop()
        assert_nothing_lost(stats)
        assert host.log().count("reload: refused, nothing changed") == 3


def reading(host: Host) -> dict[str, object]:
    """The host's last reading of its settings file, as /v2/models shows it."""
    reply = requests.get(host.url + "/v2/models", timeout=10)
    assert reply.status_code == 200, reply.text
    return dict(reply.json()["settings_file"])


# --- SIGTERM early in the start -------------------------------------------------------------------------


@pytest.mark.parametrize("after", [0.2, 0.4, 0.6, 0.8, 1.0])
def test_sigterm_early_in_the_start_leaves_nothing(tmp_path: Path, after: float) -> None:
    host = spawn_host(tmp_path, two_models(tmp_path))
    process = host.server.process
    try:
        time.sleep(after)
        process.send_signal(signal.SIGTERM)
        process.wait(60)
        left = wait_gone(host)
        # Before the interpreter has loaded onnxpool, SIGTERM's default action ends it (nothing was made yet).
        assert process.returncode in (0, -signal.SIGTERM), host.log()[-3000:]
        assert left == [], left
    finally:
        host.stop()


# --- SIGTERM with requests in flight on three models -----------------------------------------------------


def test_sigterm_with_requests_in_flight_on_three_models_stops_within_graceful_timeout(tmp_path: Path) -> None:
    """Each model's one worker is stuck in an inference that outlasts any graceful_timeout: the pools are
    told to stop at once (in parallel), so the host is gone in graceful_timeout + 5 s, not three times it."""
    model = build_slow_model(tmp_path / "slow.onnx")
    table = f'path = "{model}"\ntask = "tensors"\nwarmup_runs = 1\n{one_worker(0.3)}'
    tables = [f"[models.slow{i}]\n{table}" for i in (1, 2, 3)]
    graceful = 4
    config = write_settings(tmp_path / "host.toml", *tables, server=f"graceful_timeout = {graceful}")
    with running_host(tmp_path, config) as host:
        answers: list[int] = []

        def stuck(name: str) -> None:
            try:
                reply = requests.post(f"{host.url}/v2/models/{name}/infer", json=infer_body(FOREVER), timeout=60)
                answers.append(reply.status_code)
            except requests.RequestException:
                answers.append(0)

        threads = [threading.Thread(target=stuck, args=(f"slow{i}",), daemon=True) for i in (1, 2, 3)]
        for thread in threads:
            thread.start()
        time.sleep(1.0)  # every request is in its worker's session run
        t0 = time.monotonic()
        host.server.process.send_signal(signal.SIGTERM)
        host.server.process.wait(60)
        took = time.monotonic() - t0
        for thread in threads:
            thread.join(10)
        print(f"\nSIGTERM with 3 stuck requests: the host exited in {took:.1f} s (graceful_timeout {graceful} s)")
        assert host.server.process.returncode == 0, host.log()[-3000:]
        assert took <= graceful + 5, took
        assert len(answers) == 3  # each got its answer (a 502/503 or a closed connection: it outlived the grace)
