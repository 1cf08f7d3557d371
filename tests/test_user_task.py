"""A user's task from a file outside the package, served through real gunicorn: the complete example
of docs/TASKS.md, taken from the page itself (code, settings and the reply it promises)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import requests

from tests.harness import REPO, running_server, start_server
from tests.tiny_models import linear_regressor

pytestmark = pytest.mark.slow

PAGE = (REPO / "docs" / "TASKS.md").read_text()


def _block(language: str, first_line: str) -> str:
    """The fenced code block of `language` on the page that starts with `first_line`."""
    for body in re.findall(rf"```{language}\n(.*?)```", PAGE, re.S):
        if body.startswith(first_line):
            return str(body)
    raise AssertionError(f"docs/TASKS.md has no {language} block starting {first_line!r}")


def _example(folder: Path, **task_settings: object) -> Path:
    (folder / "scorer.py").write_text(_block("python", '"""scorer.py'))
    config = _block("toml", "# scorer.toml")
    for key, value in task_settings.items():
        config = re.sub(rf"^{key} = .*$", f"{key} = {json.dumps(value)}", config, flags=re.M)
    linear_regressor(folder / "scorer.onnx", features=3)  # x (n, 3) -> y (n, 1) = 2 * sum
    (folder / "scorer.toml").write_text(config)
    return folder / "scorer.toml"


def test_the_documented_task_serves_from_a_file(tmp_path: Path) -> None:
    config = _example(tmp_path)
    shell = _block("sh", "onnxpool serve --config scorer.toml")
    sent = re.search(r"-d '(.*?)'", shell)
    promised = re.search(r"^# (\{.*\})$", shell, re.M)
    assert sent is not None and promised is not None
    with running_server(tmp_path, {"ONNXPOOL_SERVER__WORKERS": "2"}, config=config, workers=2) as server:
        reply = requests.post(server.url + "/score", data=sent.group(1), timeout=30)
        assert reply.status_code == 200, reply.text
        assert reply.json() == json.loads(promised.group(1))
        again = requests.post(server.url + "/score", data=sent.group(1), timeout=30)
        assert again.headers["X-Cache"] == "HIT" and again.content == reply.content
        bad = requests.post(server.url + "/score", json={"measurements": [[1, 2]]}, timeout=30)
        assert bad.status_code == 400 and "three numbers a row" in bad.json()["error"]
        assert requests.post(server.url + "/predict", json={}, timeout=30).status_code == 404  # only its routes
        paths = requests.get(server.url + "/openapi.json", timeout=30).json()["paths"]
        assert "post" in paths["/score"]
        assert "task: scorer; routes: POST /score" in server.log()


def test_a_bad_task_setting_stops_the_start_with_one_line(tmp_path: Path) -> None:
    config = _example(tmp_path, threshold=-1)
    server = start_server(tmp_path, {}, config=config, wait=False)
    try:
        assert server.process.wait(timeout=60) == 1
    finally:
        server.stop()
    assert f"task scorer: task.threshold = -1 (from file {config}): Input should be greater than 0" in server.log()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "image-classifier",
            "not a built-in task (image-classification, tabular, tensors, text-embedding, text-classification) nor",
        ),
        ("tests.nowhere:Scorer", "cannot import tests.nowhere: ModuleNotFoundError"),
        ("tests.tiny_models:Scorer", "tests.tiny_models has no Task subclass named Scorer"),
        ("tests.tiny_models:Path", "tests.tiny_models has no Task subclass named Path"),
        ("/nonexistent/scorer.py:Scorer", "file /nonexistent/scorer.py does not exist"),
    ],
)
def test_task_names_that_cannot_be_served_are_one_line(spec: str, message: str) -> None:
    from onnxpool.tasks.api import TaskConfigError
    from onnxpool.tasks.registry import task_class

    with pytest.raises(TaskConfigError) as err:
        task_class(spec)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_task_by_module_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from onnxpool.tasks.registry import task_class

    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "tasks.py").write_text(_block("python", '"""scorer.py'))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert task_class("mypkg.tasks:Scorer").name == "scorer"
