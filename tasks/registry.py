"""Find the task `[model] task` names and build it with its validated `[task]` table.

`[model] task` is `auto` (the default: see `chosen_task`), a built-in name
(`image-classification`, `tabular`, `tensors`, `text-embedding`, `text-classification`) or an import path:
`package.module:ClassName` (a module on the Python path) or `path/to/file.py:ClassName`
(a file; relative paths are relative to the settings file). The master does this once per
generation (at start and on HUP), before any fork; an error is one line naming the setting.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from onnxpool.config.loader import LoadedSettings, describe_validation_error
from onnxpool.tasks.api import Task, TaskConfigError, TaskSettings
from onnxpool.workers.model_info import ModelInfo

BUILT_IN: dict[str, str] = {
    "image-classification": "onnxpool.tasks.image.task:ImageClassification",
    "tabular": "onnxpool.tasks.tabular.task:Tabular",
    "tensors": "onnxpool.tasks.tensors.task:NamedTensors",
    "text-embedding": "onnxpool.tasks.text.embedding:TextEmbedding",
    "text-classification": "onnxpool.tasks.text.classification:TextClassification",
}
AUTO = "auto"
"""The default: image-classification for a model whose first input is an image batch (4-D), else tensors."""
"""Built-in tasks by name: imported only when named, like a user's."""

AnyTask = Task[Any, Any]


def task_class(spec: str) -> type[AnyTask]:
    """The Task subclass `spec` names (see the module doc); TaskConfigError if it cannot be had."""
    target = BUILT_IN.get(spec, spec)
    module_name, sep, class_name = target.rpartition(":")
    if not sep or not module_name or not class_name.isidentifier():
        known = ", ".join(BUILT_IN)
        raise TaskConfigError(
            f"model.task = {spec!r}: not a built-in task ({known}) nor 'package.module:Class' or 'file.py:Class'"
        )
    try:
        module = _load_file(Path(module_name)) if module_name.endswith(".py") else importlib.import_module(module_name)
    except TaskConfigError:
        raise
    except Exception as exc:  # a user's module may raise anything while it loads
        raise TaskConfigError(
            f"model.task = {spec!r}: cannot import {module_name}: {type(exc).__name__}: {exc}"
        ) from None
    found = getattr(module, class_name, None)
    if not (isinstance(found, type) and issubclass(found, Task)):
        raise TaskConfigError(
            f"model.task = {spec!r}: {module_name} has no Task subclass named {class_name} "
            "(subclass onnxpool.tasks.api.Task)"
        )
    if getattr(found, "__abstractmethods__", None):
        missing = ", ".join(sorted(found.__abstractmethods__))
        raise TaskConfigError(f"model.task = {spec!r}: {class_name} does not implement {missing}")
    return found


def _load_file(path: Path) -> Any:
    """Import a task from a file, under a module name unique to its path (so two files never collide)."""
    if not path.is_file():
        raise TaskConfigError(f"model.task: file {path} does not exist")
    name = f"onnxpool_user_task_{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise TaskConfigError(f"model.task: {path} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # registered first: dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def task_options(cls: type[AnyTask], loaded: LoadedSettings) -> TaskSettings:
    """The `[task]` table validated by the task's own model; errors name the key and its source."""
    table = loaded.settings.task
    try:
        return cls.settings_model.model_validate(table)
    except ValidationError as exc:
        message = describe_validation_error(exc, {"task": table}, loaded.key_sources(), cls.settings_model, ("task",))
        raise TaskConfigError(f"task {cls.name}: {message}") from None


def chosen_task(spec: str, model: ModelInfo | None) -> str:
    """`auto` resolved for this model: an image classifier when its first input is 4-D (or the model
    is not known yet, as in an app built in process), else plain named tensors. Others as given."""
    if spec != AUTO:
        return spec
    if model is None or len(model.inputs[0].shape) == 4:
        return "image-classification"
    return "tensors"


def build_task(loaded: LoadedSettings, model: ModelInfo | None = None) -> AnyTask:
    """The generation's task: its class, its validated options, whatever it reads at start (labels),
    and, given the model, checked against it (TaskConfigError: one line)."""
    cls = task_class(chosen_task(loaded.settings.model.task, model))
    task = cls(loaded.settings, task_options(cls, loaded))
    if model is not None:
        task.check(model)
    return task
