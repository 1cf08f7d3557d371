"""Tiny ONNX models built in tests with the `onnx` package (a dev dependency only).

They load and run in about a millisecond, and their answers are predictable,
so a test can tell exactly which model (file) a worker runs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

CLASSES = 1000


def _save(graph: onnx.GraphProto, path: Path, opset: int) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8  # readable by every onnxruntime >= 1.10
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def build_tiny_model(path: Path, bias: float) -> Path:
    """The demo model's interface: `input` FP32 [N,3,224,224] -> `logits` FP32 [N,1000].

    logits = mean(input per channel) @ W + bias: two models that differ only in
    `bias` give outputs that differ by exactly that much.
    """
    weights = np.linspace(-1.0, 1.0, 3 * CLASSES, dtype=np.float32).reshape(3, CLASSES)
    graph = helper.make_graph(
        nodes=[
            helper.make_node("ReduceMean", ["input"], ["means"], axes=[2, 3], keepdims=0),
            helper.make_node("MatMul", ["means", "weights"], ["scores"]),
            helper.make_node("Add", ["scores", "bias"], ["logits"]),
        ],
        name="tiny",
        inputs=[helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 224, 224])],
        outputs=[helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", CLASSES])],
        initializer=[
            numpy_helper.from_array(weights, "weights"),
            numpy_helper.from_array(np.full(CLASSES, bias, dtype=np.float32), "bias"),
        ],
    )
    return _save(graph, path, opset=13)


def channel_classifier(path: Path, size: int = 8) -> Path:
    """[N,3,size,size] float -> [N,3] logits = mean of each channel x 10.

    Class 0 = the reddest image, 1 = greenest, 2 = bluest.
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
    return _save(graph, path, opset=17)
