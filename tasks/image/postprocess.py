"""Model output -> what /classify returns: scores per class and the top-k labels.

Pure numpy, no I/O except `load_labels`, which the app calls once at start-up.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from onnxpool.config.loader import ConfigError
from onnxpool.tasks.errors import BadRequest

ScoreMode = Literal["softmax", "sigmoid", "none"]
Scores = np.ndarray[Any, np.dtype[np.float32]]


class LabelsError(ConfigError):
    """The labels file cannot be used; the message is one line meant for an operator."""


def load_labels(path: Path) -> list[str]:
    """Class names, one per line, in output-index order.

    UTF-8 (a leading BOM is dropped), trailing whitespace and CR are stripped,
    non-ASCII names are kept. Blank lines inside the file stay as "" so the
    indices after them still line up; blank lines at the end are dropped.
    """
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise LabelsError(f"labels file {path} cannot be read: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise LabelsError(f"labels file {path} is not UTF-8 (line {line}, byte {exc.start})") from None
    # split("\n"), not splitlines(): a label may legitimately hold characters
    # that splitlines treats as breaks (form feed, U+2028 ...).
    labels = [line.rstrip() for line in text.split("\n")]
    while labels and not labels[-1]:
        labels.pop()
    if not labels:
        raise LabelsError(f"labels file {path} has no labels")
    return labels


def _as_rows(output: np.ndarray[Any, Any]) -> Scores:
    """(n, classes) float32 view of a model output: (classes,) or (n, classes, 1, 1) too."""
    array = np.asarray(output)
    if array.ndim == 1:
        array = array[None, :]
    elif array.ndim > 2:
        if any(dim != 1 for dim in array.shape[2:]):
            raise ValueError(f"expected class scores shaped (n, classes), got {array.shape}")
        array = array.reshape(array.shape[0], array.shape[1])
    return array.astype(np.float32, copy=False)


def scores(output: np.ndarray[Any, Any], mode: ScoreMode) -> Scores:
    """Per-class scores, (n, classes) float32.

    softmax: exp(x - max) / sum, so large logits never overflow.
    sigmoid: computed from exp(-|x|), which never overflows and keeps tiny
    scores (1e-20) distinct instead of rounding them to 0 or 1.
    none: the output as it is (already probabilities, or raw scores).
    """
    rows = _as_rows(output)
    if mode == "none":
        return rows
    if mode == "softmax":
        shifted = rows - rows.max(axis=1, keepdims=True)
        exp: Scores = np.exp(shifted)
        exp /= exp.sum(axis=1, keepdims=True)
        return exp
    if mode == "sigmoid":
        small = np.exp(-np.abs(rows))  # in (0, 1]
        sigmoid: Scores = np.where(rows >= 0, 1.0 / (1.0 + small), small / (1.0 + small)).astype(np.float32)
        return sigmoid
    raise ValueError(f"unknown score mode {mode!r}; expected softmax, sigmoid or none")


def top_k(scores: np.ndarray[Any, Any], k: int, labels: Sequence[str] | None) -> list[list[dict[str, object]]]:
    """Per row the k best classes, best first: [{"label", "index", "score"}, ...].

    k is clamped to the number of classes. A class without a (non-empty) label
    is named by its index. Equal scores in a reply are listed lower index first,
    so replies are stable.
    """
    if k < 1:
        raise BadRequest(f"top_k must be at least 1, got {k}")
    rows = _as_rows(scores)
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
