"""What the HTTP layer needs from the model runtime, as a Protocol.

In production the runtime is `workers.session.RUNTIME`, filled after fork by
the gunicorn hooks; tests may pass a runtime loaded in-process.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Protocol

import numpy as np

from onnxpool.workers.model_info import ModelInfo


class InferenceBackend(Protocol):
    """A loaded model that can run inferences."""

    @property
    def ready(self) -> bool: ...

    @property
    def info(self) -> ModelInfo | None: ...

    def infer(
        self, feeds: Mapping[str, np.ndarray], output_names: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]: ...

    def occupied(self) -> AbstractContextManager[None]:
        """Mark this worker working for the block (a request): no other worker runs wide on its cores meanwhile."""
        ...

    @property
    def last_wide(self) -> int:
        """The threads of the latest `infer` if it ran wide on idle workers' cores (workers/wide.py), else 0."""
        ...


class NoBoard:
    """The board-less half of the protocol, for a backend outside a pool (tests, in-process tools).

    It marks nothing and never runs wide.
    """

    last_wide = 0

    def occupied(self) -> AbstractContextManager[None]:
        return nullcontext()
