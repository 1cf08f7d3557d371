"""The task contract refuses only real mistakes, and knows what of a task shapes its replies.

At load (`tasks.registry.class_problem`): a class of the first task API is told only by signatures the
second cannot call (an optional extra parameter, a helper named `check`, are fine); a route the server
answers itself is refused in one line naming both. For the response cache's key
(`tasks.identity.task_identity`): the task's code (onnxpool's version for its own tasks, a digest of a
user's source, as it was run) and every file its `[task]` table names. Real servers: test_task_reload.py.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import BaseModel

from onnxpool import __version__
from onnxpool.config.loader import load_settings
from onnxpool.server.app import create_app
from onnxpool.tasks.api import Task, TaskConfigError, TaskSettings
from onnxpool.tasks.identity import code_fingerprint, files_fingerprint
from onnxpool.tasks.registry import BUILT_IN, FIRST_API, build_task, class_problem, task_class
from onnxpool.tasks.server_routes import SERVER_ROUTES
from onnxpool.workers.session import SessionRuntime
from tests.harness import DEMO_MODEL_INFO


class Probe(Task[Any, Any, TaskSettings]):
    """A complete task of the second API, to vary one method at a time."""

    name = "probe"

    def read(self, request: Any) -> Any:
        return np.zeros((1, 3), np.float32)

    def feeds(self, inputs: Any) -> Any:
        return {self.model.inputs[0].name: inputs}

    def reply(self, inputs: Any, result: Any) -> Any:
        return {}


def variant(**attributes: Any) -> type[Task[Any, Any, Any]]:
    return type("Variant", (Probe,), attributes)


def test_the_probe_and_every_built_in_task_pass() -> None:
    assert class_problem(Probe) == ""
    for spec in BUILT_IN:
        assert class_problem(task_class(spec)) == "", spec


@pytest.mark.parametrize(
    "methods",
    [
        {"check": lambda self, rows: None},  # a helper that happens to be named check
        {"check": lambda self, model: None, "bind": lambda self, model: None},  # second API, and a helper
        {"check": lambda self, model, strict: None},
        {"run": lambda self, inputs, runner, x=None: None},
        {"run": lambda self, inputs, runner, *more: None},
        {"feeds": lambda self, inputs, model=None: {}},
        {"feeds": lambda self, *args, **kwargs: {}},
        {"output_names": lambda self, model=None: None},
        {"tensor_signature": lambda self, model=None: None},
        {"__init__": lambda self, settings, served, options=None: None},
    ],
    ids=lambda methods: ", ".join(methods),
)
def test_code_the_second_api_can_call_is_not_taken_for_the_first(methods: dict[str, Any]) -> None:
    assert class_problem(variant(**methods)) == ""


@pytest.mark.parametrize(
    "methods",
    [
        {"check": lambda self, model: None},
        {"feeds": lambda self, inputs, model: {}},
        {"run": lambda self, inputs, model, session: None},
        {"output_names": lambda self, model: None},
        {"tensor_signature": lambda self, model: None},
        {"__init__": lambda self, settings, options: None},
    ],
    ids=lambda methods: ", ".join(methods),
)
def test_signatures_only_the_first_api_could_call_are_refused(methods: dict[str, Any]) -> None:
    assert class_problem(variant(**methods)) == FIRST_API


@pytest.mark.parametrize(
    ("route", "what"),
    [
        ("/v2/models/<model>/infer", "v2 infer"),
        ("/v2/models/<model>/ready", "v2 model readiness"),
        ("/v2/models/<model>", "v2 model metadata"),
        ("/v2/models", "the model list"),
        ("/v2", "v2 server metadata"),
        ("/v2/health/ready", "v2 readiness"),
        ("/v2/health/startup", "v2 health"),
        ("/v2/repository/models", "Triton's model repository"),
        ("/v1/models", "KServe v1 model list"),
        ("/v1/models/<model>", "KServe v1 model status"),
        ("/metrics", "Prometheus metrics"),
        ("/openapi.json", "the OpenAPI document"),
        ("/docs", "the API page"),
    ],
)
def test_a_route_the_server_answers_is_refused_naming_both(route: str, what: str) -> None:
    assert class_problem(variant(routes=(route,))) == f"route {route!r} is the server's own ({what})"


@pytest.mark.parametrize(
    "route", ["/predict", "/v1/models/<model>:predict", "/v1/embeddings", "/v2/models/<model>/classify", "/docsearch"]
)
def test_a_tasks_own_route_is_not_the_servers(route: str) -> None:
    assert class_problem(variant(routes=(route,))) == ""


def test_the_refusal_is_one_line_at_load(tmp_path: Path) -> None:
    (tmp_path / "infer.py").write_text(
        "from tests.test_task_contract import Probe\n\n\n"
        "class Infer(Probe):\n"
        '    routes = ("/predict", "/v2/models/<model>/infer")\n'
    )
    with pytest.raises(TaskConfigError) as err:
        task_class(f"{tmp_path / 'infer.py'}:Infer")
    message = str(err.value)
    assert message.endswith("Infer: route '/v2/models/<model>/infer' is the server's own (v2 infer)")
    assert "\n" not in message


def test_the_table_is_every_route_of_the_servers_app() -> None:
    """Each rule the app registers besides the task's is in the table the check reads, and nothing else is."""
    loaded = load_settings(environ={"ONNXPOOL_METRICS__ENABLED": "true", "ONNXPOOL_SERVER__DOCS": "true"})
    task = build_task(loaded, DEMO_MODEL_INFO)
    app = create_app(loaded.settings, SessionRuntime(), task=task)
    rules = {rule.rule for rule in app.url_map.iter_rules() if rule.endpoint != "static"}
    assert rules - set(task.routes) == set(SERVER_ROUTES)


