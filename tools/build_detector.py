"""Build the example detector of docs/TASKS.md: a small object-detection-shaped ONNX model, untrained.

    .venv/bin/python tools/build_detector.py detector.onnx

Its interface is a detector's: `image` float [N, 3, 224, 224] (normalised pixels) in;
`boxes` float [N, 16, 4] (x1, y1, x2, y2 in input pixels), `scores` float [N, 16] and
`classes` int64 [N, 16] out. It learns nothing: it computes from simple image statistics, so
different photos give different boxes, and the same photo always the same ones. The input is
cut into a 4 x 4 grid of 56-pixel cells, one detection each:

- the box is centred on the cell's brightness-weighted centroid (brighter pixels pull it),
  its half-side 56 x (0.3 + 0.4 x score), clipped to the input;
- the score is sigmoid(10 x (the cell's brightness standard deviation - 0.25)): textured cells
  score high, flat ones (sky, a wall) low;
- the class is how bright the cell is on average: 0 dark (mean normalised brightness below
  -0.2), 1 mid, 2 bright (above 0.2).

Deterministic: no randomness, the same bytes for the same onnx version.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SIZE = 224
GRID = 4
CELL = SIZE // GRID
DETECTIONS = GRID * GRID
OPSET = 13


def cell_coordinates() -> tuple[np.ndarray, np.ndarray]:
    """Each pixel's centre (x, y) in input pixels, laid out as the graph lays out cells: [1, K, CELL*CELL]."""
    ys, xs = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32) + 0.5

    def by_cell(plane: np.ndarray) -> np.ndarray:
        cells = plane.reshape(GRID, CELL, GRID, CELL).transpose(0, 2, 1, 3)
        return np.ascontiguousarray(cells.reshape(1, DETECTIONS, CELL * CELL))

    return by_cell(xs), by_cell(ys)


def build_detector(path: Path) -> Path:
    """Write the model to `path` (see the module doc) and return it."""
    xs, ys = cell_coordinates()
    constants = {
        "cell_shape": np.array([-1, GRID, CELL, GRID, CELL], np.int64),
        "flat_cells": np.array([-1, DETECTIONS, CELL * CELL], np.int64),
        "pixel_axis": np.array([2], np.int64),
        "last_axis": np.array([-1], np.int64),
        "xs": xs,
        "ys": ys,
        "offset": np.array(1.05, np.float32),  # normalised pixels are >= -0.99: weights stay > 0
        "centre": np.array(0.25, np.float32),
        "gain": np.array(10.0, np.float32),
        "size_base": np.array(0.3 * CELL, np.float32),
        "size_gain": np.array(0.4 * CELL, np.float32),
        "dark_below": np.array(-0.2, np.float32),
        "bright_above": np.array(0.2, np.float32),
        "zero": np.array(0.0, np.float32),
        "side": np.array(float(SIZE), np.float32),
    }
    node = helper.make_node
    nodes = [
        # brightness per pixel, and the positive weights of the centroid
        node("ReduceMean", ["image"], ["bright"], axes=[1], keepdims=1),
        node("Add", ["bright", "offset"], ["weight"]),
        *[
            step
            for name in ("bright", "weight")
            for step in (
                node("Reshape", [name, "cell_shape"], [f"{name}_grid"]),
                node("Transpose", [f"{name}_grid"], [f"{name}_cells"], perm=[0, 1, 3, 2, 4]),
                node("Reshape", [f"{name}_cells", "flat_cells"], [f"{name}_flat"]),
            )
        ],
        # centroid
        node("ReduceSum", ["weight_flat", "pixel_axis"], ["weight_sum"], keepdims=0),
        node("Mul", ["weight_flat", "xs"], ["weighted_x"]),
        node("Mul", ["weight_flat", "ys"], ["weighted_y"]),
        node("ReduceSum", ["weighted_x", "pixel_axis"], ["sum_x"], keepdims=0),
        node("ReduceSum", ["weighted_y", "pixel_axis"], ["sum_y"], keepdims=0),
        node("Div", ["sum_x", "weight_sum"], ["cx"]),
        node("Div", ["sum_y", "weight_sum"], ["cy"]),
        # score: the cell's brightness standard deviation
        node("ReduceMean", ["bright_flat"], ["mean"], axes=[2], keepdims=0),
        node("Mul", ["bright_flat", "bright_flat"], ["squares"]),
        node("ReduceMean", ["squares"], ["mean_square"], axes=[2], keepdims=0),
        node("Mul", ["mean", "mean"], ["square_mean"]),
        node("Sub", ["mean_square", "square_mean"], ["variance"]),
        node("Relu", ["variance"], ["variance_0"]),
        node("Sqrt", ["variance_0"], ["deviation"]),
        node("Sub", ["deviation", "centre"], ["centred"]),
        node("Mul", ["centred", "gain"], ["logit"]),
        node("Sigmoid", ["logit"], ["scores"]),
        # the box around the centroid
        node("Mul", ["scores", "size_gain"], ["grown"]),
        node("Add", ["grown", "size_base"], ["half"]),
        node("Sub", ["cx", "half"], ["x1_raw"]),
        node("Sub", ["cy", "half"], ["y1_raw"]),
        node("Add", ["cx", "half"], ["x2_raw"]),
        node("Add", ["cy", "half"], ["y2_raw"]),
        *[
            step
            for corner in ("x1", "y1", "x2", "y2")
            for step in (
                node("Clip", [f"{corner}_raw", "zero", "side"], [corner]),
                node("Unsqueeze", [corner, "last_axis"], [f"{corner}_column"]),
            )
        ],
        node("Concat", ["x1_column", "y1_column", "x2_column", "y2_column"], ["boxes"], axis=-1),
        # class: how bright the cell is on average (0 dark, 1 mid, 2 bright)
        node("Greater", ["mean", "dark_below"], ["not_dark"]),
        node("Greater", ["mean", "bright_above"], ["bright_cell"]),
        node("Cast", ["not_dark"], ["not_dark_1"], to=TensorProto.INT64),
        node("Cast", ["bright_cell"], ["bright_cell_1"], to=TensorProto.INT64),
        node("Add", ["not_dark_1", "bright_cell_1"], ["classes"]),
    ]
    graph = helper.make_graph(
        nodes,
        "detector",
        inputs=[helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, SIZE, SIZE])],
        outputs=[
            helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["N", DETECTIONS, 4]),
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", DETECTIONS]),
            helper.make_tensor_value_info("classes", TensorProto.INT64, ["N", DETECTIONS]),
        ],
        initializer=[numpy_helper.from_array(value, name) for name, value in constants.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="onnxpool")
    model.ir_version = 8  # readable by every onnxruntime >= 1.10
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path, help="the .onnx file to write")
    args = parser.parse_args(argv)
    print(build_detector(args.output))
    return 0


if __name__ == "__main__":
    sys.exit(main())
