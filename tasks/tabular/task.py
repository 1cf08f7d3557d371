"""Tabular models (scikit-learn, LightGBM, XGBoost... as their converters write them): KServe's v1 protocol.

`POST /v1/models/<model>:predict` (and `/predict`) with `{"instances": [...]}`: each
instance is a list of values in feature order, or an object keyed by feature name.
The reply is `{"predictions": [...]}`, one per instance: for a classifier
`{"label": "setosa", "probabilities": {"setosa": 0.97, ...}}`, for a regressor the value
(a number, or a list of numbers for a model with several targets).

Where the feature names come from, in order: `[task] features`; else the model's inputs,
when it has one input per feature (skl2onnx's `to_onnx(pipeline, dataframe)`: one (n, 1)
input per column, numbers, integers or strings, `columns.py`); else the model's single 2-D
input takes them positionally and objects cannot be used.
A classifier is a model with a label output and a probability output, whatever their names:
the probabilities a (n, classes) float tensor or skl2onnx's default ZipMap (`outputs.py`).
Class names: `[task] classes`, else the file `[task] labels`, else a ZipMap's classes,
else the class indices, as text.

v2 infer and gRPC see the model's own tensors, except where a v2 tensor cannot say what the
model gives or takes: a ZipMap output is served as a FP32 (n, classes) tensor, string inputs
as BYTES (`tensor_signature`).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, field_validator

from onnxpool.tasks import jsonfast
from onnxpool.tasks.api import (
    BytesLike,
    Feeds,
    JsonDocument,
    Outputs,
    RequestParts,
    SampleRequest,
    ServedModel,
    Task,
    TaskConfigError,
    TaskSettings,
)
from onnxpool.tasks.classes import load_labels
from onnxpool.tasks.errors import BadRequest
from onnxpool.tasks.json_body import json_operation, read_json
from onnxpool.tasks.tabular.columns import STRING, Column, as_array, convert, from_tensor, json_type, servable_type
from onnxpool.tasks.tabular.outputs import is_zipmap, label_indices, probability_matrix, zipmap_keys
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
    """The request's instances as the model's feeds (rows in request order): one (n, 1) array per
    per-feature input, or the (n, features) matrix of a single input."""

    feeds: dict[str, np.ndarray]
    count: int


@dataclass(frozen=True)
class _Layout:
    """How this model takes features and gives results (worked out once from its inputs and outputs)."""

    columns: tuple[Column, ...]
    """The features in column order ("" names: positional only), each with its input's type."""
    per_feature_inputs: bool
    """One model input per feature (each (n, 1)), else one (n, features) input."""
    kind: Literal["classifier", "regressor"]
    outputs: tuple[str, ...]
    """classifier: (label or "", probabilities); regressor: (value,)."""
    zipmap: bool = False
    """The probabilities are a ZipMap (a list of {class: probability} per row), not a tensor."""
    label_type: str = ""
    """The label output's ONNX type ("" without one)."""

    @property
    def features(self) -> tuple[str, ...]:
        return tuple(column.name for column in self.columns)


