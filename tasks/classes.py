"""Class names and class scores, shared by the classifying tasks (image, tabular, text).

Pure numpy, no I/O except `load_labels`, which a task calls once, in the master, at start.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np

from onnxpool.config.loader import ConfigError

ScoreMode = Literal["softmax", "sigmoid", "none"]
Scores = np.ndarray[Any, Any]


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


def as_rows(output: np.ndarray[Any, Any]) -> Scores:
    """(n, classes) view of a model output ((classes,) or (n, classes, 1, 1) too), float32 unless float64."""
    array = np.asarray(output)
    if array.ndim == 1:
        array = array[None, :]
    elif array.ndim > 2:
        if any(dim != 1 for dim in array.shape[2:]):
            raise ValueError(f"expected class scores shaped (n, classes), got {array.shape}")
        array = array.reshape(array.shape[0], array.shape[1])
    return array if array.dtype == np.float64 else array.astype(np.float32, copy=False)


def scores(output: np.ndarray[Any, Any], mode: ScoreMode) -> Scores:
    """Per-class scores, (n, classes), float32 (float64 for float64 logits).

    softmax: exp(x - max) / sum, so large logits never overflow.
    sigmoid: computed from exp(-|x|), which never overflows and keeps tiny
    scores (1e-20) distinct instead of rounding them to 0 or 1.
    none: the output as it is (already probabilities, or raw scores).
    """
    rows = as_rows(output)
    if mode == "none":
        return rows
    if mode == "softmax":
        shifted = rows - rows.max(axis=1, keepdims=True)
        exp: Scores = np.exp(shifted)
        exp /= exp.sum(axis=1, keepdims=True)
        return exp
    if mode == "sigmoid":
        small = np.exp(-np.abs(rows))  # in (0, 1]
        sigmoid: Scores = np.where(rows >= 0, 1.0 / (1.0 + small), small / (1.0 + small)).astype(rows.dtype)
        return sigmoid
    raise ValueError(f"unknown score mode {mode!r}; expected softmax, sigmoid or none")


def scores_from_graph(made_by: str, output: str) -> tuple[ScoreMode | None, str]:
    """("none", why) when the graph's op making `output` already makes probabilities; (None, "") when
    the graph cannot tell (the rows on a sample decide: `scores_from_rows`)."""
    if made_by in ("Softmax", "Sigmoid"):
        kind = "multi-label probabilities" if made_by == "Sigmoid" else "probabilities"
        return "none", f"output '{output}' is made by a {made_by} node: already {kind}"
    return None, ""


SUM_TOLERANCE = 1e-3


def scores_from_rows(rows: np.ndarray[Any, Any], output: str, made_by: str = "") -> tuple[ScoreMode, str]:
    """ "none" when every row on the task's own sample is probabilities (in [0, 1], summing to 1 within
    SUM_TOLERANCE: a Softmax the graph hides behind ops of its own), else "softmax" (logits)."""
    array = as_rows(rows).astype(np.float64)
    sums = array.sum(axis=1)
    where = f"output '{output}'" + (f", made by {made_by}" if made_by else "")
    if array.size and np.all((array >= 0) & (array <= 1)) and np.all(np.abs(sums - 1.0) <= SUM_TOLERANCE):
        return "none", f"{where}: its rows on the task's sample already sum to 1, probabilities"
    return "softmax", f"{where}: its rows on the task's sample do not sum to 1, logits"
