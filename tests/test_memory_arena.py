"""`[model] memory_arena`: a worker keeps its arena, and gives memory back past its headroom ("auto").

A real onnxruntime session in this process (no server): a model whose intermediate tensor
grows with a dynamic dimension, so one large request takes far more than the usual.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxpool.workers import session as session_module
from onnxpool.workers.memory import MB, anonymous_bytes
from onnxpool.workers.session import ArenaMode, SessionRuntime


def widening_model(path: Path) -> Path:
    """x [N, T] float -> y [N, T]: an [N, T, 64] intermediate (64 x the input) summed back."""
    graph = helper.make_graph(
        nodes=[
            helper.make_node("Unsqueeze", ["x", "axis"], ["x3"]),
            helper.make_node("Expand", ["x3", "shape"], ["wide"]),
            helper.make_node("Exp", ["wide"], ["wider"]),
            helper.make_node("ReduceSum", ["wider", "axis"], ["y"], keepdims=0),
        ],
        name="widening",
        inputs=[helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T"])],
        outputs=[helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "T"])],
        initializer=[
            helper.make_tensor("axis", TensorProto.INT64, [1], [-1]),
            helper.make_tensor("shape", TensorProto.INT64, [3], [1, 1, 64]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def loaded(path: Path, mode: ArenaMode, headroom_mb: int = 16) -> SessionRuntime:
    runtime = SessionRuntime()
    runtime.load(widening_model(path), 1, warmup_runs=1, memory_arena=mode, headroom_mb=headroom_mb)
    return runtime


SMALL = {"x": np.zeros((2, 8), dtype=np.float32)}
LARGE = {"x": np.zeros((64, 8192), dtype=np.float32)}  # a 128 MB intermediate


def test_auto_gives_a_large_requests_memory_back_and_keeps_the_usual(tmp_path: Path) -> None:
    runtime = loaded(tmp_path / "m.onnx", "auto")
    for _ in range(20):
        runtime.infer(SMALL)
        runtime.give_back()
    assert runtime.releases == 0  # the usual requests never pass the headroom
    before = anonymous_bytes()
    out = runtime.infer(LARGE)["y"]
    assert out.shape == (64, 8192) and float(out[0, 0]) == pytest.approx(64.0)
    assert anonymous_bytes() > before + 100 * MB
    del out  # the request is answered
    runtime.give_back()
    assert runtime.releases == 1
    assert anonymous_bytes() < before + 16 * MB  # the large request's memory is not kept
    for _ in range(5):
        runtime.infer(SMALL)
        runtime.give_back()
    assert runtime.releases == 1  # no release after every request


def test_keep_holds_the_largest_run(tmp_path: Path) -> None:
    runtime = loaded(tmp_path / "m.onnx", "keep")
    before = anonymous_bytes()
    runtime.infer(LARGE)
    runtime.give_back()
    assert runtime.releases == 0 and anonymous_bytes() > before + 100 * MB


def test_release_gives_back_after_every_run(tmp_path: Path) -> None:
    runtime = loaded(tmp_path / "m.onnx", "release")
    before = anonymous_bytes()
    runtime.infer(LARGE)
    runtime.give_back()
    runtime.infer(SMALL)  # its run shrinks the arena: the large run's regions are free by then
    runtime.give_back()
    assert anonymous_bytes() < before + 16 * MB
    assert runtime.describe_arena() == "released after each run"


def test_a_reply_that_ran_nothing_is_not_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A shed 503 or a 4xx ran no inference: post_request's give_back skips the statm read."""
    runtime = loaded(tmp_path / "m.onnx", "auto")
    reads: list[int] = []

    def counted() -> int:
        reads.append(1)
        return anonymous_bytes()

    monkeypatch.setattr(session_module, "anonymous_bytes", counted)
    runtime.infer(SMALL)
    runtime.give_back()
    assert len(reads) == 1
    for _ in range(3):  # replies without a run
        runtime.give_back()
    assert len(reads) == 1
    runtime.infer(SMALL)
    runtime.give_back()
    assert len(reads) == 2
