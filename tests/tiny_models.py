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


def small_cnn(path: Path, size: int = 16, classes: int = 10, fragile: bool = True, depthwise: bool = False) -> Path:
    """[N,3,size,size] float -> [N,classes] logits: conv_a 3x3 + Relu, conv_b 1x1 + Relu,
    conv_c 3x3 + Relu, global pool, Gemm. Node names are `conv_a`, `conv_b`, `conv_c`, `head`.

    conv_a has one extra output channel that is always 0 (zero weights and bias). With
    `fragile`, conv_b gives that dead channel a weight of 10000: in float it multiplies 0
    and changes nothing, but INT8 weights are scaled per output channel to their largest
    value, so every real weight of conv_b rounds to 0 and INT8 loses the image. Keeping
    conv_b float is the fix an exclusion search must find. With `depthwise`, conv_c is a
    depthwise 3x3 (group 8) instead.
    """
    rng = np.random.default_rng(7)

    def conv_w(out_c: int, in_c: int, k: int) -> np.ndarray:
        weights: np.ndarray = rng.standard_normal((out_c, in_c, k, k)) / np.sqrt(in_c * k * k)
        return weights.astype(np.float32)

    wa = np.concatenate([conv_w(8, 3, 3), np.zeros((1, 3, 3, 3), np.float32)])
    ba = np.concatenate([(rng.standard_normal(8) * 0.1).astype(np.float32), np.zeros(1, np.float32)])
    wb = conv_w(8, 9, 1)
    wb[:, -1] = 10000.0 if fragile else 0.0
    inits = {
        "wa": wa,
        "ba": ba,
        "wb": wb,
        "bb": (rng.standard_normal(8) * 0.1).astype(np.float32),
        "wc": conv_w(8, 1, 3) if depthwise else conv_w(8, 8, 3),
        "bc": (rng.standard_normal(8) * 0.1).astype(np.float32),
        "wh": (rng.standard_normal((classes, 8)) * 8).astype(np.float32),
        "bh": np.zeros(classes, np.float32),
    }
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["input", "wa", "ba"], ["a"], name="conv_a", pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["a"], ["a_r"], name="relu_a"),
            helper.make_node("Conv", ["a_r", "wb", "bb"], ["b"], name="conv_b"),
            helper.make_node("Relu", ["b"], ["b_r"], name="relu_b"),
            helper.make_node(
                "Conv", ["b_r", "wc", "bc"], ["c"], name="conv_c", pads=[1, 1, 1, 1], group=8 if depthwise else 1
            ),
            helper.make_node("Relu", ["c"], ["c_r"], name="relu_c"),
            helper.make_node("GlobalAveragePool", ["c_r"], ["pooled"], name="pool"),
            helper.make_node("Flatten", ["pooled"], ["flat"], name="flatten", axis=1),
            helper.make_node("Gemm", ["flat", "wh", "bh"], ["logits"], name="head", transB=1),
        ],
        "small_cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, size, size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])],
        initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return _save(graph, path, opset=17)


def linear_regressor(path: Path, features: int = 3) -> Path:
    """A tabular regressor: `x` FP32 [N, features] -> `y` FP32 [N, 1] = sum of the features times 2."""
    graph = helper.make_graph(
        nodes=[helper.make_node("MatMul", ["x", "w"], ["y"])],
        name="regressor",
        inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", features])],
        outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])],
        initializer=[numpy_helper.from_array(np.full((features, 1), 2.0, dtype=np.float32), "w")],
    )
    return _save(graph, path, opset=13)
