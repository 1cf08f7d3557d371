"""Model output -> what image classification returns: the top-k labels per image.

Pure numpy (scores and labels: `onnxpool.tasks.classes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from onnxpool.tasks.classes import as_rows
from onnxpool.tasks.errors import BadRequest


def top_k(scores: np.ndarray[Any, Any], k: int, labels: Sequence[str] | None) -> list[list[dict[str, object]]]:
    """Per row the k best classes, best first: [{"label", "index", "score"}, ...].

    k is clamped to the number of classes. A class without a (non-empty) label
    is named by its index. Equal scores in a reply are listed lower index first,
    so replies are stable.
    """
    if k < 1:
        raise BadRequest(f"top_k must be at least 1, got {k}")
    rows = as_rows(scores)
    classes = rows.shape[1]
    k = min(k, classes)
    if k < classes:
        # O(classes) selection of the k best, then sort only those k.
        best = np.argpartition(-rows, k - 1, axis=1)[:, :k]
    else:
        best = np.broadcast_to(np.arange(classes), rows.shape)
    best = np.sort(best, axis=1)  # index order first, so the stable sort below breaks ties by index
    order = np.argsort(-np.take_along_axis(rows, best, axis=1), axis=1, kind="stable")
    best = np.take_along_axis(best, order, axis=1)
    names: Sequence[str] = labels if labels is not None else ()
    replies = []
    for indices, values in zip(best.tolist(), np.take_along_axis(rows, best, axis=1).tolist(), strict=True):
        replies.append(
            [
                {"label": names[i] if i < len(names) and names[i] else str(i), "index": i, "score": v}
                for i, v in zip(indices, values, strict=True)
            ]
        )
    return replies
