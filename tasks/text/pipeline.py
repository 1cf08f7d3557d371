"""One embedding request's compute: encoded inputs -> model (in sub-batches) -> pooled vectors.

The model is a callable (feeds -> token embeddings [N, T, D], e.g. a wrapper of the worker's
session returning `last_hidden_state`), so this module runs anywhere: in the worker, in a
correctness check against sentence-transformers, in tests with a numpy stand-in.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from onnxpool.tasks.text.pooling import PoolingSpec, embed
from onnxpool.tasks.text.sorting import plan_sub_batches
from onnxpool.tasks.text.tokenizing import EncodedBatch

RunModel = Callable[[dict[str, np.ndarray]], np.ndarray]


def embed_batch(
    encoded: EncodedBatch,
    run_model: RunModel,
    spec: PoolingSpec,
    *,
    batch_size: int | None = 8,
    dimensions: int | None = None,
    max_tokens: int | None = None,
) -> np.ndarray:
    """Embeddings [N, D'] float32 in input order: length-sorted sub-batches of `batch_size`
    (None = one padded batch), pooled and normalised as `spec` says, cut to `dimensions`."""
    plan = plan_sub_batches(encoded.lengths, batch_size, max_tokens)
    results = []
    for rows in plan.batches:
        part = encoded.select(rows)
        hidden = run_model(part.feeds())
        results.append(embed(hidden, part.attention_mask, spec, dimensions))
    return plan.restore(results)
