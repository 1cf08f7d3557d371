"""Tiny ONNX models with the demo model's interface, built with the `onnx` package.

input `input` FP32 [N, 3, 224, 224] -> per-channel mean [N, 3] -> MatMul W [3, 1000]
-> + bias -> output `logits` FP32 [N, 1000]. Two models that differ only in
`bias` give outputs that differ by exactly that much: a test can tell which
model file a worker runs. They load and run in about a millisecond.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

CLASSES = 1000


def build_tiny_model(path: Path, bias: float) -> Path:
    """Write a tiny classifier whose logits are mean(input per channel) @ W + bias."""
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
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8  # readable by every onnxruntime >= 1.10
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path
