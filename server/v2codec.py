"""Open Inference Protocol v2 infer requests and responses: JSON and binary tensors.

Decoding checks every input against the model's declared inputs BEFORE any
array is built from the client's declared shape, so a shape far larger than
the data never allocates. Binary tensors are numpy views over the request body
(no copy). See the protocol's binary tensor data extension: the JSON header is
the first `Inference-Header-Content-Length` bytes, tensors follow in order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from server import jsonfast
from server.datatypes import ALLOWED_DATATYPES, V2_TO_NUMPY, v2_datatype
from server.errors import BadRequest, PayloadTooLarge
from workers.model_info import ModelInfo, TensorSpec

BINARY_HEADER = "Inference-Header-Content-Length"


@dataclass(frozen=True)
class RequestLimits:
    """Bounds one infer request must respect."""

    max_batch: int
    max_elements: int


@dataclass
class InferRequest:
    """A decoded, validated infer request."""

    id: str | None
    inputs: dict[str, np.ndarray]
    output_names: list[str] | None
    binary_outputs: set[str] = field(default_factory=set)
    parameters: dict[str, Any] = field(default_factory=dict)


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise BadRequest(message)


def _parameters(obj: Mapping[str, Any], where: str) -> dict[str, Any]:
    params = obj.get("parameters", {})
    if not isinstance(params, dict):
        raise BadRequest(f"{where}.parameters must be an object")
    return params


def _check_shape(shape: Any, spec: TensorSpec, where: str, limits: RequestLimits) -> tuple[int, ...]:
    _expect(
        isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape),
        f"{where}.shape must be a list of non-negative integers, got {shape!r}",
    )
    dims = tuple(shape)
    expected = "[" + ", ".join("-1" if d < 0 else str(d) for d in spec.shape) + "]"
    _expect(
        len(dims) == len(spec.shape),
        f"{where} has shape {list(dims)} but the model expects rank {len(spec.shape)}: {expected}",
    )
    for axis, (got, want) in enumerate(zip(dims, spec.shape, strict=True)):
        _expect(
            want < 0 or got == want,
            f"{where} has shape {list(dims)} but the model expects {expected} (dimension {axis} must be {want})",
        )
    if dims and spec.shape and spec.shape[0] < 0 and dims[0] > limits.max_batch:
        raise PayloadTooLarge(f"{where} has batch size {dims[0]}; the limit is {limits.max_batch}")
    count = math.prod(dims)
    if count > limits.max_elements:
        raise PayloadTooLarge(f"{where} has {count} elements; the limit is {limits.max_elements}")
    return dims


def _from_json_data(data: Any, dtype: np.dtype, dims: tuple[int, ...], where: str) -> np.ndarray:
    _expect(isinstance(data, list), f"{where}.data must be a list (flat or nested)")
    try:
        array = np.array(data, dtype=dtype)
    except (ValueError, TypeError, OverflowError) as exc:
        raise BadRequest(f"{where}.data cannot be read as {v2_datatype(dtype)}: {exc}") from None
    expected = math.prod(dims)
    _expect(array.size == expected, f"{where} has {array.size} values but shape {list(dims)} needs {expected}")
    return array.reshape(dims)


def decode_infer_request(
    body: bytes,
    model: ModelInfo,
    limits: RequestLimits,
    header_length: int | None = None,
) -> InferRequest:
    """Parse and validate an infer request body against the model."""
    if header_length is not None:
        _expect(
            0 < header_length <= len(body),
            f"{BINARY_HEADER} is {header_length} but the body has {len(body)} bytes",
        )
    view = memoryview(body)
    header = jsonfast.loads(view[:header_length] if header_length is not None else view, "inference request")
    _expect(isinstance(header, dict), "inference request must be a JSON object")
    raw_inputs = header.get("inputs")
    _expect(isinstance(raw_inputs, list) and len(raw_inputs) > 0, "inference request needs a non-empty 'inputs' list")
    request_id = header.get("id")
    _expect(request_id is None or isinstance(request_id, str), "'id' must be a string")

    offset = header_length or 0
    inputs: dict[str, np.ndarray] = {}
    for position, raw in enumerate(raw_inputs):
        where = f"inputs[{position}]"
        _expect(isinstance(raw, dict), f"{where} must be an object")
        name = raw.get("name")
        _expect(isinstance(name, str), f"{where}.name must be a string")
        where = f"input '{name}'"
        spec = model.input(name)
        if spec is None:
            known = ", ".join(t.name for t in model.inputs)
            raise BadRequest(f"unknown input '{name}'; the model's inputs are: {known}")
        _expect(name not in inputs, f"{where} is given twice")
        datatype = raw.get("datatype")
        dtype = V2_TO_NUMPY.get(datatype) if isinstance(datatype, str) else None
        _expect(dtype is not None, f"{where} has datatype {datatype!r}; supported: {ALLOWED_DATATYPES}")
        assert dtype is not None
        _expect(
            dtype == spec.dtype,
            f"{where} has datatype {datatype} but the model expects {v2_datatype(spec.dtype)}",
        )
        dims = _check_shape(raw.get("shape"), spec, where, limits)
        params = _parameters(raw, where)
        size = params.get("binary_data_size")
        if size is not None:
            _expect(header_length is not None, f"{where} has binary_data_size but the request has no {BINARY_HEADER}")
            _expect(isinstance(size, int) and size >= 0, f"{where}.parameters.binary_data_size must be >= 0")
            expected = math.prod(dims) * dtype.itemsize
            _expect(
                size == expected, f"{where} has {size} bytes of binary data but shape {list(dims)} needs {expected}"
            )
            _expect(
                offset + size <= len(body),
                f"{where}: binary data is truncated ({len(body) - offset} bytes left, {size} declared)",
            )
            inputs[name] = np.frombuffer(view[offset : offset + size], dtype=dtype).reshape(dims)
            offset += size
        else:
            _expect("data" in raw, f"{where} needs 'data' or parameters.binary_data_size")
            inputs[name] = _from_json_data(raw["data"], dtype, dims, where)

    missing = [t.name for t in model.inputs if t.name not in inputs]
    _expect(not missing, f"missing input(s): {', '.join(missing)}")
    if header_length is not None:
        _expect(offset == len(body), f"{len(body) - offset} bytes after the last binary input were not expected")

    params = _parameters(header, "request")
    binary_default = params.get("binary_data_output", False)
    _expect(isinstance(binary_default, bool), "parameters.binary_data_output must be true or false")
    return _with_outputs(header, model, request_id, inputs, binary_default, params)


def _with_outputs(
    header: Mapping[str, Any],
    model: ModelInfo,
    request_id: str | None,
    inputs: dict[str, np.ndarray],
    binary_default: bool,
    params: dict[str, Any],
) -> InferRequest:
    raw_outputs = header.get("outputs")
    if raw_outputs is None:
        names = None
        binary = {o.name for o in model.outputs} if binary_default else set()
        return InferRequest(request_id, inputs, names, binary, params)
    _expect(isinstance(raw_outputs, list), "'outputs' must be a list")
    names, binary = [], set()
    for position, raw in enumerate(raw_outputs):
        _expect(isinstance(raw, dict) and isinstance(raw.get("name"), str), f"outputs[{position}] needs a 'name'")
        name = raw["name"]
        if model.output(name) is None:
            known = ", ".join(t.name for t in model.outputs)
            raise BadRequest(f"unknown output '{name}'; the model's outputs are: {known}")
        _expect(name not in names, f"output '{name}' is requested twice")
        wants_binary = _parameters(raw, f"outputs[{position}]").get("binary_data", binary_default)
        _expect(isinstance(wants_binary, bool), f"outputs[{position}].parameters.binary_data must be true or false")
        names.append(name)
        if wants_binary:
            binary.add(name)
    return InferRequest(request_id, inputs, names or None, binary, params)


@dataclass(frozen=True)
class EncodedResponse:
    """Body and the headers that describe it."""

    body: bytes
    content_type: str
    header_length: int | None = None


def encode_infer_response(
    model_name: str,
    model_version: str,
    request_id: str | None,
    outputs: Mapping[str, np.ndarray],
    binary_outputs: Sequence[str] | set[str] = (),
) -> EncodedResponse:
    """Encode outputs as v2 JSON, with the binary extension for outputs in binary_outputs."""
    described: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for name, array in outputs.items():
        array = np.ascontiguousarray(array)
        entry: dict[str, Any] = {"name": name, "datatype": v2_datatype(array.dtype), "shape": list(array.shape)}
        if name in binary_outputs:
            blob = array.tobytes()
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            # orjson writes numpy arrays natively; FP16 it does not, so widen it for JSON
            flat = array.reshape(-1)
            entry["data"] = flat.astype(np.float32) if flat.dtype == np.float16 else flat
        described.append(entry)
    document: dict[str, Any] = {"model_name": model_name, "model_version": model_version, "outputs": described}
    if request_id is not None:
        document["id"] = request_id
    header = jsonfast.dumps(document)
    if not blobs:
        return EncodedResponse(header, "application/json")
    return EncodedResponse(b"".join([header, *blobs]), "application/octet-stream", len(header))
