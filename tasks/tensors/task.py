"""Any model, no pre- or post-processing: named tensors as nested JSON lists, in and out.

`POST /predict` with `{"inputs": {"<input name>": [[...], ...], ...}}` answers
`{"model": ..., "outputs": {"<output name>": [...], ...}}` (TensorFlow Serving's columnar
form). Every input of the model must be given, with its rank and fixed dimensions; the
first dimension is the batch and is bounded by `[limits] max_batch`. The Open Inference
Protocol v2 (`/v2/models/<m>/infer`, binary tensors included) serves every model too;
this route is the short form for curl and for callers without a v2 client.

It is what `[model] task = "auto"` picks for a model whose first input is not an image.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxpool.tasks import jsonfast
from onnxpool.tasks.api import (
    BytesLike,
    Feeds,
    JsonDocument,
    Outputs,
    RequestParts,
    Task,
    TaskConfigError,
    TaskSettings,
)
from onnxpool.tasks.errors import BadRequest, PayloadTooLarge
from onnxpool.tasks.json_body import json_operation, read_json
from onnxpool.tasks.logged import tensors
from onnxpool.workers.model_info import ModelInfo


@dataclass(frozen=True)
class Tensors:
    """The request's inputs, by name, as the model takes them."""

    arrays: dict[str, np.ndarray]


class NamedTensors(Task[Tensors, Outputs, TaskSettings]):
    """Named tensors in, named tensors out."""

    name = "tensors"
    routes = ("/predict",)
    content_types = ("application/json",)

    def bind(self, model: ModelInfo) -> None:
        unserved = [t for t in (*model.inputs, *model.outputs) if t.dtype is None]
        if unserved:
            listed = ", ".join(f"{t.name} ({t.onnx_type})" for t in unserved)
            # A converted classifier's ZipMap and string columns are no plain tensors: the tabular task reads them.
            converted = any(t.onnx_type.startswith("seq(map(") or t.onnx_type == "tensor(string)" for t in unserved)
            hint = '; a converted scikit-learn model: [model] task = "tabular" (or "auto")' if converted else ""
            raise TaskConfigError(f"task tensors: tensors of types onnxpool does not serve: {listed}{hint}")

    def read(self, request: RequestParts) -> Tensors:
        model = self.model
        limits = self.served.limits
        document = read_json(request, limits.max_json_depth, '{"inputs": {"<name>": [...]}}')
        if not isinstance(document, dict) or not isinstance(document.get("inputs"), dict):
            raise BadRequest('the body must be a JSON object with "inputs": an object of named tensors')
        given: dict[str, Any] = document["inputs"]
        names = [t.name for t in model.inputs]
        unknown = sorted(set(given) - set(names))
        if unknown:
            raise BadRequest(
                f"unknown input(s) {', '.join(map(repr, unknown))}; the model's inputs: {', '.join(names)}"
            )
        arrays: dict[str, np.ndarray] = {}
        for spec in model.inputs:
            if spec.name not in given:
                raise BadRequest(f"input '{spec.name}' is missing; the model's inputs: {', '.join(names)}")
            assert spec.dtype is not None  # check() refused the rest
            try:
                array = np.asarray(given[spec.name], dtype=spec.dtype)
            except (ValueError, TypeError, OverflowError):
                raise BadRequest(f"input '{spec.name}' is not a regular array of {spec.dtype.name} numbers") from None
            if array.ndim != len(spec.shape):
                raise BadRequest(f"input '{spec.name}' has {array.ndim} dimensions; the model takes {len(spec.shape)}")
            for axis, (got, want) in enumerate(zip(array.shape, spec.shape, strict=True)):
                if want >= 0 and got != want:
                    raise BadRequest(f"input '{spec.name}' dimension {axis} is {got}; the model takes {want}")
            if array.ndim and array.shape[0] > limits.max_batch:
                raise PayloadTooLarge(
                    f"input '{spec.name}' has a batch of {array.shape[0]}; max_batch is {limits.max_batch}"
                )
            if array.size > limits.max_elements:
                raise PayloadTooLarge(
                    f"input '{spec.name}' has {array.size} elements; max_elements is {limits.max_elements}"
                )
            arrays[spec.name] = array
        return Tensors(arrays)

    def logged(self, inputs: Tensors) -> JsonDocument:
        return {"inputs": tensors(inputs.arrays)}

    def canonical(self, inputs: Tensors) -> Sequence[BytesLike]:
        parts: list[BytesLike] = []
        for name, array in inputs.arrays.items():
            parts.append(jsonfast.dumps([name, array.dtype.str, list(array.shape)]))
            parts.append(np.ascontiguousarray(array).tobytes())
        return parts

    def feeds(self, inputs: Tensors) -> Feeds:
        return inputs.arrays

    def reply(self, inputs: Tensors, result: Outputs) -> dict[str, Any]:
        return {"model": self.served.name, "outputs": {name: np.asarray(v) for name, v in result.items()}}

    def openapi(self, route: str) -> dict[str, Any]:
        tensor = {"description": "a nested list (rank and fixed dimensions as the model's)"}
        return json_operation(
            "Run the model on named tensors given as nested JSON lists",
            {
                "type": "object",
                "required": ["inputs"],
                "properties": {"inputs": {"type": "object", "additionalProperties": tensor}},
            },
            "The model's outputs by name",
            {
                "type": "object",
                "required": ["model", "outputs"],
                "properties": {
                    "model": {"type": "string"},
                    "outputs": {"type": "object", "additionalProperties": tensor},
                },
            },
        )
