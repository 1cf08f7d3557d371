"""The rehearsal: before any fork, the task answers its own sample request on the real model.

A task that does not fit its model used to be found by the first caller: the start-up checks
compared names and ranks, and the warm-up ran the session on zeros, not the task's own path.
So an image task fed NCHW to a channels-last model, three channels to a grey one, two images to
a batch-1 model, and every request got a 500. Here the master (which never imports onnxruntime)
runs the whole request path on `Task.sample_request()`: `read` and `run` as a worker would,
with `infer` going to the model in a child process (`onnxpool.workers.model_child`), then
`rehearsed` and `reply`, whose document must encode as JSON. Any failure is one
TaskConfigError line: the start stops, or a HUP keeps the last good model.

The feeds the sample made are the warm-up of every worker: a model with dynamic height and
width, or string inputs, is warmed up on what the task really sends, not on zeros of size 1.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from onnxpool.tasks import jsonfast
from onnxpool.tasks.api import Feeds, JsonDocument, Outputs, Task, TaskConfigError
from onnxpool.tasks.errors import OnnxpoolError
from onnxpool.workers.model_child import ModelChild, ModelChildError

log = logging.getLogger("onnxpool.tasks")

AnyTask = Task[Any, Any, Any]


@dataclass(frozen=True)
class Rehearsal:
    """What the sample request showed: the feeds of its (first) inference, and the reply."""

    feeds: dict[str, np.ndarray]
    reply: JsonDocument
    route: str


class _ChildRunner:
    """`onnxpool.tasks.api.Runner` over the child's session; keeps the first feeds for the warm-up."""

    def __init__(self, child: ModelChild) -> None:
        self.child = child
        self.feeds: dict[str, np.ndarray] | None = None
        self.failure = ""

    def infer(self, feeds: Feeds, output_names: Sequence[str] | None = None) -> Outputs:
        if self.feeds is None:
            self.feeds = {name: np.asarray(value) for name, value in feeds.items()}
        try:
            return self.child.infer(feeds, output_names)
        except ModelChildError as exc:
            self.failure = _describe_feeds(feeds)
            raise _Refused(str(exc)) from None

    def phase(self, name: str) -> AbstractContextManager[None]:
        return nullcontext()

    def span(self, name: str, attributes: Mapping[str, Any] | None = None) -> AbstractContextManager[dict[str, Any]]:
        return _no_span()


@contextmanager
def _no_span() -> Any:
    yield {}


class _Refused(Exception):
    """onnxruntime refused what the task fed it."""


def _describe_feeds(feeds: Feeds) -> str:
    return ", ".join(f"{name} {np.asarray(value).dtype}{list(np.shape(value))}" for name, value in feeds.items())


def rehearse(task: AnyTask, model_file: Path, optimization: str = "all", prepacking: bool = True) -> Rehearsal | None:
    """Run `task`'s sample request end to end on `model_file` (see the module doc); None when it has none."""
    sample = task.sample_request()
    if sample is None:
        return None
    where = f"task {task.name} on its own sample request (POST {sample.route})"
    with ModelChild(model_file, optimization, prepacking) as child, _serial_in_master():
        runner = _ChildRunner(child)
        try:
            inputs = task.read(sample)
            result = task.run(inputs, runner)
            task.rehearsed(inputs, result)
            reply = task.reply(inputs, result)
            jsonfast.dumps(reply)
        except TaskConfigError:
            raise
        except _Refused as exc:
            raise TaskConfigError(
                f"{where}: the model refused the feeds ({runner.failure}): {exc}{_hint(task)}"
            ) from None
        except OnnxpoolError as exc:
            raise TaskConfigError(f"{where}: answered {exc.status} {exc.message}{_hint(task)}") from None
        except Exception as exc:  # the task's own code on this model's outputs: a misfit, said in one line
            raise TaskConfigError(f"{where}: {type(exc).__name__}: {exc}{_hint(task)}") from None
    if runner.feeds is None:
        raise TaskConfigError(f"{where}: it ran no inference")
    return Rehearsal(runner.feeds, reply, sample.route)


# The master forks the workers after this: a thread pool that a library makes lazily while the task
# runs here would be copied into every worker without its threads, and the first worker call that
# uses it would wait forever. The one library of the built-in tasks that does so is Hugging Face
# tokenizers (its rayon pool, made on the first batch encode unless TOKENIZERS_PARALLELISM says
# serial, which it reads on every call: tasks/text/tokenizing.py); the sample is encoded serially.
SERIAL_HERE = {"TOKENIZERS_PARALLELISM": "false"}


@contextmanager
def _serial_in_master() -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in SERIAL_HERE}
    os.environ.update(SERIAL_HERE)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _hint(task: AnyTask) -> str:
    """Where to look: the task's `[task]` table (or `[model] task` for the wrong task)."""
    return f" (check [task] of task {task.name}, or [model] task; docs/TASKS.md)"
