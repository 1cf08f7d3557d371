"""A tiny ONNX model whose inference takes as long as the request asks (built with `onnx`).

Inputs: `n` INT64 [1] (loop iterations) and `x` FP32 [1]; output `y` FP32 [-1] = x + n.
A Loop op runs `n` iterations of one Add, so `n = 0` (the zeros of warm-up) is
instant and a large `n` keeps the worker busy inside onnxruntime (in C, where
Python signal handlers cannot run), like a real stuck inference.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

# Iterations that take well over a few seconds on any CPU (onnxruntime needs ~1 µs per iteration or more).
FOREVER = 2_000_000_000


def build_slow_model(path: Path) -> Path:
    """Write the model to `path` and return it."""
    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    body = helper.make_graph(
        [
            helper.make_node("Add", ["acc_in", "one"], ["acc_out"]),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [1]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [1]),
        ],
        initializer=[one],
    )
    graph = helper.make_graph(
        [
            helper.make_node("Squeeze", ["n", "axes"], ["trips"]),
            helper.make_node("Loop", ["trips", "true", "x"], ["y"], body=body),
        ],
        "slow",
        [
            helper.make_tensor_value_info("n", TensorProto.INT64, [1]),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["out"])],
        initializer=[
            helper.make_tensor("axes", TensorProto.INT64, [1], [0]),
            helper.make_tensor("true", TensorProto.BOOL, [], [True]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def infer_body(iterations: int) -> dict[str, object]:
    """A v2 JSON infer request that runs `iterations` loop iterations."""
    return {
        "inputs": [
            {"name": "n", "datatype": "INT64", "shape": [1], "data": [iterations]},
            {"name": "x", "datatype": "FP32", "shape": [1], "data": [0.0]},
        ]
    }


def server_settings(model: Path) -> dict[str, str]:
    """ONNXPOOL_* settings serving the slow model (no labels: it is no classifier)."""
    return {
        "ONNXPOOL_MODEL__NAME": "slow",
        "ONNXPOOL_MODEL__PATH": str(model),
        "ONNXPOOL_MODEL__WARMUP_RUNS": "1",
    }
