"""The demo model as model zoos and exporters ship image models, made in the tests by editing its graph.

Each variant computes what the demo computes (the same weights), only its interface differs: channels
last (tf2onnx), a fixed batch (many zoo files), dynamic height and width (fully convolutional exports),
a Softmax at the end (Keras). Plus a tiny grey MNIST-shaped classifier. `onnx` is a dev dependency.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.harness import DEMO_MODEL

DEMO_INPUT = "input"
DEMO_OUTPUT = "logits"


def _demo() -> onnx.ModelProto:
    model = onnx.load(str(DEMO_MODEL))
    del model.graph.value_info[:]  # inner shapes of 224x224 would contradict a variant's dims
    return model


def _dims(value: onnx.ValueInfoProto, dims: list[int | str]) -> None:
    shape = value.type.tensor_type.shape
    del shape.dim[:]
    for d in dims:
        dim = shape.dim.add()
        if isinstance(d, int):
            dim.dim_value = d
        else:
            dim.dim_param = d


def _save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def nhwc(path: Path) -> Path:
    """Input `images` [N, 224, 224, 3], transposed to the demo's NCHW by the first node (as tf2onnx writes)."""
    model = _demo()
    graph = model.graph
    _dims(graph.input[0], ["N", 224, 224, 3])
    graph.input[0].name = "images"
    graph.node.insert(0, helper.make_node("Transpose", ["images"], [DEMO_INPUT], perm=[0, 3, 1, 2]))
    return _save(model, path)


def fixed_batch(path: Path, batch: int = 1) -> Path:
    """Input [batch, 3, 224, 224], output [batch, 1000]."""
    model = _demo()
    _dims(model.graph.input[0], [batch, 3, 224, 224])
    _dims(model.graph.output[0], [batch, 1000])
    return _save(model, path)


def dynamic_size(path: Path) -> Path:
    """Input [N, 3, h, w] (dynamic axes on height and width)."""
    model = _demo()
    _dims(model.graph.input[0], ["N", 3, "h", "w"])
    return _save(model, path)


def ending_in_softmax(path: Path, behind: str = "") -> Path:
    """Output `probabilities` = Softmax(logits) (behind an op of `behind`, e.g. "Identity", when given)."""
    model = _demo()
    graph = model.graph
    out = graph.output[0]
    softmax_out = "softmax" if behind else "probabilities"
    graph.node.append(helper.make_node("Softmax", [DEMO_OUTPUT], [softmax_out], axis=1))
    if behind:
        graph.node.append(helper.make_node(behind, [softmax_out], ["probabilities"]))
    out.name = "probabilities"
    return _save(model, path)


def grey_digits(path: Path, batch: int | str = 1) -> Path:
    """MNIST-shaped: `Input3` [batch, 1, 28, 28] -> Conv 3x3 (4 filters) -> Relu -> global pool -> Gemm ->
    `Plus214_Output_0` [batch, 10] logits, random (seeded) weights."""
    rng = np.random.default_rng(54)
    conv = numpy_helper.from_array(rng.normal(0, 0.5, (4, 1, 3, 3)).astype(np.float32), "conv_w")
    gemm = numpy_helper.from_array(rng.normal(0, 1.0, (4, 10)).astype(np.float32), "gemm_w")
    bias = numpy_helper.from_array(rng.normal(0, 0.1, (10,)).astype(np.float32), "gemm_b")
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["Input3", "conv_w"], ["conv"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["conv"], ["relu"]),
            helper.make_node("GlobalAveragePool", ["relu"], ["pooled"]),
            helper.make_node("Flatten", ["pooled"], ["flat"], axis=1),
            helper.make_node("Gemm", ["flat", "gemm_w", "gemm_b"], ["Plus214_Output_0"]),
        ],
        "grey_digits",
        [helper.make_tensor_value_info("Input3", TensorProto.FLOAT, [batch, 1, 28, 28])],
        [helper.make_tensor_value_info("Plus214_Output_0", TensorProto.FLOAT, [batch, 10])],
        initializer=[conv, gemm, bias],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return _save(model, path)