# ------------------------------------------------------------------ what of a task shapes its replies


SCORER = """
from tests.test_task_contract import Probe


class Scorer(Probe):
    name = "scorer"

    def reply(self, inputs, result):
        return {REPLY}
"""


def test_onnxpools_own_tasks_count_by_its_version() -> None:
    for spec in BUILT_IN:
        assert code_fingerprint(task_class(spec)) == f"onnxpool {__version__}"


def test_a_task_files_code_counts_as_it_was_run(tmp_path: Path) -> None:
    file = tmp_path / "scorer.py"
    spec = f"{file}:Scorer"
    file.write_text(SCORER.replace("{REPLY}", '{"score": 1}'))
    first = code_fingerprint(task_class(spec))
    assert first.startswith(f"onnxpool {__version__}, onnxpool_user_task_scorer_") and "sha256:" in first
    assert code_fingerprint(task_class(spec)) == first  # the same code, loaded again
    file.write_text(SCORER.replace("{REPLY}", '{"scores": [1]}'))  # same second, other code
    changed = task_class(spec)
    assert code_fingerprint(changed) != first
    assert changed.reply(changed.__new__(changed), None, None) == {"scores": [1]}  # the code that was digested


def test_a_module_imported_by_name_counts_as_it_was_imported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "userpkg_identity"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "base.py").write_text(SCORER.replace("{REPLY}", '{"score": 1}'))
    (package / "settings.py").write_text(
        "from onnxpool.tasks.api import TaskSettings\n\n\nclass S(TaskSettings):\n    k: int = 1\n"
    )
    (package / "task.py").write_text(
        "from userpkg_identity.base import Scorer\nfrom userpkg_identity.settings import S\n\n\n"
        "class Child(Scorer):\n    settings_model = S\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        cls = task_class("userpkg_identity.task:Child")
        first = code_fingerprint(cls)
        # The base class's module and the settings model's count; the test module Probe lives in too.
        for module in ("userpkg_identity.base", "userpkg_identity.settings", "userpkg_identity.task", __name__):
            assert f"{module} sha256:" in first, first
        (package / "base.py").write_text(SCORER.replace("{REPLY}", '{"other": 2}'))
        # Python keeps the module it imported: the master runs the old code, and so says the key.
        assert code_fingerprint(task_class("userpkg_identity.task:Child")) == first
    finally:
        for name in [name for name in sys.modules if name.startswith("userpkg_identity")]:
            del sys.modules[name]


class Nested(BaseModel):
    vocabulary: Path | None = None


class WithFiles(TaskSettings):
    labels: Path
    extra: tuple[Path, ...] = ()
    folder: Path | None = None
    nested: Nested = Nested()
    name: str = "labels.txt"


def test_every_file_a_settings_path_names_counts_by_its_bytes(tmp_path: Path) -> None:
    labels, first, vocabulary = tmp_path / "labels.txt", tmp_path / "a.txt", tmp_path / "vocab.txt"
    for path in (labels, first, vocabulary):
        path.write_text(path.stem)
    settings = WithFiles(
        labels=labels,
        extra=(first, tmp_path / "missing.txt"),
        folder=tmp_path,
        nested=Nested(vocabulary=vocabulary),
    )
    found = files_fingerprint(settings)
    assert [part.split(" ")[0] for part in found.split(", ")] == ["labels", "extra[0]", "nested.vocabulary"]
    labels.write_text("other")
    assert files_fingerprint(settings) != found
    labels.write_text("labels")
    assert files_fingerprint(settings) == found
    assert files_fingerprint(WithFiles(labels=tmp_path / "gone.txt")) == ""


def test_the_image_tasks_labels_file_counts(tmp_path: Path) -> None:
    labels = tmp_path / "labels.txt"
    labels.write_text("".join(f"class {i}\n" for i in range(1000)))
    loaded = load_settings(environ={"ONNXPOOL_TASK__LABELS": str(labels)})
    task = build_task(loaded, DEMO_MODEL_INFO)
    assert files_fingerprint(task.settings).startswith("labels sha256:")
