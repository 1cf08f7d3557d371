"""The requests a served task is measured on in process: what a client of each built-in task sends.

`onnxpool tune` on several models weighs each model by what one request costs a worker, so each
model is measured on its task's own request, read -> run -> reply -> JSON bytes as the data plane
runs them (`onnxpool.local`; no HTTP, no cache, no gates), in a `measure.limit` process:

- image-classification: the cat JPEG (`measure.paths.CAT_JPEG`) as multipart, the body `onnxpool
  bench --mode predict` sends (`measure.payloads.predict_request`): decode, preprocess, infer;
- tabular: rows of the model's features (`{"instances": [[...]]}`);
- text-embedding / text-classification: sentences of everyday lengths (6 to 30 words), one
  request after another, so tokenizing and the padded lengths are a real client's;
- tensors: random tensors of the model's input shapes, as JSON (`{"inputs": {...}}`);
- any other task (a user's): its model on random tensors of its shapes (the task's own
  reading and replying are not measured; the description says so).

Runs inside the measuring process (it imports onnxruntime through `onnxpool.local`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from onnxpool.measure.paths import CAT_JPEG
from onnxpool.tasks.registry import BUILT_IN, AnyTask

if TYPE_CHECKING:
    from onnxpool.config.loader import LoadedSettings
    from onnxpool.local import LocalRequest

SENTENCES = (
    "The weather is lovely today.",
    "Can you recommend a good Italian restaurant near the train station?",
    "My order arrived two days late and the box was damaged, but the headphones themselves work fine.",
    "How do I reset my password?",
    "The quarterly report shows revenue growing by eight percent while operating costs stayed flat "
    "compared with the same period last year.",
    "A cat is sleeping on the warm windowsill.",
    "Please cancel my subscription at the end of this billing cycle and send me a confirmation email.",
    "Where can I find the user manual for this washing machine?",
)
"""Everyday sentences of 6 to 30 words: a request of a text task holds one (or `batch`) of them."""
ROWS = 8
"""Distinct tabular rows (random, seeded) the requests cycle through."""


def built_in_name(task: AnyTask) -> str | None:
    """The built-in task `task` is (its class is the registry's), else None (a user's task)."""
    spec = f"{type(task).__module__}:{type(task).__qualname__}"
    return task.name if BUILT_IN.get(task.name) == spec else None


def sample_requests(
    task: AnyTask, feeds: Callable[[], dict[str, np.ndarray]], batch: int = 1
) -> tuple[list[LocalRequest], str]:
    """The requests to cycle through (each of `batch` items) and what they are; no requests for a
    task that has no sample (a user's: measure its model on `feeds()` instead)."""
    from onnxpool.local import LocalRequest

    name = built_in_name(task)
    route = task.routes[0]
    per = f"{batch} per request" if batch > 1 else "one per request"
    if name == "image-classification":
        from onnxpool.measure.payloads import predict_request

        prepared = predict_request(CAT_JPEG, batch, route)
        content_type = prepared.headers["Content-Type"]
        return [LocalRequest(prepared.body, content_type, route)], f"{CAT_JPEG.name} as multipart, {per}"
    if name == "tabular":
        from onnxpool.tasks.tabular.task import Tabular

        assert isinstance(task, Tabular)
        columns = task.layout.columns
        width = len(columns)
        rng = np.random.default_rng(0)

        def value(kind: str) -> object:  # of the feature's type: a string column takes text, an int64 one integers
            if kind == "U":
                return f"category {int(rng.integers(0, 5))}"
            if kind in "iu":
                return int(rng.integers(0, 8))
            if kind == "b":
                return bool(rng.integers(0, 2))
            return round(float(rng.uniform(0, 8)), 2)

        requests = [
            LocalRequest.json({"instances": [[value(c.kind) for c in columns] for _ in range(batch)]}, route)
            for _ in range(ROWS)
        ]
        return requests, f"rows of {width} features, {per}"
    if name in ("text-embedding", "text-classification"):
        key = "input" if name == "text-embedding" else "inputs"
        extra = {"model": task.served.name} if name == "text-embedding" else {}
        requests = [
            LocalRequest.json({key: [SENTENCES[(i + k) % len(SENTENCES)] for k in range(batch)], **extra}, route)
            for i in range(len(SENTENCES))
        ]
        return requests, f"{len(SENTENCES)} sentences of 6-30 words, {per}"
    if name == "tensors":
        tensors = {key: value.tolist() for key, value in feeds().items()}
        return [LocalRequest.json({"inputs": tensors}, route)], f"random tensors of the input shapes as JSON, {per}"
    return [], ""


def task_runner(
    settings: LoadedSettings,
    session: Any,
    random_feeds: Callable[[], dict[str, np.ndarray]],
    batch: int = 1,
    threads: int = 1,
) -> tuple[Callable[[], object], str]:
    """One request of the served task per call, on `session` (built by the measuring process), and what
    the requests are. The task is built and bound as a worker's master builds it (`build_task`); a task
    without sample requests (or refusing them) runs its model on `random_feeds()` instead."""
    from onnxpool.local import LocalTask, SessionRunner
    from onnxpool.tasks.errors import OnnxpoolError
    from onnxpool.tasks.jsonfast import dumps
    from onnxpool.tasks.registry import build_task
    from onnxpool.workers.session import model_info_of

    task = build_task(settings, model_info_of(session))
    task.start_in_worker(threads)
    requests, described = sample_requests(task, random_feeds, batch)
    problem = f"task {task.name} has no sample request"
    if requests:
        local = LocalTask(task, SessionRunner(session), settings)
        cycle = itertools.cycle(requests)

        def answer() -> object:
            return dumps(local.answer(next(cycle)))

        try:
            for _ in requests:
                answer()
            return answer, f"{task.name}: {described}"
        except OnnxpoolError as exc:
            problem = f"task {task.name} refused its sample request: {exc.message}"
    feeds = random_feeds()
    return (lambda: session.run(None, feeds)), f"random tensors of the model's shapes, inference only ({problem})"
