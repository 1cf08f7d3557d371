"""Run a task in this process, without HTTP: the served task, built as the server builds it.

For `onnxpool quantize`, the correctness checks (benchmarks/minilm_check.py), the tests, and
anyone testing a task of their own (docs/TASKS.md, "Testing a task in process"):

    from onnxpool.local import LocalRequest, load_task

    local = load_task("scorer.toml")                      # [model] path, or load_task(file, "other.onnx")
    reply = local.answer(LocalRequest.json({"measurements": [[1, 2, 3]]}, route="/score"))
    result = local.task.run(inputs, local.runner)        # or one step at a time

`load_task` does what the master does at start (settings validated, the task class imported
and checked, its `[task]` table validated, the task built and bound to the model's inputs
and outputs) and what a worker does after fork (`start_in_worker`, one onnxruntime session
with explicit thread counts, `workers.session.build_session`). No gates, no response cache,
no metrics: errors are the task's own `onnxpool.tasks.errors` exceptions, raised.

Unlike the server's master, this module imports onnxruntime (inside its functions): it is a
tool's process, never gunicorn's.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onnxpool.config.loader import LoadedSettings, load_settings
from onnxpool.tasks.api import Feeds, JsonDocument, Outputs
from onnxpool.tasks.registry import AnyTask, build_task
from onnxpool.workers.model_info import ModelInfo

if TYPE_CHECKING:
    import onnxruntime as ort


class SessionRunner:
    """`onnxpool.tasks.api.Runner` over an onnxruntime session: what `Task.run` gets in a worker, untimed."""

    def __init__(self, session: ort.InferenceSession) -> None:
        self.session = session
        self._all = [o.name for o in session.get_outputs()]

    def infer(self, feeds: Feeds, output_names: Sequence[str] | None = None) -> Outputs:
        names = list(output_names) if output_names is not None else self._all
        return dict(zip(names, self.session.run(names, dict(feeds)), strict=True))

    def phase(self, name: str) -> AbstractContextManager[None]:
        return nullcontext()

    def span(self, name: str, attributes: Mapping[str, Any] | None = None) -> AbstractContextManager[dict[str, Any]]:
        return nullcontext({})  # untraced


def open_session(model: Path, threads: int = 1, optimization: str = "all") -> ort.InferenceSession:
    """One CPU session as a worker builds it (explicit thread counts, the same disabled optimisers)."""
    from onnxpool.workers.session import build_session

    return build_session(model, threads, optimization=optimization)


def model_info(session: ort.InferenceSession) -> ModelInfo:
    """The model's inputs and outputs as the master's preflight reads them."""
    from onnxpool.workers.session import model_info_of

    return model_info_of(session)


def settings_for(
    settings: str | os.PathLike[str] | LoadedSettings,
    model: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> LoadedSettings:
    """Settings as the server loads them: a file (a path, or a shipped name such as "minilm") with
    `overrides` ("task.truncate": True, ...), or settings already loaded; `model` replaces `[model] path`.

    The environment (ONNXPOOL_*) is not read unless given as `environ`: a local run is reproducible.
    """
    if isinstance(settings, LoadedSettings):
        if overrides:
            raise ValueError("overrides apply to a settings file; load the settings with them instead")
        loaded = settings
    else:
        loaded = load_settings(settings, environ={} if environ is None else environ, overrides=overrides)
    if model is None:
        return loaded
    path = Path(model).resolve()
    model_table = loaded.settings.model.model_copy(update={"path": path})
    return dataclasses.replace(loaded, settings=loaded.settings.model_copy(update={"model": model_table}))


@dataclass
class LocalTask:
    """The served task and a runner over its own session, in this process."""

    task: AnyTask
    runner: SessionRunner
    settings: LoadedSettings

    def answer(self, request: LocalRequest) -> JsonDocument:
        """read -> run -> reply, as the server's data plane runs them (without cache or gates)."""
        inputs = self.task.read(request)
        return self.task.reply(inputs, self.task.run(inputs, self.runner))


def load_task(
    settings: str | os.PathLike[str] | LoadedSettings,
    model: str | os.PathLike[str] | None = None,
    *,
    overrides: Mapping[str, Any] | None = None,
    threads: int = 1,
) -> LocalTask:
    """The task `settings` serve, built and bound to `model` (default `[model] path`), with a
    session on `threads` cores; TaskConfigError/ConfigError: the one line the server would print."""
    loaded = settings_for(settings, model, overrides)
    session = open_session(loaded.settings.model.path, threads, loaded.settings.model.graph_optimization_level)
    task = build_task(loaded, model_info(session))
    task.start_in_worker(threads)
    return LocalTask(task, SessionRunner(session), loaded)


@dataclass(frozen=True)
class LocalRequest:
    """`onnxpool.tasks.api.RequestParts` of a request made in process (for `Task.read`)."""

    data: bytes
    content_type: str = "application/json"
    route: str = "/predict"
    query: Mapping[str, str] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    """Request headers as a task reads them (`RequestParts.headers`); names as given."""

    @property
    def mimetype(self) -> str:
        return self.content_type.partition(";")[0].strip().lower()

    def body(self) -> bytes:
        return self.data

    @classmethod
    def json(cls, document: Any, route: str = "/predict", query: Mapping[str, str] | None = None) -> LocalRequest:
        """A JSON body."""
        return cls(json.dumps(document).encode(), "application/json", route, dict(query or {}))

    @classmethod
    def files(
        cls,
        files: Sequence[bytes],
        field_name: str = "image",
        route: str = "/predict",
        query: Mapping[str, str] | None = None,
    ) -> LocalRequest:
        """A multipart/form-data body with `files` in one field, as `curl -F image=@a.jpg -F image=@b.jpg` sends."""
        from werkzeug.datastructures import FileStorage, MultiDict
        from werkzeug.test import encode_multipart

        parts = MultiDict(
            [(field_name, FileStorage(io.BytesIO(data), filename=f"file{i}")) for i, data in enumerate(files)]
        )
        boundary, body = encode_multipart(parts)
        return cls(body, f"multipart/form-data; boundary={boundary}", route, dict(query or {}))