class Tabular(Task[Instances, Outputs, TabularSettings]):
    """Rows of named features (numbers, integers, strings) in, class labels and probabilities (or values) out."""

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
        self._keys: tuple[Any, ...] | None = None
        """A ZipMap's classes in its order: learnt from the sample request's reply in the master (`rehearsed`),
        else from the first reply in a worker."""

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
        for spec in inputs:
            if not servable_type(spec.onnx_type):
                raise TaskConfigError(
                    f"task tabular: input '{spec.name}' is {spec.onnx_type}; a tabular input holds numbers, "
                    "integers, booleans or strings"
                )
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
            columns = tuple(Column(spec.name, spec.onnx_type) for spec in inputs)
            per_feature = True
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
            columns = tuple(Column(name, spec.onnx_type) for name in (named or ("",) * width))
            per_feature = False
        kind, outputs = self._plan_outputs(model)
        probabilities = model.output(outputs[1]) if kind == "classifier" else None
        zipmap = probabilities is not None and is_zipmap(probabilities.onnx_type)
        if probabilities is not None and not zipmap and self.classes is not None:
            width = probabilities.shape[-1] if len(probabilities.shape) == 2 else -1
            if width > 0 and width != len(self.classes):
                raise TaskConfigError(
                    f"task tabular: {len(self.classes)} class names but output '{outputs[1]}' has {width} classes"
                )
        label = model.output(outputs[0]) if kind == "classifier" and outputs[0] else None
        return _Layout(columns, per_feature, kind, outputs, zipmap, label.onnx_type if label is not None else "")

    def _plan_outputs(self, model: ModelInfo) -> tuple[Literal["classifier", "regressor"], tuple[str, ...]]:
        options = self.settings

        def named(name: str, what: str) -> TensorSpec:
            spec = model.output(name)
            if spec is None:
                known = ", ".join(t.name for t in model.outputs)
                raise TaskConfigError(f"task.{what} = {name!r} is not an output of the model; outputs: {known}")
            if spec.dtype is None and not (what == "probabilities_output" and is_zipmap(spec.onnx_type)):
                if not (what == "label_output" and spec.onnx_type == STRING):
                    raise TaskConfigError(f"task.{what} = {name!r} is {spec.onnx_type}; a tensor is needed")
            return spec

        label = named(options.label_output, "label_output") if options.label_output else _label_output(model)
        probabilities = (
            named(options.probabilities_output, "probabilities_output")
            if options.probabilities_output
            else _probability_output(model)
        )
        kind = options.kind
        if kind == "auto":
            kind = "classifier" if label is not None and probabilities is not None else "regressor"
        if kind == "classifier":
            if probabilities is None:
                raise TaskConfigError(
                    "task tabular: a classifier needs a (n, classes) float probability output or a ZipMap; "
                    "set task.probabilities_output"
                )
            return "classifier", (label.name if label is not None else "", probabilities.name)
        value = named(options.value_output, "value_output") if options.value_output else model.outputs[0]
        if value.dtype is None or value.dtype.kind not in FLOAT_KINDS or len(value.shape) not in (1, 2):
            raise TaskConfigError(
                f"task tabular: output '{value.name}' ({value.onnx_type}, shape {list(value.shape)}) "
                "is not a regressor's (n) or (n, targets) float output"
            )
        return "regressor", (value.name,)

    # ---------------------------------------------------------------- what the master checks

    def sample_request(self) -> SampleRequest:
        """A row of every feature (0, an integer 0, false, a string; as an object when all are named)."""
        return SampleRequest(
            route=self.routes[0].replace("<model>", self.served.name),
            content_type="application/json",
            data=jsonfast.dumps(_example(self.layout.columns, rows=1)),
        )

    def rehearsed(self, inputs: Instances, result: Outputs) -> None:
        layout = self.layout
        if layout.kind != "classifier" or not layout.zipmap:
            return
        try:
            keys = zipmap_keys(result[layout.outputs[1]])
        except ValueError as exc:
            raise TaskConfigError(f"task tabular: output '{layout.outputs[1]}': {exc}") from None
        if self.classes is not None and len(self.classes) != len(keys):
            raise TaskConfigError(
                f"task tabular: {len(self.classes)} class names ([task] classes or labels) but output "
                f"'{layout.outputs[1]}' has {len(keys)} classes ({', '.join(map(str, keys[:10]))})"
            )
        self._keys = keys

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
        width = len(self.layout.columns)
        values: list[list[Any]] = [[] for _ in range(width)]  # column by column, as the arrays are made
        for i, instance in enumerate(instances):
            if isinstance(instance, list):
                row = self._row_of_list(i, instance, width)
            elif isinstance(instance, dict):
                row = self._row_of_object(i, instance, width)
            else:
                raise BadRequest(
                    f"instances[{i}] is {json_type(instance)}; send a list of {width} values or an object "
                    f"keyed by feature name ({self._feature_list()})"
                )
            for column, value in zip(values, row, strict=True):
                column.append(value)
        columns = self.layout.columns
        return self._instances([as_array(column, vals) for column, vals in zip(columns, values, strict=True)])

    def _instances(self, arrays: list[np.ndarray]) -> Instances:
        """The feeds of per-column (n,) arrays."""
        layout = self.layout
        count = len(arrays[0])
        if layout.per_feature_inputs:
            return Instances({c.name: a.reshape(-1, 1) for c, a in zip(layout.columns, arrays, strict=True)}, count)
        matrix = np.stack(arrays, axis=1) if arrays else np.empty((count, 0), layout.columns[0].dtype)
        return Instances({self.model.inputs[0].name: matrix}, count)

    def _row_of_list(self, i: int, values: list[Any], width: int) -> list[Any]:
        if len(values) != width:
            raise BadRequest(
                f"instances[{i}] has {len(values)} values; the model takes {width} features ({self._feature_list()})"
            )
        columns = self.layout.columns
        return [
            convert(column, value, f"instances[{i}] feature '{self._layout_name(j)}'")
            for j, (column, value) in enumerate(zip(columns, values, strict=True))
        ]

    def _row_of_object(self, i: int, values: dict[str, Any], width: int) -> list[Any]:
        if not self._index:
            raise BadRequest(
                f"instances[{i}] is an object, but this model's features have no names; send a list of {width} "
                "values (or name them in [task] features)"
            )
        extra = [name for name in values if name not in self._index]
        if extra:
            shown = ", ".join(repr(name[:40]) for name in extra[:5])
            raise BadRequest(f"instances[{i}] has unknown feature(s) {shown}; the features are {self._feature_list()}")
        row: list[Any] = [None] * width
        columns = self.layout.columns
        for name, j in self._index.items():
            if name not in values:
                raise BadRequest(f"instances[{i}] is missing feature '{name}'")
            row[j] = convert(columns[j], values[name], f"instances[{i}] feature '{name}'")
        return row

    def _layout_name(self, j: int) -> str:
        name = self.layout.features[j]
        return name or f"column {j}"

    def _feature_list(self) -> str:
        return ", ".join(name or f"column {j}" for j, name in enumerate(self.layout.features))

    def logged(self, inputs: Instances) -> JsonDocument:
        # The rows as features, named where the model names them: what drift monitoring reads. numpy
        # scalars, not `tolist()`'s floats: orjson writes a float32 as its shortest repr (5.1, not 5.0999999).
        layout = self.layout
        if layout.per_feature_inputs:
            columns = [list(inputs.feeds[c.name].reshape(-1)) for c in layout.columns]
        else:
            matrix = next(iter(inputs.feeds.values()))
            columns = [list(matrix[:, j]) for j in range(len(layout.columns))]
        names = layout.features
        if all(names):
            return {"instances": [dict(zip(names, row, strict=True)) for row in zip(*columns, strict=True)]}
        return {"instances": [list(row) for row in zip(*columns, strict=True)]}

    def canonical(self, inputs: Instances) -> Sequence[BytesLike]:
        # The values as the model gets them (a list and an object with the same values are one request).
        parts: list[BytesLike] = []
        for name, array in inputs.feeds.items():
            parts.append(struct.pack(">II", *array.shape) + array.dtype.str.encode() + name.encode() + b"\0")
            if array.dtype == object:  # strings: each one's UTF-8 length and bytes
                encoded = [str(item).encode("utf-8", "surrogatepass") for item in array.reshape(-1)]
                parts.append(b"".join(struct.pack(">I", len(item)) + item for item in encoded))
            else:
                parts.append(np.ascontiguousarray(array).tobytes())
        return parts

    def feeds(self, inputs: Instances) -> Feeds:
        return inputs.feeds

    def output_names(self) -> Sequence[str]:
        return [name for name in self.layout.outputs if name]

    def class_names(self) -> Sequence[str] | None:
        if self.classes is not None:
            return self.classes
        if self._keys is not None:
            return tuple(str(key) for key in self._keys)
        return None

    def _names(self, keys: tuple[Any, ...] | None, width: int) -> tuple[str, ...]:
        if self.classes is not None:
            return self.classes
        if keys is not None:
            return tuple(str(key) for key in keys)
        return tuple(str(i) for i in range(width))

    def _classified(self, result: Outputs) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
        """(probabilities (n, classes) float64, each row's class index, the class names) of a classifier."""
        layout = self.layout
        label_name, probability_name = layout.outputs
        value = result[probability_name]
        keys = None
        if layout.zipmap:
            keys = self._keys if self._keys is not None else zipmap_keys(value)
            self._keys = keys
        probabilities = probability_matrix(value, keys)
        names = self._names(keys, probabilities.shape[1])
        if len(names) != probabilities.shape[1]:
            raise RuntimeError(f"{len(names)} class names for {probabilities.shape[1]} classes")  # checked at start
        labels = result.get(label_name) if label_name else None
        # A string label (classes trained as text) names its class: mapped through the keys, else the names.
        known = keys if keys is not None else (names if layout.label_type == STRING else None)
        return probabilities, label_indices(labels, probabilities, known), names

    def reply(self, inputs: Instances, result: Outputs) -> dict[str, Any]:
        layout = self.layout
        digits = self.settings.digits
        if layout.kind == "regressor":
            values = np.asarray(result[layout.outputs[0]], dtype=np.float64)
            self._check_answered(inputs, values)
            if digits is not None:
                values = np.round(values, digits)
            if values.ndim == 2 and values.shape[1] == 1:
                values = values[:, 0]
            return {"predictions": values.tolist()}
        probabilities, indices, names = self._classified(result)
        self._check_answered(inputs, probabilities)
        if digits is not None:
            probabilities = np.round(probabilities, digits)
        predictions = [
            {"label": names[int(best)], "probabilities": dict(zip(names, row, strict=True))}
            for best, row in zip(indices, probabilities.tolist(), strict=True)
        ]
        return {"predictions": predictions}

    def _check_answered(self, inputs: Instances, values: np.ndarray) -> None:
        """A 400 for a row the model answered NaN: a missing value (null) that this model cannot do without
        (trees route a missing value; a linear model or a scaler passes NaN on to every score)."""
        if values.dtype.kind != "f":
            return
        unanswered = np.isnan(values.reshape(len(values), -1)).any(axis=1)
        if not unanswered.any():
            return
        row = int(np.argmax(unanswered))
        missing = [
            name
            for name, array in inputs.feeds.items()
            if array.dtype.kind == "f" and np.isnan(array[row]).any()
            for name in (self._missing_names(name, array[row]))
        ]
        said = f"; missing (null): {', '.join(missing)}" if missing else ""
        raise BadRequest(f"instances[{row}]: the model gives no prediction (NaN) for this row{said}")

    def _missing_names(self, name: str, values: np.ndarray) -> list[str]:
        """The features of one row's feed that are NaN (a per-feature input is its feature)."""
        if self.layout.per_feature_inputs:
            return [name]
        return [self._layout_name(int(j)) for j in np.flatnonzero(np.isnan(values.reshape(-1)))]

    # ---------------------------------------------------------------- v2 infer and gRPC

    def tensor_signature(self) -> ModelInfo | None:
        """The model's tensors where v2 can carry them (None: the model's own, served straight on the session);
        a ZipMap output as FP32 (n, classes), string inputs as BYTES."""
        layout = self.layout
        if not layout.zipmap and all(column.kind != "U" for column in layout.columns):
            return None
        outputs: list[TensorSpec] = []
        if layout.kind == "classifier":
            label, probabilities = layout.outputs
            if label:
                outputs.append(TensorSpec(label, layout.label_type, (-1,)))
            spec = self.model.output(probabilities)
            assert spec is not None
            if layout.zipmap:  # its classes: the sample request's (`rehearsed`), else the names given
                width = len(self._keys) if self._keys is not None else len(self.classes or ()) or -1
                spec = TensorSpec(probabilities, "tensor(float)", (-1, width))
            outputs.append(spec)
        else:
            spec = self.model.output(layout.outputs[0])
            assert spec is not None
            outputs.append(spec)
        return ModelInfo(inputs=self.model.inputs, outputs=tuple(outputs))

    def from_tensors(self, tensors: Mapping[str, np.ndarray]) -> Instances:
        layout = self.layout
        feeds: dict[str, np.ndarray] = {}
        for spec in self.model.inputs:
            column = Column(spec.name, spec.onnx_type)
            feeds[spec.name] = from_tensor(column, tensors[spec.name], f"input '{spec.name}'")
        counts = {array.shape[0] if array.ndim else 1 for array in feeds.values()}
        if len(counts) != 1:
            raise BadRequest(f"the inputs have different numbers of rows: {sorted(counts)}")
        count = counts.pop()
        limit = self.served.limits.max_batch
        if count > limit:
            raise BadRequest(f"{count} rows in one request; max_batch is {limit}")
        del layout
        return Instances(feeds, count)

    def to_tensors(self, inputs: Instances, result: Outputs) -> dict[str, np.ndarray]:
        layout = self.layout
        if layout.kind == "regressor":
            return {layout.outputs[0]: np.asarray(result[layout.outputs[0]])}
        label, probability_name = layout.outputs
        probabilities, _, _ = self._classified(result)
        tensors: dict[str, np.ndarray] = {}
        if label:
            tensors[label] = np.asarray(result[label]).reshape(-1)
        tensors[probability_name] = probabilities.astype(np.float32)
        return tensors

    # ---------------------------------------------------------------- /docs

    def openapi(self, route: str) -> dict[str, Any]:
        layout = self._layout
        columns = (
            layout.columns if layout is not None else tuple(Column(n, "tensor(float)") for n in self.settings.features)
        )
        named = [column for column in columns if column.name]
        schemas = {column.json_type: _value_schema(column) for column in columns}
        row_as_list = {
            "type": "array",
            "items": next(iter(schemas.values())) if len(schemas) == 1 else {"anyOf": list(schemas.values())},
            "description": "values in feature order: "
            + ", ".join(f"{column.name or f'column {j}'} ({column.json_type})" for j, column in enumerate(columns)),
        }
        row_as_object: dict[str, Any] = {
            "type": "object",
            "description": "values by feature name",
            "additionalProperties": False,
            "properties": {column.name: _value_schema(column) for column in named},
            "required": [column.name for column in named],
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
            _example(columns) if columns else None,
        )


