"""What of a task shapes its replies besides the request and the model: its code, its files, what it read.

Part of every response-cache key (`server.reply_cache.settings_fingerprint`), worked out in the master
once per generation (at start and on every HUP), never per request, so that no change to any of these
is answered from replies made before it:

- the task's code: onnxpool's version stands for onnxpool's own classes (they change only with a
  release); every other module of the task class, its bases and its settings model (the user's file,
  a base class of the user's) counts by a digest of its source, as it was when it was run;
- every file a `Path` of the validated `[task]` table names (a labels file...), by a digest of its
  bytes, whether or not the task writes `fingerprint()`;
- `Task.fingerprint()`: whatever else the task read at start.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from onnxpool import __version__
from onnxpool.tasks.api import Task, TaskSettings

_SOURCES: dict[str, str] = {}
"""The digest of each module's source as it was when the module was run, by module name. A task file is
run anew at every load (`remember_source`); a module imported by name is run once per process and kept
by Python, so its file is read once: a file edited since is not the code the master runs."""

_FOUNDATIONS = frozenset((*Task.__mro__, *TaskSettings.__mro__))
"""What every task and settings model stands on (abc, typing, pydantic): no code of the task's."""


def remember_source(module: str, source: bytes) -> None:
    """`module` was just run from `source` (a task file, `tasks.registry`)."""
    _SOURCES[module] = _digest(source)


def task_identity(task: Task[Any, Any, Any]) -> dict[str, str]:
    """What of `task` shapes its replies (see the module doc), for the cache key."""
    return {
        "code": code_fingerprint(type(task)),
        "files": files_fingerprint(task.settings),
        "read": task.fingerprint(),
    }


def code_fingerprint(cls: type[Task[Any, Any, Any]]) -> str:
    """onnxpool's version, and a digest of the source of each module of `cls`'s and its settings model's
    classes that is not onnxpool's own."""
    classes = (*cls.__mro__, *cls.settings_model.__mro__)
    modules = sorted({k.__module__ for k in classes if k not in _FOUNDATIONS and not _is_onnxpools(k.__module__)})
    return ", ".join([f"onnxpool {__version__}", *(f"{module} {_source_digest(module)}" for module in modules)])


def files_fingerprint(settings: BaseModel) -> str:
    """A digest of each file a path of `settings` names (nested tables too), by its key."""
    return ", ".join(f"{key} {_file_digest(path)}" for key, path in _paths(settings) if path.is_file())


def _is_onnxpools(module: str) -> bool:
    return module == "onnxpool" or module.startswith("onnxpool.")


def _source_digest(module: str) -> str:
    known = _SOURCES.get(module)
    if known is None:
        file = getattr(sys.modules.get(module), "__file__", None)
        known = _SOURCES.setdefault(module, _file_digest(Path(file)) if file else "no source file")
    return known


def _paths(settings: BaseModel, prefix: str = "") -> Iterator[tuple[str, Path]]:
    """Every `Path` among the values of `settings` (`Path | None`, a tuple of paths, a nested table)."""
    for field in type(settings).model_fields:
        key, value = prefix + field, getattr(settings, field)
        if isinstance(value, BaseModel):
            yield from _paths(value, key + ".")
        elif isinstance(value, Path):
            yield key, value
        elif isinstance(value, tuple):
            yield from ((f"{key}[{i}]", item) for i, item in enumerate(value) if isinstance(item, Path))


def _file_digest(path: Path) -> str:
    try:
        with path.open("rb") as file:
            return "sha256:" + hashlib.file_digest(file, "sha256").hexdigest()
    except OSError as exc:  # the task itself says what it cannot read; the key says it could not be read
        return f"unreadable ({exc.strerror})"


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()
