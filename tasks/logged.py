"""What a task's `logged` returns: the pieces of a readable inference-log record of its inputs.

A task describes what its inputs mean for whoever reads the log later (docs/TASKS.md, "What the
inference log records"): named tensors with shape, datatype and data; opaque bytes (an image) as
their digest and size, never the bytes. No HTTP here: the server's inference log
(`server.inference_log_events`) writes what these return.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np

_V2_NAMES = {
    "bool": "BOOL", "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64",
    "int8": "INT8", "int16": "INT16", "int32": "INT32", "int64": "INT64",
    "float16": "FP16", "float32": "FP32", "float64": "FP64",
}  # fmt: skip
"""numpy dtype names -> Open Inference Protocol v2 datatypes (anything else is BYTES)."""


def digest(data: bytes | bytearray | memoryview) -> dict[str, Any]:
    """Opaque bytes (an image, a file) as a log keeps them: their sha256 (hex) and size."""
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def tensor(name: str, array: np.ndarray) -> dict[str, Any]:
    """A named tensor as v2's JSON tensor: name, datatype, shape and its data flat (strings as text)."""
    data: Any
    if array.dtype.kind in "OSU":
        data = [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in array.reshape(-1)]
    else:
        data = array.reshape(-1)
    datatype = _V2_NAMES.get(array.dtype.name, "BYTES")
    return {"name": name, "datatype": datatype, "shape": list(array.shape), "data": data}


def tensors(arrays: Mapping[str, np.ndarray]) -> list[dict[str, Any]]:
    """Named tensors (a task's feeds, say), each as `tensor` writes it."""
    return [tensor(name, array) for name, array in arrays.items()]