def _value_schema(column: Column) -> dict[str, Any]:
    """A feature's JSON Schema: its type, null too where a missing value is NaN (floats)."""
    if column.kind == "f":
        return {"type": "number", "nullable": True, "description": f"{column.onnx_type}; null = missing (NaN)"}
    return {"type": column.json_type, "description": column.onnx_type}


def _label_output(model: ModelInfo) -> TensorSpec | None:
    """The model's label output: its first rank-1 (or (n, 1)) integer or string output."""
    for spec in model.outputs:
        rank_ok = len(spec.shape) == 1 or (len(spec.shape) == 2 and spec.shape[1] == 1)
        typed = spec.onnx_type == STRING or (spec.dtype is not None and spec.dtype.kind in LABEL_KINDS)
        if rank_ok and typed:
            return spec
    return None


def _probability_output(model: ModelInfo) -> TensorSpec | None:
    """The model's probability output: its first ZipMap, else its first (n, classes) float output."""
    zipmap = next((spec for spec in model.outputs if is_zipmap(spec.onnx_type)), None)
    return zipmap if zipmap is not None else _first(model, FLOAT_KINDS, 2)


def _example(columns: Sequence[Column], rows: int = 2) -> dict[str, Any]:
    """A request for /docs and the master's sample: a row by feature name (when all are named) and a row as a
    list, of each feature's type (0, an integer 0, false, a string)."""
    values = [column.example for column in columns]
    made: list[Any] = []
    if all(column.name for column in columns):
        made.append({column.name: value for column, value in zip(columns, values, strict=True)})
    made.append(values)
    return {"instances": made[:rows]}


def _is_column(spec: TensorSpec) -> bool:
    return len(spec.shape) == 2 and spec.shape[1] == 1


def _first(model: ModelInfo, kinds: tuple[str, ...], rank: int) -> TensorSpec | None:
    """The model's first output of a dtype kind and rank (e.g. the integer labels, the float probabilities)."""
    return next(
        (t for t in model.outputs if t.dtype is not None and t.dtype.kind in kinds and len(t.shape) == rank), None
    )
