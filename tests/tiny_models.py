"""Small ONNX models built in tests with the `onnx` package (a dev dependency only)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def channel_classifier(path: Path, size: int = 8) -> Path:
    """[N,3,size,size] float -> [N,3] logits = mean of each channel x 10.

    Class 0 = the reddest image, 1 = greenest, 2 = bluest: a model whose answer
    a test can predict from the picture it sends.
    """
    weights = numpy_helper.from_array(np.eye(3, dtype=np.float32) * 10, name="w")
    graph = helper.make_graph(
        [
            helper.make_node("GlobalAveragePool", ["input"], ["pooled"]),
            helper.make_node("Flatten", ["pooled"], ["flat"], axis=1),
            helper.make_node("MatMul", ["flat", "w"], ["logits"]),
        ],
        "channel_classifier",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, size, size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3])],
        initializer=[weights],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path
