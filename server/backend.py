"""What the HTTP layer needs from the model runtime, as a Protocol.

In production the runtime is `workers.session.RUNTIME`, filled after fork by
the gunicorn hooks; tests may pass a runtime loaded in-process.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
