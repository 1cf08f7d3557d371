"""A tabular model's features as its converter wrote them: one typed column each.

skl2onnx's `to_onnx(pipeline, dataframe)` makes one (n, 1) input per DataFrame column, each of
the column's own type: float for numbers, int64 for integer columns, string for text columns
that a OneHotEncoder reads; a model converted from a numpy matrix takes one (n, features) input
of one type. Each feature is therefore a `Column` with the ONNX type of the input it feeds, and a
value from a JSON row (or a v2 tensor) is checked and converted for that type here, with a 400
naming the feature when it cannot be. A missing value (JSON null) is NaN where the type has one
(float: the model decides what missing means: XGBoost and LightGBM route it, an imputer fills
it), and a 400 where it has none (int, string, bool). A string feature takes any string:
a category the model has not seen reaches it (OneHotEncoder's handle_unknown decides).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxpool.tasks.errors import BadRequest
from onnxpool.workers.model_info import TensorSpec

STRING = "tensor(string)"


@dataclass(frozen=True)
class Column:
    """One feature: its name ("" when only positional) and the type of the model input it feeds."""

    name: str
    onnx_type: str

    @property
    def kind(self) -> str:
        """numpy's kind of the input's type: "f" float, "i"/"u" integer, "b" bool, "U" string."""
        if self.onnx_type == STRING:
            return "U"
        dtype = TensorSpec("", self.onnx_type, ()).dtype
        assert dtype is not None, f"{self.onnx_type} is not a feature type"
        return dtype.kind

    @property
    def dtype(self) -> np.dtype:
        """The array type the model takes (strings: Python str objects, as onnxruntime wants them)."""
        if self.onnx_type == STRING:
            return np.dtype(object)
        dtype = TensorSpec("", self.onnx_type, ()).dtype
        assert dtype is not None
        return dtype

    @property
    def json_type(self) -> str:
        """The JSON Schema type of a value (`/docs`, the OpenAPI document)."""
        return {"f": "number", "i": "integer", "u": "integer", "b": "boolean", "U": "string"}[self.kind]

    @property
    def example(self) -> Any:
        """A value of this type for an example request."""
        return {"f": 0.0, "i": 0, "u": 0, "b": False, "U": "a"}[self.kind]


def servable_type(onnx_type: str) -> bool:
    """A feature type this task converts JSON values to."""
    if onnx_type == STRING:
        return True
    dtype = TensorSpec("", onnx_type, ()).dtype
    return dtype is not None and dtype.kind in "fiub"


def json_type(value: Any) -> str:
    names: dict[type, str] = {
        str: "a string",
        bool: "a boolean",
        list: "a list",
        dict: "an object",
        int: "a number",
        float: "a number",
    }
    if value is None:
        return "null"
    return names.get(type(value), type(value).__name__)


def convert(column: Column, value: Any, where: str) -> Any:
    """`value` (from JSON) as this column's type, or BadRequest naming the feature (`where`)."""
    kind = column.kind
    if kind == "U":
        if isinstance(value, str):
            return value
        raise BadRequest(f"{where} is {json_type(value)}; the model takes a string ({column.onnx_type})")
    if value is None:
        if kind == "f":
            return math.nan  # missing: the model's own rule (trees route it, an imputer fills it)
        raise BadRequest(f"{where} is null; the model's {column.onnx_type} input has no missing value")
    if kind == "b":
        if isinstance(value, bool):
            return value
        raise BadRequest(f"{where} is {json_type(value)}; the model takes true or false")
    # bool is an int to Python, never a number to a caller; NaN/inf do not come from JSON.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest(f"{where} is {json_type(value)}, not a number")
    if kind == "f":
        number = float(value)
        if not math.isfinite(number):
            raise BadRequest(f"{where} is out of range")
        return number
    if isinstance(value, float):
        if not value.is_integer():
            raise BadRequest(f"{where} is {value}; the model takes an integer ({column.onnx_type})")
        value = int(value)
    info = np.iinfo(column.dtype)
    if not info.min <= value <= info.max:
        raise BadRequest(f"{where} is {value}, outside the range of the model's {column.onnx_type} input")
    return value


def as_array(column: Column, values: list[Any]) -> np.ndarray:
    """Converted values (`convert`) as the (n,) array of the column's type."""
    if column.kind == "U":
        array = np.empty(len(values), dtype=object)
        array[:] = values
        return array
    if column.kind == "f":
        return np.asarray(values, dtype=np.float64).astype(column.dtype)
    return np.asarray(values, dtype=column.dtype)


def from_tensor(column: Column, tensor: np.ndarray, where: str) -> np.ndarray:
    """A v2 tensor (decoded against the model's input) as the column's values; BYTES decoded as UTF-8."""
    if column.kind != "U":
        return tensor
    strings = np.empty(tensor.shape, dtype=object)
    flat = strings.reshape(-1)
    for index, item in enumerate(tensor.reshape(-1)):
        try:
            flat[index] = item.decode("utf-8") if isinstance(item, bytes) else str(item)
        except UnicodeDecodeError as exc:
            raise BadRequest(f"{where} element {index} is not valid UTF-8 (byte {exc.start})") from None
    return strings
