"""Open Inference Protocol v2 datatypes <-> numpy dtypes (one table, reverse derived)."""

from __future__ import annotations

import numpy as np

V2_TO_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
}

NUMPY_TO_V2: dict[np.dtype, str] = {dtype: name for name, dtype in V2_TO_NUMPY.items()}

ALLOWED_DATATYPES = ", ".join(V2_TO_NUMPY)


def v2_datatype(dtype: np.dtype | None) -> str:
    """The v2 name of a numpy dtype; BYTES for anything without a numeric mapping."""
    return NUMPY_TO_V2.get(dtype, "BYTES") if dtype is not None else "BYTES"
