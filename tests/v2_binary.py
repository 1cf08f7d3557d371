"""Build Open Inference Protocol v2 requests with the binary tensor data extension.

Shared by tests and benchmarks: a JSON header, then the raw tensor bytes, with
`Inference-Header-Content-Length` telling the server where the header ends.
"""

from __future__ import annotations

import json

import numpy as np

BINARY_HEADER = "Inference-Header-Content-Length"


def binary_infer_request(name: str, array: np.ndarray, binary_output: bool = True) -> tuple[bytes, dict[str, str]]:
    """(body, headers) for one FP32 input sent as binary data."""
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": name,
                    "datatype": "FP32",
                    "shape": list(array.shape),
                    "parameters": {"binary_data_size": array.nbytes},
                }
            ],
            "parameters": {"binary_data_output": binary_output},
        }
    ).encode()
    body = header + np.ascontiguousarray(array, dtype=np.float32).tobytes()
    return body, {BINARY_HEADER: str(len(header)), "Content-Type": "application/octet-stream"}
