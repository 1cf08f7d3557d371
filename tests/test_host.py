"""Several models on one host (`onnxpool serve` on a `[models.<name>]` file, onnxpool.host): real gunicorn
pools behind the real nginx front door, every check through that ONE port.

- every route of every model: Triton (tritonclient) infer, readiness and metadata; the official
  `openai` client on either of two text-embedding models, an alias and an unknown model (404 in
  OpenAI's shape); KServe v1; the image upload; the host's own routes (model list, repository index,
  health) and one /metrics with every model's series;
- each worker's cores, nice value and cgroup weight, read from /proc and /sys, are its model's
  plan as the host printed it; a worker killed with SIGKILL comes back on the same model's plan;
- SIGHUP adds one model and removes another while a client loops on a third: no request fails
  and the third's workers are the same processes;
- a missing optional model file is one line and the model is UNAVAILABLE; a missing required one,
  or a bad settings file, is one line and exit 1 (tests/test_host_faults.py has the fault table:
  kill -9 of every process, SIGTERM while starting or reloading, bad files at start and reload).

The small models: iris (models/iris), the demo image model, tests/tiny_models.py and the tiny text
encoders of tests/text_models.py (two, with different weights). The shipped config/zoo.toml (with
the real MiniLM, `make minilm`) is served once too: skipped without models/minilm outside CI.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest
import requests
import tritonclient.http as triton

from onnxpool.measure.paths import CAT_JPEG
from tests.harness import REPO
from tests.host_harness import (
    CAT_LABELS,
    HOST_TEST_MARKS,
    IMAGE_MODEL,
    IRIS,
    MINILM,
    SETOSA,
    Host,
    check_every_worker,
    check_worker,
    image_table,
    infer_ok,
    iris_table,
    kserve,
    metric_models,
    model_list,
    need_js_module,
    one_worker,
    openai_client,
    run_once,
    running_host,
    text_table,
    two_workers,
    vectors,
    write_settings,
)
from tests.slow_model import build_slow_model, infer_body
from tests.text_models import build_encoder, build_text_model_folder, vocabulary
from tests.tiny_models import build_tiny_model
from tests.v2client import LoadRunner, binary_infer, parse_binary_reply

pytestmark = HOST_TEST_MARKS

# --- the shared host: an image model, iris, two text embedders ------------------------------------

MODELS = ("image", "iris", "text-a", "text-b")


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    need_js_module()
    folder = tmp_path_factory.mktemp("host")
    text_a = build_text_model_folder(folder / "text-a")
    text_b = build_text_model_folder(folder / "text-b")
    build_encoder(text_b / "model.onnx", len(vocabulary()), seed=1)  # other weights: other vectors
    config = write_settings(
        folder / "host.toml",
        image_table("image", IMAGE_MODEL, two_workers(1.0) + 'aliases = ["cat-finder"]\n'),
        iris_table("iris", two_workers(0.25) + 'aliases = ["iris-v1"]\n'),
        text_table("text-a", text_a, one_worker(0.5) + 'aliases = ["text-a-v1", "org/text-a"]\n'),
        text_table("text-b", text_b, one_worker(0.25)),
    )
    with running_host(folder, config) as running:
        yield running


def test_every_model_answers_by_every_route_through_one_port(host: Host) -> None:
    # The host's routes: every model, its versions, aliases and state.
    assert requests.get(host.url + "/v2/health/ready", timeout=10).json() == {"ready": True}
    listed = model_list(host)
    assert list(listed) == list(MODELS)
    assert all(model["state"] == "READY" and model["versions"] == ["1"] for model in listed.values())
    assert listed["text-a"]["aliases"] == ["text-a-v1", "org/text-a"]
    index = requests.post(host.url + "/v2/repository/index", timeout=10)
    assert index.status_code == 200
    assert index.json() == [{"name": name, "version": "1", "state": "READY", "reason": ""} for name in MODELS]
    only_ready = requests.post(host.url + "/v2/repository/index", json={"ready": True}, timeout=10)
    assert [entry["name"] for entry in only_ready.json()] == list(MODELS)
    for name in (*MODELS, "cat-finder", "iris-v1", "text-a-v1"):
        ready = requests.get(f"{host.url}/v2/models/{name}/ready", timeout=10)
        assert ready.status_code == 200, (name, ready.text)
    assert requests.get(f"{host.url}/v2/models/nobody/ready", timeout=10).status_code == 404

    # Triton's client: readiness, metadata, infer (by name and by alias).
    with triton.InferenceServerClient(host.url.removeprefix("http://")) as client:
        assert client.is_server_ready()
        assert all(client.is_model_ready(name) for name in MODELS)
        image_meta = client.get_model_metadata("image")
        assert image_meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 3, 224, 224]}]
        iris_meta = client.get_model_metadata("iris-v1")
        assert iris_meta["name"] == "iris"
        assert [output["name"] for output in iris_meta["outputs"]] == ["label", "probabilities"]
        pixels = triton.InferInput("input", [1, 3, 224, 224], "FP32")
        pixels.set_data_from_numpy(np.zeros((1, 3, 224, 224), np.float32), binary_data=True)
        logits = client.infer("image", [pixels]).as_numpy("logits")
        assert logits is not None and logits.shape == (1, 1000) and np.isfinite(logits).all()
        for name in ("iris", "iris-v1"):
            flower = triton.InferInput("input", [1, 4], "FP32")
            flower.set_data_from_numpy(np.array([SETOSA], np.float32))
            result = client.infer(name, [flower])
            assert result.as_numpy("label").tolist() == [0]
            assert result.get_response()["model_name"] == "iris"

    # KServe v1 on iris (name and alias), the image upload on the first model with /predict.
    for name in ("iris", "iris-v1"):
        reply = kserve(host, name)
        assert reply.status_code == 200, reply.text
        assert reply.json()["predictions"][0]["label"] == "setosa"
    with CAT_JPEG.open("rb") as image:
        upload = requests.post(host.url + "/predict", files={"image": ("cat.jpg", image, "image/jpeg")}, timeout=30)
    assert upload.status_code == 200, upload.text
    assert upload.json()["model"] == "image"
    assert upload.json()["predictions"][0][0]["label"] in CAT_LABELS

    # Both text models answer OpenAI's route; then one scrape holds every model's series.
    with openai_client(host) as client:
        for name in ("text-a", "text-b"):
            assert client.embeddings.create(model=name, input="hello world").model == name
    families = metric_models(host)
    assert set(MODELS) <= families["onnxpool_requests"], families.get("onnxpool_requests")
    assert set(MODELS) <= set().union(*families.values())
    assert families["onnxpool_model_state"] == families["onnxpool_model_pool_restarts"] == set(MODELS)

    # The host's own answers: OpenAI's model list (every model and alias), a 404 naming every model,
    # one API description with every model's routes under its name.
    with openai_client(host) as client:
        assert {model.id for model in client.models.list()} == {*MODELS, "cat-finder", "iris-v1", "text-a-v1",
                                                                 "org/text-a"}  # fmt: skip
    for path in ("/v2/models/nobody", "/v2/models/nobody/infer", "/v1/models/nobody:predict"):
        unknown = requests.request("POST" if "infer" in path or ":" in path else "GET", host.url + path, timeout=10)
        assert unknown.status_code == 404, (path, unknown.text)
        assert all(name in unknown.json()["error"] for name in MODELS), unknown.text
    paths = requests.get(host.url + "/openapi.json", timeout=10).json()["paths"]
    assert not [path for path in paths if "{model}" in path], list(paths)
    for name in MODELS:
        assert paths[f"/v2/models/{name}/infer"]["post"]["tags"] == [name]
    assert paths["/v1/models/iris:predict"]["post"]["tags"] == ["iris"]
    assert paths["/v2/models/image/classify"]["post"]["tags"] == ["image"]
    assert paths["/v2/health/ready"]["get"]["tags"] == ["host"]


def test_openai_client_embeds_with_either_text_model_an_alias_or_gets_a_404(host: Host) -> None:
    with openai_client(host) as client:
        check_either_text_model(host, client)


def check_either_text_model(host: Host, client: openai.OpenAI) -> None:
    texts = ["hello world", "the cat sat on the mat"]
    a = client.embeddings.create(model="text-a", input=texts)
    b = client.embeddings.create(model="text-b", input=texts)
    assert (a.model, b.model) == ("text-a", "text-b")
    assert vectors(a).shape == vectors(b).shape == (2, 16)
    assert not np.allclose(vectors(a), vectors(b), atol=1e-3), "both names reached the same model"
    for alias in ("text-a-v1", "org/text-a"):  # a URL alias and a body-only one (a Hugging Face id)
        again = client.embeddings.create(model=alias, input=texts)
        assert again.model == "text-a"
        assert np.allclose(vectors(again), vectors(a), atol=1e-6)

    with pytest.raises(openai.NotFoundError) as caught:
        client.embeddings.create(model="gpt-4", input="hello")
    assert caught.value.status_code == 404
    error = caught.value.body
    assert isinstance(error, dict)
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", "model", "model_not_found")
    assert "gpt-4" in error["message"] and "text-a" in error["message"] and "text-b" in error["message"]
    no_model = requests.post(host.url + "/v1/embeddings", json={"input": "hello"}, timeout=10)
    assert no_model.status_code == 400 and no_model.json()["error"]["param"] == "model"


def test_each_worker_runs_on_its_models_cores_and_priority(host: Host) -> None:
    plans = host.plans()
    assert set(plans) == set(MODELS)
    assert (plans["image"].workers, plans["text-a"].workers) == (2, 1)
    check_every_worker(host)
    # The budgets (image 1.0, iris 0.25, text-a 0.5, text-b 0.25) are the models' kernel weights: a
    # cgroup's, or their workers' together (each 1024 / 1.25**nice).
    budgets = {"image": 1.0, "iris": 0.25, "text-a": 0.5, "text-b": 0.25}
    weights = {name: plan.weight for name, plan in plans.items()}
    for name, budget in budgets.items():
        assert weights[name] / weights["image"] == pytest.approx(budget, rel=0.15), weights


def test_a_killed_worker_comes_back_on_its_model(host: Host) -> None:
    plan = host.plans()["iris"]
    master = host.masters()["iris"]
    others = {name: host.workers(name) for name in MODELS if name != "iris"}
    before = host.workers("iris")
    victim = next(pid for pid, slot in before.items() if slot == 0)
    os.kill(victim, signal.SIGKILL)
    host.wait_for(
        "a new iris worker",
        lambda: len(after := host.workers("iris")) == plan.workers and victim not in after,
    )
    after = host.workers("iris")
    assert host.masters()["iris"] == master
    new = set(after) - set(before)
    assert len(new) == 1
    (pid,) = new
    assert after[pid] == 0, "the replacement takes the slot its predecessor left"
    check_worker(pid, after[pid], plan)
    for _ in range(4):
        reply = kserve(host, "iris")
        assert reply.status_code == 200 and reply.json()["predictions"][0]["label"] == "setosa"
    assert {name: host.workers(name) for name in others} == others


# --- SIGHUP ---------------------------------------------------------------------------------------


def test_hup_adds_and_removes_models_while_another_keeps_serving(tmp_path: Path) -> None:
    """keep + drop -> keep + added, while two clients loop on keep: no request fails, keep's workers
    are the same processes, drop is gone (404), added answers."""
    drop_model = build_tiny_model(tmp_path / "drop.onnx", bias=0.0)
    added_model = build_tiny_model(tmp_path / "added.onnx", bias=1.0)
    keep = iris_table("keep", two_workers(0.25))
    config = write_settings(tmp_path / "host.toml", keep, image_table("drop", drop_model, one_worker(1.0)))
    iris_row = np.array([SETOSA], np.float32)
    with running_host(tmp_path, config) as host:
        masters = host.masters()
        keep_workers = host.workers("keep")
        call = binary_infer("keep", iris_row, output_name="probabilities")
        load = LoadRunner(host.url, call, clients=2, max_seconds=60, retry_stale=True)
        load.start()
        try:
            load.wait_for(50)
            # With a cgroup per model, a neighbour's budget changes nothing of keep's; with nice values
            # the heaviest worker sets every nice value, so there added weighs what drop weighed.
            nice = host.plans()["keep"].cgroup is None
            write_settings(config, keep, image_table("added", added_model, one_worker(1.0 if nice else 0.5)))
            host.server.signal(signal.SIGHUP)
            host.wait_for("drop's pool to stop", lambda: "drop" not in host.masters())
            host.wait_for("added to answer", lambda: infer_ok(host, "added"))
            load.wait_for(load.stats.ok + 50)
        finally:
            stats = load.stop()
        assert stats.failures == [], stats.failures[:5]
        assert stats.ok == stats.sent >= 100
        log = host.log()
        assert "reload: model added added" in log and "reload: model drop removed" in log
        assert "reload: model keep: its pool re-reads the file (HUP)" in log  # its own reload: nothing changed
        assert host.masters()["keep"] == masters["keep"]
        assert host.workers("keep") == keep_workers, "the looped model's workers were replaced"

        listed = model_list(host)
        assert list(listed) == ["keep", "added"] and all(m["state"] == "READY" for m in listed.values())
        families = metric_models(host)  # the removed model's series are gone with it
        assert "drop" not in set().union(*families.values()), families
        assert not [line for line in log.splitlines() if "drop" in line and "worker restart" in line.lower()]
        assert requests.get(host.url + "/v2/models/drop/ready", timeout=10).status_code == 404
        gone = requests.post(host.url + "/v2/models/drop/infer", json={}, timeout=10)
        assert gone.status_code == 404, gone.text
        call = binary_infer("added", np.zeros((1, 3, 224, 224), np.float32))
        reply = requests.post(host.url + call.path, data=call.body, headers=call.headers, timeout=30)
        assert parse_binary_reply(reply, "logits").flat[0] == pytest.approx(1.0, abs=1e-5)  # zeros in: the bias
        host.wait_for("added's workers", lambda: len(host.workers("added")) == 1)
        check_every_worker(host)
        assert set(host.plans()) == {"keep", "added"} and set(host.masters()) == {"keep", "added"}


def test_a_hup_that_replaces_every_models_workers_sheds_nothing(tmp_path: Path) -> None:
    """max_queue_ms = 250 (the zoo's), a client looping on each model; both models' settings changed and
    HUP: both pools replace their workers, the old ones serving until the new ones
    are warm, and no request gets anything but a 200 (no nginx reload either: the routes are the same)."""
    tiny = build_tiny_model(tmp_path / "tiny.onnx", bias=0.0)
    config = write_settings(
        tmp_path / "host.toml",
        image_table("tiny", tiny, two_workers(0.5)).replace("warmup_runs = 1", "warmup_runs = 20"),
        iris_table("iris", two_workers(0.5)),
        server="",
    )
    config.write_text(config.read_text() + "\n[limits]\nmax_queue_ms = 250\n[cache]\nenabled = false\n")
    with running_host(tmp_path, config) as host:
        before = {name: host.workers(name) for name in ("tiny", "iris")}
        loops = [
            LoadRunner(host.url, binary_infer("tiny", np.zeros((1, 3, 224, 224), np.float32)), clients=1),
            LoadRunner(host.url, binary_infer("iris", np.array([SETOSA], np.float32), output_name="probabilities"),
                       clients=1),
        ]  # fmt: skip
        for loop in loops:
            loop.start()
        try:
            for loop in loops:
                loop.wait_for(20)
            # Both models' settings change (their warm-up): the host HUPs both pools at once.
            write_settings(
                config,
                image_table("tiny", tiny, two_workers(0.5)).replace("warmup_runs = 1", "warmup_runs = 21"),
                iris_table("iris", two_workers(0.5) + "warmup_runs = 4\n"),
            )
            config.write_text(config.read_text() + "\n[limits]\nmax_queue_ms = 250\n[cache]\nenabled = false\n")
            host.server.signal(signal.SIGHUP)
            host.wait_for(
                "both models' workers replaced",
                lambda: all(
                    len(now := host.workers(name)) == 2 and not set(now) & set(before[name]) for name in before
                ),
            )
            for loop in loops:
                loop.wait_for(loop.stats.ok + 20)
        finally:
            stats = [loop.stop() for loop in loops]
        log = host.log()
        assert "reload: model tiny: its pool re-reads the file (HUP)" in log
        assert "reload: model iris: its pool re-reads the file (HUP)" in log
        for loop_stats in stats:
            assert loop_stats.failures == [], loop_stats.failures[:5]
            assert loop_stats.ok == loop_stats.sent >= 40


def test_a_changed_task_file_reaches_its_models_workers_on_hup(tmp_path: Path) -> None:
    """A task of one's own edited in place: a HUP replaces that model's workers (each pool re-reads its task
    as a one-model server does), the other model's workers stay the same processes (nothing it serves
    changed: its pool's reload forks none)."""
    source = tmp_path / "stamped.py"

    def write_task(stamp: int) -> None:
        source.write_text(
            "from onnxpool.tasks.tabular.task import Tabular\n\n\n"
            "class Stamped(Tabular):\n"
            "    def reply(self, inputs, result):\n"
            f"        return {{**super().reply(inputs, result), 'stamp': {stamp}}}\n"
        )

    write_task(1)
    stamped = iris_table("stamped", one_worker(0.25)).replace('task = "tabular"', f'task = "{source}:Stamped"')
    config = write_settings(tmp_path / "host.toml", stamped, iris_table("iris", one_worker(0.25)), server="")
    config.write_text(config.read_text() + "\n[cache]\nenabled = false\n")
    with running_host(tmp_path, config) as host:
        assert kserve(host, "stamped").json()["stamp"] == 1
        iris_workers = host.workers("iris")
        write_task(2)
        host.server.signal(signal.SIGHUP)
        host.wait_for("the new task code", lambda: kserve(host, "stamped").json()["stamp"] == 2)
        log = host.log()
        assert "reload: model stamped: its pool re-reads the file (HUP)" in log
        assert "reload: the settings, task, keys and model read are the ones served: the workers serve on" in log
        assert host.workers("iris") == iris_workers


# --- missing model files, bad files, a dead pool ----------------------------------------------------


def test_a_missing_optional_model_is_one_line_and_unavailable(tmp_path: Path) -> None:
    """Budgets held by nice values here (the other tests' hosts use a cgroup when they may)."""
    ghost = tmp_path / "not-built" / "model.onnx"
    config = write_settings(
        tmp_path / "host.toml",
        iris_table("iris", two_workers(0.25)),
        image_table("tiny", build_tiny_model(tmp_path / "tiny.onnx", bias=0.0), one_worker(1.0)),
        text_table("ghost", ghost.parent, "optional = true\n"),
        server='budgets = "nice"',
    )
    with running_host(tmp_path, config) as host:
        lines = [line for line in host.log().splitlines() if "ghost" in line]
        assert len(lines) == 1, lines
        assert f"model ghost: {ghost} does not exist" in lines[0] and "optional = true" in lines[0]
        listed = model_list(host)
        assert {name: model["state"] for name, model in listed.items()} == {
            "iris": "READY",
            "tiny": "READY",
            "ghost": "UNAVAILABLE",
        }
        assert "does not exist" in str(listed["ghost"]["reason"])
        index = requests.post(host.url + "/v2/repository/index", timeout=10).json()
        assert [entry["state"] for entry in index] == ["READY", "READY", "UNAVAILABLE"]
        assert requests.get(host.url + "/v2/health/ready", timeout=10).status_code == 200
        assert requests.get(host.url + "/v2/models/ghost/ready", timeout=10).status_code != 200
        assert kserve(host, "iris").status_code == 200 and infer_ok(host, "tiny")
        plans = host.plans()
        assert set(plans) == {"iris", "tiny"} and plans["iris"].priority == "nice 9 per worker"
        assert plans["tiny"].priority == "nice 0 per worker"
        check_every_worker(host)


def test_a_missing_required_model_stops_the_host_in_one_line(tmp_path: Path) -> None:
    ghost = tmp_path / "not-built" / "model.onnx"
    config = write_settings(
        tmp_path / "host.toml", iris_table("iris", two_workers(0.25)), text_table("ghost", ghost.parent)
    )
    done = run_once(config)
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 1, done
    assert [line for line in lines if "error" in line.lower()] == lines[-1:], lines
    assert f"model ghost: {ghost} does not exist" in lines[-1]
    assert "Starting gunicorn" not in done.stderr


@pytest.mark.parametrize(
    ("tables", "message"),
    [
        (
            [iris_table("iris", 'aliases = ["flowers"]\n'), iris_table("iris2", 'aliases = ["flowers"]\n')],
            "[models.iris2]: the name 'flowers' is already iris's",
        ),
        ([iris_table("iris"), iris_table("bad name!")], "[models.bad name!]: a model name is"),
        ([f'[model]\npath = "{IRIS / "model.onnx"}"\n', iris_table("iris")], "[model] and [models.<name>] together"),
    ],
    ids=["duplicate-alias", "bad-name", "model-and-models"],
)
def test_a_bad_settings_file_is_one_line_and_exit_1(tmp_path: Path, tables: list[str], message: str) -> None:
    config = write_settings(tmp_path / "host.toml", *tables)
    done = run_once(config)
    assert done.returncode == 1, done
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("onnxpool: error: ") and message in lines[0], lines


def test_a_flooded_model_sheds_its_own_excess_and_the_others_do_not(tmp_path: Path) -> None:
    """Shedding is per model: the slow model's queue (its own max_queue_ms, nginx stamps X-Request-Start)
    overflows into 503s while iris, looped on meanwhile, answers every request."""
    slow = build_slow_model(tmp_path / "slow.onnx")
    config = write_settings(
        tmp_path / "host.toml",
        f'[models.slow]\npath = "{slow}"\ntask = "tensors"\nwarmup_runs = 1\n{one_worker(1.0)}'
        "[models.slow.limits]\nmax_queue_ms = 100\n",
        iris_table("iris", one_worker(1.0)),
    )
    with running_host(tmp_path, config) as host:
        deadline = time.monotonic() + 3.0
        slow_statuses: list[int] = []
        iris_statuses: list[int] = []
        lock = threading.Lock()

        def flood() -> None:
            with requests.Session() as session:
                while time.monotonic() < deadline:
                    reply = session.post(host.url + "/v2/models/slow/infer", json=infer_body(50_000), timeout=30)
                    with lock:
                        slow_statuses.append(reply.status_code)

        threads = [threading.Thread(target=flood) for _ in range(12)]
        for thread in threads:
            thread.start()
        with requests.Session() as session:
            while time.monotonic() < deadline:
                iris_statuses.append(kserve_with(session, host).status_code)
        for thread in threads:
            thread.join(30)
    assert set(slow_statuses) == {200, 503} and slow_statuses.count(503) > 0, sorted(set(slow_statuses))
    assert iris_statuses and set(iris_statuses) == {200}, sorted(set(iris_statuses))


def kserve_with(session: requests.Session, host: Host) -> requests.Response:
    return session.post(f"{host.url}/v1/models/iris:predict", json={"instances": [SETOSA]}, timeout=30)


def test_the_host_tells_systemd_when_it_is_ready(tmp_path: Path) -> None:
    """`Type=notify`: the host (the unit's main process) says READY=1 once the front door is up, and
    RELOADING=1 then READY=1 around a HUP; its pools' masters never write to the socket."""
    config = write_settings(tmp_path / "host.toml", iris_table("iris", one_worker(0.25)))
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(str(path))
        listener.settimeout(60)
        with running_host(tmp_path, config, env_extra={"NOTIFY_SOCKET": str(path)}) as host:
            assert listener.recv(4096) == b"READY=1"
            assert kserve(host, "iris").status_code == 200
            host.server.process.send_signal(signal.SIGHUP)
            assert listener.recv(4096).startswith(b"RELOADING=1\nMONOTONIC_USEC=")
            assert listener.recv(4096) == b"READY=1"
            host.server.process.send_signal(signal.SIGTERM)
            assert listener.recv(4096) == b"STOPPING=1"
            host.server.process.wait(60)
            listener.settimeout(0.5)
            with pytest.raises(TimeoutError):
                listener.recv(4096)  # nothing from the pools' masters


# --- the shipped zoo ------------------------------------------------------------------------------


@pytest.mark.minilm
def test_the_shipped_zoo_serves_its_three_models(tmp_path: Path) -> None:
    if not MINILM.is_file():
        if os.environ.get("CI"):
            pytest.fail("models/minilm is not built: .ci/run runs `make minilm-check` before `make test`")
        pytest.skip("models/minilm not built (make minilm)")
    with running_host(tmp_path, REPO / "config" / "zoo.toml", cores=2) as host:  # its workers are "auto"
        assert {name: m["state"] for name, m in model_list(host).items()} == {
            "efficientnet-lite0": "READY",
            "iris": "READY",
            "all-minilm-l6-v2": "READY",
        }
        with openai_client(host) as client:
            reply = client.embeddings.create(model="sentence-transformers/all-MiniLM-L6-v2", input="hello")
        assert reply.model == "all-minilm-l6-v2" and len(reply.data[0].embedding) == 384
        assert kserve(host, "iris").json()["predictions"][0]["label"] == "setosa"
        check_every_worker(host)
