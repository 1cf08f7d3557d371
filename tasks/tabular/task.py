"""Tabular models (scikit-learn and friends, exported to ONNX): KServe's v1 protocol.

`POST /v1/models/<model>:predict` (and `/predict`) with `{"instances": [...]}`: each
instance is a list of numbers in feature order, or an object keyed by feature name.
The reply is `{"predictions": [...]}`, one per instance: for a classifier
`{"label": "setosa", "probabilities": {"setosa": 0.97, ...}}`, for a regressor the value
(a number, or a list of numbers for a model with several targets).

Where the feature names come from, in order: `[task] features`; else the model's inputs,
when it has one input per feature (skl2onnx with one `initial_types` entry per column);
else the model's single 2-D input takes them positionally and objects cannot be used.
Class names: `[task] classes`, else the file `[task] labels`, else the class indices as text.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, field_validator

from onnxpool.tasks.api import BytesLike, Feeds, Outputs, RequestParts, ServedModel, Task, TaskConfigError, TaskSettings
from onnxpool.tasks.classes import load_labels
from onnxpool.tasks.errors import BadRequest
from onnxpool.tasks.json_body import json_operation, read_json
from onnxpool.workers.model_info import ModelInfo, TensorSpec

FLOAT_KINDS = ("f",)
LABEL_KINDS = ("i", "u")


class TabularSettings(TaskSettings):
    """`[task]` of the tabular task."""

    features: tuple[str, ...] = ()
    """Feature names in the model's column order (empty: the model's per-feature input names)."""
    classes: tuple[str, ...] = ()
    """Class names in output-index order (empty: the file `labels`, else the indices)."""
    labels: Path | None = None
    """UTF-8 file with one class name per line, in output-index order ("" = none), when `classes` is empty."""
    kind: Literal["auto", "classifier", "regressor"] = "auto"
    """`auto`: a classifier when the model has an integer label output and a probability output."""
    label_output: str = ""
    """Classifier's label output ("" = the model's integer output)."""
    probabilities_output: str = ""
    """Classifier's probability output ("" = the model's 2-D float output)."""
    value_output: str = ""
    """Regressor's output ("" = the model's first output)."""
    digits: int | None = Field(default=None, ge=0, le=17)
    """Round probabilities and values to this many decimal digits (None: as computed, float32)."""

    @field_validator("features", "classes")
    @classmethod
    def _distinct(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(value)) != len(value):
            repeated = sorted({name for name in value if value.count(name) > 1})
            raise ValueError(f"names must be distinct; repeated: {', '.join(repeated)}")
        if any(not name for name in value):
            raise ValueError("names must not be empty")
        return value

    @field_validator("labels", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if value == "" else value


@dataclass(frozen=True)
class Instances:
    """The request's instances as one matrix, rows in request order, columns in feature order."""

    rows: np.ndarray


@dataclass(frozen=True)
class _Layout:
    """How this model takes features and gives results (worked out once from its inputs and outputs)."""

    features: tuple[str, ...]
    """Feature names in column order ("" names: positional only)."""
    per_feature_inputs: bool
    """One model input per feature (each (n, 1)), else one (n, features) input."""
    input_dtype: np.dtype
    kind: Literal["classifier", "regressor"]
    outputs: tuple[str, ...]
    """classifier: (label, probabilities); regressor: (value,)."""


