"""A user's task through real gunicorn across HUPs: replies are never stale, and workers finish their task.

The response cache's key holds the task's code and the files its `[task]` table names (tasks.identity):
a HUP after `reply` changed, or after the labels file a settings path names changed (and the task
writes no `fingerprint()`), computes the same request anew. A worker that stops (a HUP's replacement,
the server's TERM) runs the task's `finish()`; what it raises is one logged line, and the exit stays clean.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import requests

from tests.harness import Server, running_server
from tests.test_reload import hup_and_wait
from tests.tiny_models import linear_regressor

pytestmark = pytest.mark.slow

TASK = """
import json
import os
from pathlib import Path

import numpy as np

from onnxpool.tasks.api import Task, TaskSettings


class ProbeSettings(TaskSettings):
    labels: Path
    markers: Path | None = None


class Probe(Task):
    name = "probe"
    settings_model = ProbeSettings
    routes = ("/probe",)

    def __init__(self, settings, served):
        super().__init__(settings, served)
        self.labels = settings.labels.read_text().split()

    def read(self, request):
        return np.asarray(json.loads(request.body())["x"], dtype=np.float32)

    def canonical(self, inputs):
        return [inputs.tobytes(), str(inputs.shape).encode()]

    def feeds(self, inputs):
        return {"x": inputs}

    def reply(self, inputs, result):
        y = float(result["y"][0, 0])
        return REPLY

    def finish(self):
        if self.settings.markers is not None:
            (self.settings.markers / str(os.getpid())).write_text("finished")
            raise RuntimeError("nothing left to release")
"""
FIRST_REPLY = '{"label": self.labels[0], "y": y}'
SECOND_REPLY = '{"answer": {"label": self.labels[0], "value": y}}'
WORKERS = 2


def _site(folder: Path, reply: str, labels: str, markers: Path | None = None) -> Path:
    """The task file, its model, its labels and its settings in `folder`; the settings file."""
    (folder / "probe.py").write_text(TASK.replace("REPLY", reply))
    (folder / "labels.txt").write_text(labels)
    linear_regressor(folder / "probe.onnx", features=3)  # y = 2 * (a + b + c)
    config = folder / "probe.toml"
    marker_line = f'markers = "{markers}"\n' if markers is not None else ""
    config.write_text(
        '[model]\nname = "probe"\npath = "probe.onnx"\ntask = "probe.py:Probe"\nwarmup_runs = 1\n'
        f'[task]\nlabels = "labels.txt"\n{marker_line}'
    )
    return config


def _probe(server: Server) -> tuple[str, object]:
    reply = requests.post(server.url + "/probe", json={"x": [[1, 2, 3]]}, timeout=30)
    assert reply.status_code == 200, reply.text
    return reply.headers["X-Cache"], reply.json()


def test_a_hup_after_the_tasks_code_changed_computes_anew(tmp_path: Path) -> None:
    config = _site(tmp_path, FIRST_REPLY, "small\nlarge\n")
    settings = {"ONNXPOOL_SERVER__WORKERS": str(WORKERS)}
    with running_server(tmp_path, settings, config=config, workers=WORKERS) as server:
        assert _probe(server) == ("MISS", {"label": "small", "y": 12.0})
        assert _probe(server) == ("HIT", {"label": "small", "y": 12.0})
        (tmp_path / "probe.py").write_text(TASK.replace("REPLY", SECOND_REPLY))
        hup_and_wait(server, WORKERS)
        assert _probe(server) == ("MISS", {"answer": {"label": "small", "value": 12.0}})
        assert _probe(server) == ("HIT", {"answer": {"label": "small", "value": 12.0}})


def test_a_hup_after_a_settings_file_changed_computes_anew(tmp_path: Path) -> None:
    config = _site(tmp_path, FIRST_REPLY, "small\nlarge\n")  # the task writes no fingerprint()
    settings = {"ONNXPOOL_SERVER__WORKERS": str(WORKERS)}
    with running_server(tmp_path, settings, config=config, workers=WORKERS) as server:
        assert _probe(server) == ("MISS", {"label": "small", "y": 12.0})
        assert _probe(server) == ("HIT", {"label": "small", "y": 12.0})
        (tmp_path / "labels.txt").write_text("tiny\nhuge\n")
        hup_and_wait(server, WORKERS)
        assert _probe(server) == ("MISS", {"label": "tiny", "y": 12.0})
        assert _probe(server) == ("HIT", {"label": "tiny", "y": 12.0})


def test_every_worker_finishes_its_task_when_it_stops(tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    config = _site(tmp_path, FIRST_REPLY, "small\nlarge\n", markers)
    settings = {"ONNXPOOL_SERVER__WORKERS": str(WORKERS)}
    with running_server(tmp_path, settings, config=config, workers=WORKERS) as server:
        first = set(server.ready_workers())
        assert len(first) == WORKERS and not list(markers.iterdir())
        (tmp_path / "labels.txt").write_text("large\nsmall\n")  # a change: a HUP that reads none forks nothing
        hup_and_wait(server, WORKERS)  # the first generation's workers stop once the new ones are warm
        assert {int(marker.name) for marker in markers.iterdir()} == first
        second = set(server.ready_workers()) - first
        assert len(second) == WORKERS
        server.signal(signal.SIGTERM)  # the master stops its workers gracefully
        assert server.process.wait(timeout=60) == 0
        assert {int(marker.name) for marker in markers.iterdir()} == first | second
        raised = [line for line in server.log().splitlines() if "finish() raised" in line]
        assert len(raised) == 2 * WORKERS, server.log()
        assert all("task probe: finish() raised RuntimeError: nothing left to release" in line for line in raised)
