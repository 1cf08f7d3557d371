"""Find the task `[model] task` names and build it with its validated `[task]` table.

`[model] task` is `auto` (the default: see `chosen_task`), a built-in name
(`image-classification`, `tabular`, `tensors`, `text-embedding`, `text-classification`) or an import path:
`package.module:ClassName` (a module on the Python path) or `path/to/file.py:ClassName`
(a file; relative paths are relative to the settings file). The master does this once per
generation (at start and on HUP), before any fork: the class is imported and checked (its name,
routes, settings model and methods), its `[task]` table validated, the task built and bound to
the model. An error is one line naming the setting, or what to change in the class.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import logging
import re
import sys
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError

from onnxpool.config.loader import LoadedSettings, describe_validation_error
from onnxpool.tasks.api import PATH_BASE, ServedModel, Task, TaskConfigError, TaskSettings
from onnxpool.tasks.identity import remember_source
from onnxpool.tasks.server_routes import server_route_taken
from onnxpool.workers.model_info import ModelInfo

log = logging.getLogger("onnxpool.tasks")

BUILT_IN: dict[str, str] = {
    "image-classification": "onnxpool.tasks.image.task:ImageClassification",
    "tabular": "onnxpool.tasks.tabular.task:Tabular",
    "tensors": "onnxpool.tasks.tensors.task:NamedTensors",
    "text-embedding": "onnxpool.tasks.text.embedding:TextEmbedding",
    "text-classification": "onnxpool.tasks.text.classification:TextClassification",
}
"""Built-in tasks by name: imported only when named, like a user's."""
AUTO = "auto"
"""The default: image-classification for a model whose first input is an image batch (4-D), else tensors."""
TASK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
ROUTE = re.compile(r"^(/[A-Za-z0-9_.~:-]*|/<model>[A-Za-z0-9_.~:-]*)+$")
FIRST_API = (
    "it is written for the first task API: rename check(model) to bind(model), drop the model argument of "
    "feeds, run, output_names and tensor_signature (use self.model), read the [task] table as self.settings "
    "(was self.options) and the model's name and limits as self.served (docs/TASKS.md, 'From the first task API')"
)
FIRST_API_ARITY = {"feeds": 3, "run": 4, "output_names": 2, "tensor_signature": 2}
"""Required positional parameters (self included) of the methods the first task API passed the model to:
`feeds(inputs, model)`, `run(inputs, model, session)`, `output_names(model)`, `tensor_signature(model)`."""

AnyTask = Task[Any, Any, Any]


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
    problem = class_problem(found)
    if problem:
        raise TaskConfigError(f"model.task = {spec!r}: {class_name}: {problem}")
    return found


def class_problem(cls: type[AnyTask]) -> str:
    """What makes `cls` unusable as a task ("" when nothing): checked at load, before it is built."""
    if _written_for_first_api(cls):
        return FIRST_API
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not TASK_NAME.match(name):
        return f"name = {name!r}: give the class a short name (letters, digits, '_ . -'), e.g. name = \"scorer\""
    if not (isinstance(cls.settings_model, type) and issubclass(cls.settings_model, TaskSettings)):
        return f"settings_model = {cls.settings_model!r} is not a subclass of onnxpool.tasks.api.TaskSettings"
    routes = cls.routes
    if not isinstance(routes, tuple) or not routes or not all(isinstance(r, str) for r in routes):
        return f'routes = {routes!r}: a tuple of one or more paths, e.g. ("/predict",)'
    for route in routes:
        if not ROUTE.match(route) or route.count("<") != route.count("<model>"):
            return f"route {route!r}: a path of letters, digits and '_ . ~ : -', with <model> as its only variable"
        taken = server_route_taken(route)
        if taken:
            return f"route {route!r} is the server's own ({taken})"
    if len(set(routes)) != len(routes):
        return f"routes = {routes!r} repeat a path"
    if not isinstance(cls.content_types, tuple) or not all(isinstance(c, str) for c in cls.content_types):
        return f"content_types = {cls.content_types!r}: a tuple of media types"
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if missing:
        return f"does not implement {', '.join(missing)}"
    if cls.feeds is Task.feeds and cls.run is Task.run:
        return "implements neither feeds (one inference of the model) nor run (its own)"
    return ""


def _written_for_first_api(cls: type[AnyTask]) -> bool:
    """A class of the first task API, told by what the second cannot call: `check(model)` in a class without
    `bind`, `__init__(settings, options)`, or the model required by a per-request method. An optional extra
    parameter, or a helper named `check` of another shape, is no sign."""
    if cls.bind is Task.bind and _required_parameters(getattr(cls, "check", None))[1:] == ["model"]:
        return True
    if cls.__init__ is not Task.__init__ and "options" in _required_parameters(cls.__init__):
        return True
    return any(
        getattr(cls, method) is not getattr(Task, method) and len(_required_parameters(getattr(cls, method))) >= arity
        for method, arity in FIRST_API_ARITY.items()
    )


def _required_parameters(function: object) -> list[str]:
    """The positional parameters a call of `function` must pass (no default, not *args), in order; none
    when it is not a function."""
    try:
        parameters = inspect.signature(function).parameters.values() if callable(function) else ()
    except (TypeError, ValueError):  # a builtin without a signature: not the user's code
        return []
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in parameters if p.kind in positional and p.default is inspect.Parameter.empty]


