"""The Open Inference Protocol's classification extension: an output's top classes as strings.

An infer request may ask for an output with the parameter `classification: k`: instead of the
scores, the output is then, per row, its k highest classes, highest first, each the string
`<score>:<index>` or `<score>:<index>:<label>` when the model's task names its classes (Triton's
format: the score printed as C's `%f`), a BYTES tensor shaped like the output with its last axis k.
REST and gRPC alike (a gRPC call is the REST request it means).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from onnxpool.tasks.errors import BadRequest


def classified(scores: np.ndarray, k: int, names: Sequence[str] | None, output: str) -> np.ndarray:
    """The top `k` classes of each row of `scores` (classes on the last axis) as BYTES strings."""
    if scores.ndim == 0 or scores.dtype.kind not in "iuf":
        raise BadRequest(f"output '{output}' holds no class scores: classification needs a numeric tensor")
    k = min(k, scores.shape[-1])
    top = np.argsort(-scores, axis=-1, kind="stable")[..., :k]
    values = np.take_along_axis(scores, top, axis=-1)
    result = np.empty(top.shape, dtype=object)
    flat_result, flat_top, flat_values = result.reshape(-1), top.reshape(-1), values.reshape(-1)
    for position, (index, value) in enumerate(zip(flat_top.tolist(), flat_values.tolist(), strict=True)):
        label = f":{names[index]}" if names is not None and index < len(names) else ""
        flat_result[position] = f"{value:f}:{index}{label}".encode()
    return result


def apply(
    outputs: Mapping[str, np.ndarray], counts: Mapping[str, int], names: Sequence[str] | None
) -> dict[str, np.ndarray]:
    """`outputs` with each output named in `counts` replaced by its classification."""
    return {name: classified(array, counts[name], names, name) if name in counts else array
            for name, array in outputs.items()}  # fmt: skip