class Tabular(Task[Instances, Outputs, TabularSettings]):
    """Rows of named numeric features in, class labels and probabilities (or values) out."""

    name = "tabular"
    settings_model = TabularSettings
    routes = ("/v1/models/<model>:predict", "/predict")
    content_types = ("application/json",)

    def __init__(self, settings: TabularSettings, served: ServedModel) -> None:
        super().__init__(settings, served)
        if settings.classes:
            self.classes: tuple[str, ...] | None = settings.classes
        else:
            self.classes = tuple(load_labels(settings.labels)) if settings.labels is not None else None
        self._layout: _Layout | None = None
        self._index: dict[str, int] = {}

    def fingerprint(self) -> str:
        return "\n".join(self.classes or ())

    # ---------------------------------------------------------------- the model, once

    def bind(self, model: ModelInfo) -> None:
        """Work out (and check: TaskConfigError with one line) how the model takes features and gives results."""
        self._layout = self._plan(model)
        self._index = {name: i for i, name in enumerate(self._layout.features) if name}

    @property
    def layout(self) -> _Layout:
        """The bound model's layout."""
        if self._layout is None:
            raise RuntimeError("the tabular task is not bound to a model")
        return self._layout

    def _plan(self, model: ModelInfo) -> _Layout:
        named = self.settings.features
        inputs = model.inputs
        if len(inputs) > 1:
            if not all(_is_column(spec) for spec in inputs):
                raise TaskConfigError(
                    f"task tabular: the model has {len(inputs)} inputs; a tabular model takes one (n, features) "
                    "input or one (n, 1) input per feature"
                )
            model_names = tuple(spec.name for spec in inputs)
            if named and named != model_names:
                raise TaskConfigError(
                    f"task.features = {list(named)} but the model's inputs (one per feature) are {list(model_names)}"
                )
            features, per_feature, spec = model_names, True, inputs[0]
        else:
            spec = inputs[0]
            if len(spec.shape) != 2:
                raise TaskConfigError(
                    f"task tabular: input '{spec.name}' has shape {list(spec.shape)}; a tabular input is (n, features)"
                )
            width = spec.shape[1]
            if named and width > 0 and width != len(named):
                raise TaskConfigError(
                    f"task.features names {len(named)} features but input '{spec.name}' takes {width} columns"
                )
            if not named and width <= 0:
                raise TaskConfigError(
                    f"task tabular: input '{spec.name}' has a dynamic number of columns; name them in task.features"
                )
            features, per_feature = (named or ("",) * width), False
        dtype = spec.dtype
        if dtype is None or dtype.kind not in FLOAT_KINDS:
            raise TaskConfigError(f"task tabular: input '{spec.name}' is {spec.onnx_type}; a float input is needed")
        kind, outputs = self._plan_outputs(model)
        if kind == "classifier" and self.classes is not None:
            probabilities = model.output(outputs[1])
            assert probabilities is not None
            width = probabilities.shape[-1] if len(probabilities.shape) == 2 else -1
            if width > 0 and width != len(self.classes):
                raise TaskConfigError(
                    f"task tabular: {len(self.classes)} class names but output '{outputs[1]}' has {width} classes"
                )
        return _Layout(features, per_feature, dtype, kind, outputs)

    def _plan_outputs(self, model: ModelInfo) -> tuple[Literal["classifier", "regressor"], tuple[str, ...]]:
        options = self.settings

        def named(name: str, what: str) -> TensorSpec:
            spec = model.output(name)
            if spec is None:
                known = ", ".join(t.name for t in model.outputs)
                raise TaskConfigError(f"task.{what} = {name!r} is not an output of the model; outputs: {known}")
            if spec.dtype is None:
                raise TaskConfigError(
                    f"task.{what} = {name!r} is {spec.onnx_type}; a tensor is needed (skl2onnx: zipmap=False)"
                )
            return spec

        label = named(options.label_output, "label_output") if options.label_output else _first(model, LABEL_KINDS, 1)
        probabilities = (
            named(options.probabilities_output, "probabilities_output")
            if options.probabilities_output
            else _first(model, FLOAT_KINDS, 2)
        )
        kind = options.kind
        if kind == "auto":
            kind = "classifier" if label is not None and probabilities is not None else "regressor"
        if kind == "classifier":
            if probabilities is None:
                raise TaskConfigError(
                    "task tabular: a classifier needs a (n, classes) float probability output "
                    "(skl2onnx: options={'zipmap': False}); set task.probabilities_output"
                )
            return "classifier", (label.name if label is not None else "", probabilities.name)
        value = named(options.value_output, "value_output") if options.value_output else model.outputs[0]
        if value.dtype is None or value.dtype.kind not in FLOAT_KINDS or len(value.shape) not in (1, 2):
            raise TaskConfigError(
                f"task tabular: output '{value.name}' ({value.onnx_type}, shape {list(value.shape)}) "
                "is not a regressor's (n) or (n, targets) float output"
            )
        return "regressor", (value.name,)

    # ---------------------------------------------------------------- a request

    def read(self, request: RequestParts) -> Instances:
        document = read_json(request, self.served.limits.max_json_depth, '{"instances": [...]}')
        if not isinstance(document, dict) or "instances" not in document:
            raise BadRequest('the body must be a JSON object with "instances": a list of rows')
        extra = sorted(set(document) - {"instances", "parameters"})
        if extra:
            raise BadRequest(f'unknown member(s) {", ".join(map(repr, extra))}; send {{"instances": [...]}}')
        instances = document["instances"]
        if not isinstance(instances, list) or not instances:
            raise BadRequest('"instances" must be a non-empty list of rows')
        limit = self.served.limits.max_batch
        if len(instances) > limit:
            raise BadRequest(f"{len(instances)} instances in one request; max_batch is {limit}")
        layout = self.layout
        width = len(layout.features)
        rows = np.empty((len(instances), width), dtype=np.float64)
        for i, instance in enumerate(instances):
            if isinstance(instance, list):
                rows[i] = self._row_of_list(i, instance, width)
            elif isinstance(instance, dict):
                rows[i] = self._row_of_object(i, instance, width)
            else:
                raise BadRequest(
                    f"instances[{i}] is {_json_type(instance)}; send a list of {width} numbers or an object "
                    f"keyed by feature name ({self._feature_list()})"
                )
        return Instances(rows.astype(layout.input_dtype))

    def _row_of_list(self, i: int, values: list[Any], width: int) -> list[float]:
        if len(values) != width:
            raise BadRequest(
                f"instances[{i}] has {len(values)} values; the model takes {width} features ({self._feature_list()})"
            )
        return [self._number(i, self._layout_name(j), value) for j, value in enumerate(values)]

    def _row_of_object(self, i: int, values: dict[str, Any], width: int) -> list[float]:
        if not self._index:
            raise BadRequest(
                f"instances[{i}] is an object, but this model's features have no names; send a list of {width} "
                "numbers (or name them in [task] features)"
            )
        extra = [name for name in values if name not in self._index]
        if extra:
            shown = ", ".join(repr(name[:40]) for name in extra[:5])
            raise BadRequest(f"instances[{i}] has unknown feature(s) {shown}; the features are {self._feature_list()}")
        row = [0.0] * width
        for name, j in self._index.items():
            if name not in values:
                raise BadRequest(f"instances[{i}] is missing feature '{name}'")
            row[j] = self._number(i, name, values[name])
        return row

    @staticmethod
    def _number(i: int, feature: str, value: Any) -> float:
        # bool is an int to Python, never a number to a caller; NaN/inf do not come from JSON.
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise BadRequest(f"instances[{i}] feature '{feature}' is {_json_type(value)}, not a number")
        number = float(value)
        if not math.isfinite(number):
            raise BadRequest(f"instances[{i}] feature '{feature}' is out of range")
        return number

    def _layout_name(self, j: int) -> str:
        name = self.layout.features[j]
        return name or f"column {j}"

    def _feature_list(self) -> str:
        return ", ".join(name or f"column {j}" for j, name in enumerate(self.layout.features))

    def canonical(self, inputs: Instances) -> Sequence[BytesLike]:
        # The values as the model gets them (a list and an object with the same numbers are one request).
        rows = np.ascontiguousarray(inputs.rows)
        return [struct.pack(">II", *rows.shape) + rows.dtype.str.encode(), rows.tobytes()]

    def feeds(self, inputs: Instances) -> Feeds:
        layout = self.layout
        if layout.per_feature_inputs:
            return {name: inputs.rows[:, j : j + 1] for j, name in enumerate(layout.features)}
        return {self.model.inputs[0].name: inputs.rows}

    def output_names(self) -> Sequence[str]:
        return [name for name in self.layout.outputs if name]

    def class_names(self) -> Sequence[str] | None:
        return self.classes

    def reply(self, inputs: Instances, result: Outputs) -> dict[str, Any]:
        layout = self.layout
        outputs = result
        digits = self.settings.digits
        if layout.kind == "regressor":
            values = np.asarray(outputs[layout.outputs[0]], dtype=np.float64)
            if digits is not None:
                values = np.round(values, digits)
            if values.ndim == 2 and values.shape[1] == 1:
                values = values[:, 0]
            return {"predictions": values.tolist()}
        probabilities = np.asarray(outputs[layout.outputs[1]], dtype=np.float64)
        if digits is not None:
            probabilities = np.round(probabilities, digits)
        names = self.classes or tuple(str(i) for i in range(probabilities.shape[1]))
        indices = np.argmax(probabilities, axis=1)
        predictions = [
            {"label": names[int(best)], "probabilities": dict(zip(names, row, strict=True))}
            for best, row in zip(indices, probabilities.tolist(), strict=True)
        ]
        return {"predictions": predictions}

    def openapi(self, route: str) -> dict[str, Any]:
        layout = self._layout
        features = [name for name in layout.features if name] if layout is not None else list(self.settings.features)
        row_as_list = {"type": "array", "items": {"type": "number"}, "description": "values in feature order"}
        row_as_object: dict[str, Any] = {
            "type": "object",
            "description": "values by feature name",
            "additionalProperties": False,
            "properties": {name: {"type": "number"} for name in features},
            "required": features,
        }
        prediction: dict[str, Any] = {
            "anyOf": [
                {
                    "type": "object",
                    "required": ["label", "probabilities"],
                    "properties": {
                        "label": {"type": "string"},
                        "probabilities": {"type": "object", "additionalProperties": {"type": "number"}},
                    },
                },
                {"type": "number"},
                {"type": "array", "items": {"type": "number"}},
            ]
        }
        return json_operation(
            "Predict for rows of named features (KServe v1)",
            {
                "type": "object",
                "required": ["instances"],
                "properties": {
                    "instances": {"type": "array", "minItems": 1, "items": {"anyOf": [row_as_list, row_as_object]}}
                },
            },
            "One prediction per instance, in order",
            {
                "type": "object",
                "required": ["predictions"],
                "properties": {"predictions": {"type": "array", "items": prediction}},
            },
            _example(layout.features if layout is not None else tuple(self.settings.features)),
        )


def _example(features: tuple[str, ...]) -> dict[str, Any] | None:
    """A request of two rows for /docs, one as a list and one by feature name (when all are named); values 0."""
    if not features:
        return None
    rows: list[Any] = [[0.0] * len(features)]
    if all(features):
        rows.append(dict.fromkeys(features, 0.0))
    return {"instances": rows}


def _is_column(spec: TensorSpec) -> bool:
    return len(spec.shape) == 2 and spec.shape[1] == 1


def _first(model: ModelInfo, kinds: tuple[str, ...], rank: int) -> TensorSpec | None:
    """The model's first output of a dtype kind and rank (e.g. the integer labels, the float probabilities)."""
    return next(
        (t for t in model.outputs if t.dtype is not None and t.dtype.kind in kinds and len(t.shape) == rank), None
    )


def _json_type(value: Any) -> str:
    names: Mapping[type, str] = {str: "a string", bool: "a boolean", list: "a list", dict: "an object"}
    if value is None:
        return "null"
    return names.get(type(value), type(value).__name__)
