"""The one object between a request and the worker's session: `onnxpool.tasks.api.Runner`.

Made per request by the data plane over the worker's runtime (`InferenceBackend`, the
`workers.session.SessionRuntime` after fork) and the request's phase timer: every inference
is timed as phase "infer" and its batch size recorded, whoever asks for it (a task's `run`,
v2 infer on the model's own tensors); an inference that ran wide (on the model's idle workers'
cores too, workers/wide.py) is said in Server-Timing and counted. A traced request's inference
span gets the batch size (and a wide run's threads) too;
a task's own steps become spans through `span` (`onnxpool.tasks.api.Runner.span`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from onnxpool.server import metrics
from onnxpool.server.backend import InferenceBackend
from onnxpool.server.timing import Attributes, RequestTimer
from onnxpool.tasks.api import Feeds, Outputs
from onnxpool.tasks.errors import BadRequest
from onnxpool.workers.model_info import FeedsRefused


class RequestRunner:
    """The session, as one request sees it: timed, counted (see the module doc)."""

    __slots__ = ("_backend", "_model", "_record", "timer")

    def __init__(self, backend: InferenceBackend, timer: RequestTimer, model: str, record_metrics: bool) -> None:
        self._backend = backend
        self.timer = timer
        """The request's phase timer (admission control reads its wait)."""
        self._model = model
        self._record = record_metrics

    def infer(self, feeds: Feeds, output_names: Sequence[str] | None = None) -> Outputs:
        timer = self.timer
        traced = timer.spans is not None
        attributes: Attributes | None = None
        if self._record or traced:
            first = next(iter(feeds.values()), None)
            batch = int(first.shape[0]) if first is not None and first.ndim else 1
            if self._record:
                metrics.observe_batch(self._model, batch)
            if traced:
                attributes = {"onnxpool.batch_size": batch}
        backend = self._backend
        with timer.phase("infer", attributes):
            try:
                outputs = backend.infer(feeds, output_names)
            except FeedsRefused as exc:  # onnxruntime's INVALID_ARGUMENT, for any task and v2 infer alike
                raise BadRequest(str(exc)) from None
            wide = backend.last_wide
            if wide:  # it ran on idle workers' cores too (workers/wide.py): said in Server-Timing, counted
                timer.wide = max(timer.wide, wide)
                if self._record:
                    metrics.count_wide_run(self._model)
                if attributes is not None:  # the span's threads are this run's, not the worker's share
                    attributes.update({"onnxpool.threads": wide, "onnxpool.wide": True})
        return outputs

    def phase(self, name: str) -> AbstractContextManager[None]:
        return self.timer.phase(name)

    def span(self, name: str, attributes: Mapping[str, Any] | None = None) -> AbstractContextManager[Attributes]:
        return self.timer.step(name, attributes)
