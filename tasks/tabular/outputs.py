"""A classifier's outputs as converters write them: a label tensor, and the probabilities as a
(n, classes) float tensor or as skl2onnx's ZipMap.

skl2onnx (and onnxmltools for LightGBM) end a classifier in a ZipMap by default: the output is
`seq(map(int64|string, tensor(float)))`, one {class: probability} map per row, which onnxruntime
returns as a list of dicts and which no v2 tensor can carry. Read here into the (n, classes)
matrix a `zipmap=False` export would have given, in the map's key order (the classifier's
`classes_` order); the keys are the class names when they are strings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

ZIPMAP_PREFIX = "seq(map("


def is_zipmap(onnx_type: str) -> bool:
    """A ZipMap output: a sequence of maps from class to float probability."""
    return onnx_type.startswith(ZIPMAP_PREFIX) and onnx_type.endswith("tensor(float)))")


def zipmap_keys(value: Any) -> tuple[Any, ...]:
    """The classes of a ZipMap output's value, in its order (the first row's keys; every row has them all)."""
    if not isinstance(value, Sequence) or not value or not isinstance(value[0], Mapping):
        raise ValueError(f"a ZipMap output should be a list of maps, not {type(value).__name__}")
    return tuple(value[0].keys())


def probability_matrix(value: Any, keys: tuple[Any, ...] | None) -> np.ndarray:
    """A probability output as (n, classes) float64: a tensor as it is, a ZipMap row by row in `keys`' order."""
    if keys is None:
        return np.asarray(value, dtype=np.float64)
    return np.array([[row[key] for key in keys] for row in value], dtype=np.float64).reshape(len(value), len(keys))


def label_indices(labels: Any, probabilities: np.ndarray, classes: Sequence[Any] | None) -> np.ndarray:
    """Each row's class index, from the model's own label output where it has one.

    The label output is what the model decided (a threshold of its own, a tie broken its way);
    it is a class value: mapped to its index through `classes` (a ZipMap's keys), else read as
    the index when it is an integer in range. Otherwise (no label output, or a label that is in
    no known class) the most probable class.
    """
    best = np.argmax(probabilities, axis=1) if probabilities.size else np.zeros(len(probabilities), dtype=np.int64)
    if labels is None:
        return best
    values = np.asarray(labels).reshape(-1)
    if len(values) != len(best):
        return best
    if classes is not None:
        index = {key: i for i, key in enumerate(classes)}
        found = [index.get(v.item() if isinstance(v, np.generic) else v) for v in values]
        return np.array([i if i is not None else b for i, b in zip(found, best, strict=True)], dtype=np.int64)
    if values.dtype.kind in "iu":
        width = probabilities.shape[1]
        return np.where((values >= 0) & (values < width), values, best).astype(np.int64)
    return best