def _load_file(path: Path) -> Any:
    """Import a task from a file, under a module name unique to its path (so two files never collide)."""
    if not path.is_file():
        raise TaskConfigError(f"model.task: file {path} does not exist")
    name = f"onnxpool_user_task_{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise TaskConfigError(f"model.task: {path} cannot be imported as a Python module")
    source = path.read_bytes()  # read once: the code run is the code whose digest keys the replies
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # registered first: dataclasses and pickling look the module up by name
    try:
        # Compiled from these bytes, not by the loader: its bytecode cache trusts the file's mtime and
        # size, so an edit in the same second that keeps the size would run the old code after a HUP.
        exec(compile(source, path, "exec", dont_inherit=True), module.__dict__)
    except BaseException:
        del sys.modules[name]
        raise
    remember_source(name, source)
    return module


def task_settings(cls: type[AnyTask], loaded: LoadedSettings) -> TaskSettings:
    """The `[task]` table validated by the task's own model; errors name the key and its source."""
    return validate_task_table(cls.settings_model, cls.name, loaded)


SettingsT = TypeVar("SettingsT", bound=TaskSettings)


def validate_task_table(model: type[SettingsT], task_name: str, loaded: LoadedSettings) -> SettingsT:
    """`[task]` validated by `model` (relative paths resolved against the settings file); TaskConfigError
    naming the key and its source. Also for tools that need one task's settings (quantize's images)."""
    table = loaded.settings.task
    ignored = sorted(key for key in loaded.moved_to_task if key not in model.model_fields)
    if ignored:  # written in [model] for the image task before [task] existed: other tasks never read them
        log.info("settings: task %s has no %s: ignored", task_name, ", ".join(f"[task] {key}" for key in ignored))
        table = {key: value for key, value in table.items() if key not in ignored}
    try:
        return model.model_validate(table, context={PATH_BASE: loaded.task_path_bases})
    except ValidationError as exc:
        message = describe_validation_error(exc, {"task": table}, loaded.key_sources(), model, ("task",))
        raise TaskConfigError(f"task {task_name}: {message}") from None


def served_model(loaded: LoadedSettings) -> ServedModel:
    """What a task knows of its model besides the tensors, from the settings."""
    model = loaded.settings.model
    return ServedModel(
        name=model.name, version=model.version, path=model.path, limits=loaded.settings.limits, aliases=model.aliases
    )


def chosen_task(spec: str, model: ModelInfo | None) -> str:
    """`auto` resolved for this model: an image classifier when its first input is 4-D (or the model
    is not known yet, as in an app built in process); tabular for what converters of scikit-learn,
    LightGBM and XGBoost models write and no plain tensor carries (a ZipMap output, string
    columns); else plain named tensors. Others as given."""
    if spec != AUTO:
        return spec
    if model is None or len(model.inputs[0].shape) == 4:
        return "image-classification"
    if _converted_tabular(model):
        return "tabular"
    return "tensors"


def _converted_tabular(model: ModelInfo) -> list[str]:
    """What marks a model as a converted scikit-learn/LightGBM/XGBoost one: its ZipMap outputs and string inputs,
    else rows in (2-D inputs) and a classifier's label and probability outputs out."""
    zipmaps = [
        f"output '{t.name}' is a ZipMap ({t.onnx_type})" for t in model.outputs if t.onnx_type.startswith("seq(")
    ]
    strings = [f"input '{t.name}' is a string column" for t in model.inputs if t.onnx_type == "tensor(string)"]
    if zipmaps or strings:
        return zipmaps + strings
    # A classifier's pair, as skl2onnx (zipmap=False) and onnxmltools' XGBoost write it: a label and probabilities.
    rows = all(len(t.shape) == 2 for t in model.inputs)
    label = next((t for t in model.outputs if len(t.shape) == 1 and t.dtype is not None and t.dtype.kind in "iu"), None)
    scores = next((t for t in model.outputs if len(t.shape) == 2 and t.dtype is not None and t.dtype.kind == "f"), None)
    if rows and label is not None and scores is not None:
        return [f"a classifier's outputs: label '{label.name}' and probabilities '{scores.name}'"]
    return []


def why_chosen(model: ModelInfo) -> str:
    """Why `auto` chose its task for this model (the start-up line)."""
    marks = _converted_tabular(model) if len(model.inputs[0].shape) != 4 else []
    if marks:
        return ", ".join(marks[:3])
    return f"the model's first input has shape {list(model.inputs[0].shape)}"


def build_task(loaded: LoadedSettings, model: ModelInfo) -> AnyTask:
    """The generation's task: its class, its validated settings, whatever it reads at start (labels),
    bound to the model (TaskConfigError: one line)."""
    cls = task_class(chosen_task(loaded.settings.model.task, model))
    task = cls(task_settings(cls, loaded), served_model(loaded))
    bind(task, model)
    return task


def bind(task: AnyTask, model: ModelInfo) -> None:
    """Give `task` its model (master, before fork): `task.model`, then the task's own `bind`."""
    task.model = model
    try:
        task.bind(model)
    except TaskConfigError:
        raise
    except Exception as exc:  # a user's task may raise anything while it reads its files or checks the model
        raise TaskConfigError(f"task {type(task).__name__}: bind() raised {type(exc).__name__}: {exc}") from None
