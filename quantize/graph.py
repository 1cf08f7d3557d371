"""The model's graph: its float input, the layers the search may keep float, node names, ranking.

onnx is imported inside the functions: `onnxpool quantize` needs the `quantize` extra.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from onnxpool.quantize.errors import QuantizeError


def float_input(model_path: Path, image_shape: Sequence[int] | None = None) -> str:
    """The name of the model's one float32 input; QuantizeError otherwise, or if its static
    dimensions do not fit `image_shape` (one preprocessed image, without the batch axis)."""
    import onnx

    try:
        model = onnx.load(str(model_path), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError and others for a file that is not a model
        raise QuantizeError(f"model file {model_path} is not an ONNX model: {str(exc).splitlines()[0]}") from None
    initializers = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    floats = [i for i in inputs if i.type.tensor_type.elem_type == onnx.TensorProto.FLOAT]
    if len(inputs) != 1 or not floats:
        kinds = ", ".join(f"{i.name}: {onnx.TensorProto.DataType.Name(i.type.tensor_type.elem_type)}" for i in inputs)
        raise QuantizeError(f"model {model_path} needs exactly one float32 input to quantize; it has {kinds or 'none'}")
    dims = [d.dim_value if d.HasField("dim_value") else None for d in floats[0].type.tensor_type.shape.dim]
    if image_shape is not None and (
        len(dims) != len(image_shape) + 1
        or any(d is not None and d != want for d, want in zip(dims[1:], image_shape, strict=True))
    ):
        shown = ", ".join("?" if d is None else str(d) for d in dims)
        raise QuantizeError(
            f"model input {floats[0].name!r} is [{shown}] but [task.preprocess] makes images of "
            f"{list(image_shape)}: pass the model's settings with --config"
        )
    return str(floats[0].name)


def quantizable_nodes(model_path: Path) -> list[str]:
    """Conv/Gemm/MatMul nodes in graph order: what the search may keep in float."""
    import onnx

    model = onnx.load(str(model_path))
    return [n.name for n in model.graph.node if n.op_type in ("Conv", "Gemm", "MatMul")]


def with_activations(model_path: Path, nodes: Sequence[str]) -> tuple[str, ...]:
    """`nodes` plus the Clip/Relu that is the sole consumer of each: left quantized, its QDQ pair
    would sit on the un-clipped output, whose range is far wider than the clipped one."""
    import onnx

    model = onnx.load(str(model_path))
    consumers: dict[str, list[Any]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    by_name = {n.name: n for n in model.graph.node}
    out = list(dict.fromkeys(nodes))
    for name in list(out):
        for output in by_name[name].output:
            users = consumers.get(output, [])
            if len(users) == 1 and users[0].op_type in ("Clip", "Relu") and users[0].name not in out:
                out.append(users[0].name)
    return tuple(out)


def name_nodes(src: Path, dst: Path) -> Path:
    """A copy of the model in which every node has a unique name (exclusions address nodes by name)."""
    import onnx

    model = onnx.load(str(src))
    seen: set[str] = set()
    for i, node in enumerate(model.graph.node):
        if not node.name or node.name in seen:
            node.name = f"{node.op_type}_{i}"
        seen.add(node.name)
    onnx.save(model, str(dst))
    return dst


def rank_by_range(model_path: Path, nodes: Sequence[str], ranges: dict[str, Any]) -> list[str]:
    """`nodes`, widest calibrated output range first: a wide range means coarse INT8 steps."""
    import onnx

    outputs = {n.name: n.output[0] for n in onnx.load(str(model_path)).graph.node if n.output}

    def width(node: str) -> float:
        low, high = ranges.get(outputs.get(node, ""), (0.0, 0.0))
        return float(high - low)

    return sorted(nodes, key=lambda n: -width(n))
