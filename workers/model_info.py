"""What a loaded model looks like: its inputs and outputs, independent of HTTP.

Built from an onnxruntime session (in a worker or in the master's probe
subprocess) and read by the server to validate requests and describe the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

# onnxruntime's type strings -> numpy dtypes. BYTES/strings are not served.
ONNX_TO_NUMPY: dict[str, np.dtype] = {
    "tensor(bool)": np.dtype(np.bool_),
    "tensor(uint8)": np.dtype(np.uint8),
    "tensor(uint16)": np.dtype(np.uint16),
    "tensor(uint32)": np.dtype(np.uint32),
    "tensor(uint64)": np.dtype(np.uint64),
    "tensor(int8)": np.dtype(np.int8),
    "tensor(int16)": np.dtype(np.int16),
    "tensor(int32)": np.dtype(np.int32),
    "tensor(int64)": np.dtype(np.int64),
    "tensor(float16)": np.dtype(np.float16),
    "tensor(float)": np.dtype(np.float32),
    "tensor(double)": np.dtype(np.float64),
}


@dataclass(frozen=True)
class TensorSpec:
    """One model input or output. `shape` uses -1 for a dynamic dimension."""

    name: str
    onnx_type: str
    shape: tuple[int, ...]

    @property
    def dtype(self) -> np.dtype | None:
        """The numpy dtype, or None for types onnxpool does not serve (e.g. strings)."""
        return ONNX_TO_NUMPY.get(self.onnx_type)

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "type": self.onnx_type, "shape": list(self.shape)}

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> TensorSpec:
        shape = data["shape"]
        assert isinstance(shape, list)
        return cls(name=str(data["name"]), onnx_type=str(data["type"]), shape=tuple(int(d) for d in shape))


@dataclass(frozen=True)
class ModelInfo:
    """The model's inputs and outputs, in the order the model declares them."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    metadata: tuple[tuple[str, str], ...] = ()
    """The model's `onnxpool.*` metadata_props (the INT8 recipe, workers/cpu_fit.py), sorted."""
    producers: tuple[tuple[str, str], ...] = ()
    """Output name -> the op type that makes it, through shape-only ops (workers/graph_outputs.py); read
    from the file by the preflight subprocess, empty in a worker's own view of its session."""

    def made_by(self, output: str) -> str:
        """The op type that makes `output` ("Softmax", "Sigmoid", "Gemm"...; "" when not known)."""
        return dict(self.producers).get(output, "")

    @property
    def metadata_map(self) -> dict[str, str]:
        return dict(self.metadata)

    def input(self, name: str) -> TensorSpec | None:
        return next((t for t in self.inputs if t.name == name), None)

    def output(self, name: str) -> TensorSpec | None:
        return next((t for t in self.outputs if t.name == name), None)

    def to_dict(self) -> dict[str, object]:
        return {
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
            "metadata": dict(self.metadata),
            "producers": dict(self.producers),
        }

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> ModelInfo:
        inputs, outputs, metadata = data["inputs"], data["outputs"], data.get("metadata", {})
        producers = data.get("producers", {})
        assert isinstance(inputs, list) and isinstance(outputs, list)
        assert isinstance(metadata, dict) and isinstance(producers, dict)
        return cls(
            inputs=tuple(TensorSpec.from_dict(t) for t in inputs),
            outputs=tuple(TensorSpec.from_dict(t) for t in outputs),
            metadata=tuple(sorted((str(k), str(v)) for k, v in metadata.items())),
            producers=tuple((str(k), str(v)) for k, v in producers.items()),
        )


def static_shape(spec: TensorSpec, batch: int = 1) -> tuple[int, ...]:
    """A concrete shape for a spec: dynamic dims become `batch` (first) or 1 (others)."""
    return tuple(d if d >= 0 else (batch if i == 0 else 1) for i, d in enumerate(spec.shape))


class FeedsRefused(ValueError):
    """onnxruntime refused a run's feeds (INVALID_ARGUMENT: a shape, rank or type the model does not take).

    Raised by the worker's session (workers/session.py) with a message naming the input; the server
    answers it as a 400 (the caller sent what the model cannot take), never a 500."""


def refused_feeds(info: ModelInfo, feeds: Mapping[str, np.ndarray], error: str) -> FeedsRefused:
    """The refusal, naming the first input whose feed's type, rank or fixed dimensions differ from the
    model's (onnxruntime's own message does not always name it), with onnxruntime's reason."""
    reason = error.split("INVALID_ARGUMENT : ", 1)[-1].strip().splitlines()[0].strip() if error else ""
    for spec in info.inputs:
        if spec.name not in feeds:
            continue
        value = np.asarray(feeds[spec.name])
        dtype, shape = spec.dtype, value.shape
        fits = (dtype is None or value.dtype == dtype) and len(shape) == len(spec.shape)
        fits = fits and all(want < 0 or want == got for want, got in zip(spec.shape, shape, strict=False))
        if not fits:
            wanted = "[" + ", ".join("?" if d < 0 else str(d) for d in spec.shape) + "]"
            return FeedsRefused(
                f"input '{spec.name}' takes {spec.onnx_type} {wanted}; got {value.dtype} {list(shape)}"
                + (f" ({reason})" if reason else "")
            )
    # Each feed fits its declared shape, but not the graph (a dynamic height of 8 pixels that its
    # convolutions shrink to nothing): named with its shape, and onnxruntime's reason.
    shown = ", ".join(f"'{name}' {np.asarray(v).dtype} {list(np.shape(v))}" for name, v in feeds.items())
    noun = "input" if len(feeds) == 1 else "inputs"
    return FeedsRefused(f"the model cannot run on {noun} {shown}: {reason or error}")
