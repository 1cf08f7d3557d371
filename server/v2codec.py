"""Open Inference Protocol v2 infer requests and responses: JSON and binary tensors.

Decoding checks every input against the model's declared inputs BEFORE any
array is built from the client's declared shape, so a shape far larger than
the data never allocates. Binary tensors are numpy views over the request body
(no copy). See the protocol's binary tensor data extension: the JSON header is
the first `Inference-Header-Content-Length` bytes, tensors follow in order.

JSON tensor data is checked for type and range, never coerced: BOOL takes
true/false, integer types take integers within range, FP types take numbers;
a string, a fraction for an integer type or an out-of-range value is a 400.
JSON has no NaN or infinity: outputs write them as null (as JavaScript does)
and inputs read null as NaN for FP types; send binary tensors when ±inf must
survive exactly. FP16 travels in JSON as FP32 numbers, which read back to the
identical FP16 values.

The client side (`encode_infer_request`, `decode_infer_response`) lives here
too: it is the ONE v2 client codec, used by the load generator's payloads
(`onnxpool.measure.payloads`), the benchmark scripts and the tests, so what they
send is what the server's own encoder would write. It stays in this module
because it shares the tensor encoder with the responses and the JSON data
reader with the requests.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from onnxpool.server.datatypes import ALLOWED_DATATYPES, V2_TO_NUMPY, v2_datatype
from onnxpool.tasks import jsonfast
from onnxpool.tasks.errors import BadRequest, PayloadTooLarge
from onnxpool.workers.model_info import ModelInfo, TensorSpec

BINARY_HEADER = "Inference-Header-Content-Length"


@dataclass(frozen=True)
class RequestLimits:
    """Bounds one infer request must respect."""

    max_batch: int
    max_elements: int
    max_json_depth: int = 64


@dataclass
class InferRequest:
    """A decoded, validated infer request."""

    id: str | None
    inputs: dict[str, np.ndarray]
    output_names: list[str] | None
    binary_outputs: set[str] = field(default_factory=set)
    parameters: dict[str, Any] = field(default_factory=dict)
    classification: dict[str, int] = field(default_factory=dict)
    """Outputs asked for as their top k classes (`parameters.classification`: server.classification)."""


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise BadRequest(message)


def _parameters(obj: Mapping[str, Any], where: str) -> dict[str, Any]:
    params = obj.get("parameters", {})
    if not isinstance(params, dict):
        raise BadRequest(f"{where}.parameters must be an object")
    return params


def parse_header_length(raw: str | None) -> int | None:
    """The value of an `Inference-Header-Content-Length` header; None when it is absent."""
    if raw is None:
        return None
    if not raw.strip().isdigit():
        raise BadRequest(f"{BINARY_HEADER} must be a non-negative integer, got {raw!r}")
    return int(raw)


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


# Which kinds of JSON-inferred arrays (numpy kind letters) each target kind accepts.
_ACCEPTED_KINDS = {"b": "b", "i": "iu", "u": "iu", "f": "iuf"}
_KIND_WORDS = {"b": "true/false", "i": "integers in range", "u": "non-negative integers in range", "f": "numbers"}


def cast_checked(values: np.ndarray, dtype: np.dtype) -> np.ndarray | None:
    """`values` as `dtype`, or None if a value does not fit (finite -> inf counts as not fitting).

    Float ranges are judged after rounding: the shortest decimal of FP32's max
    parses (as FP64) a hair above it, yet rounds back to exactly that max.
    """
    if values.size and dtype.kind in "iu":
        info = np.iinfo(dtype)
        if not (values.min() >= info.min and values.max() <= info.max):
            return None
    with np.errstate(over="ignore", invalid="ignore"):
        cast = values.astype(dtype, copy=False)
    if dtype.kind == "f" and values.dtype.kind in "iuf" and values.size:
        if bool((np.isfinite(values) & ~np.isfinite(cast)).any()):
            return None
    return cast


def _nullable_floats(data: list[Any], dtype: np.dtype, where: str) -> np.ndarray:
    """FP data containing null (NaN in JSON replies): every other item must be a number."""
    objects = np.array(data, dtype=object)
    valid = all(item is None or type(item) in (int, float) for item in objects.flat)
    _expect(valid, f"{where}.data must hold only numbers (null reads as NaN)")
    return np.array(objects, dtype=np.float64)


def _exact_integers(data: list[Any], dtype: np.dtype, where: str) -> np.ndarray:
    """Integer data numpy could not type losslessly (e.g. [0, 2**63] infers FP64): check item by item."""
    objects = np.array(data, dtype=object)
    words = f"{_KIND_WORDS[dtype.kind]} for {v2_datatype(dtype)}"
    _expect(all(type(item) is int for item in objects.flat), f"{where}.data must hold {words}")
    try:
        return np.array(objects.tolist(), dtype=dtype)
    except OverflowError:
        raise BadRequest(f"{where}.data has values outside the range of {v2_datatype(dtype)}") from None


def _from_json_data(data: Any, dtype: np.dtype, dims: tuple[int, ...], where: str) -> np.ndarray:
    _expect(isinstance(data, list), f"{where}.data must be a list (flat or nested)")
    try:
        values = np.array(data)  # JSON's own types first: bool, int64/uint64, float64, or object
        if values.dtype.kind == "O" and dtype.kind == "f":
            values = _nullable_floats(data, dtype, where)
        elif values.dtype.kind in "fO" and dtype.kind in "iu":
            values = _exact_integers(data, dtype, where)
    except (ValueError, TypeError, OverflowError) as exc:
        raise BadRequest(f"{where}.data cannot be read as {v2_datatype(dtype)}: {exc}") from None
    expected = math.prod(dims)
    _expect(values.size == expected, f"{where} has {values.size} values but shape {list(dims)} needs {expected}")
    if values.size and values.dtype.kind not in _ACCEPTED_KINDS[dtype.kind]:
        raise BadRequest(f"{where}.data must hold {_KIND_WORDS[dtype.kind]} for {v2_datatype(dtype)}")
    cast = cast_checked(values, dtype)
    _expect(cast is not None, f"{where}.data has values outside the range of {v2_datatype(dtype)}")
    assert cast is not None
    return cast.reshape(dims)


BYTES = "BYTES"
"""Strings (or raw bytes): served where a task's tensor signature has them (`Task.tensor_signature`)."""
_LENGTH = np.dtype("<u4")


def length_prefixed(items: Iterable[bytes]) -> bytes:
    """BYTES elements as binary tensor data: each a 4-byte little-endian length, then its bytes."""
    return b"".join(np.array([len(item)], _LENGTH).tobytes() + item for item in items)


def _bytes_from_json(data: Any, dims: tuple[int, ...], where: str) -> np.ndarray:
    """JSON BYTES data: strings (flat or nested), as an object array of UTF-8 bytes."""
    _expect(isinstance(data, list), f"{where}.data must be a list (flat or nested) of strings")
    flat: list[Any] = []
    stack: list[Any] = [data]
    while stack:  # iterative flatten in order (nesting is bounded by the JSON depth check)
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(reversed(item))
        else:
            _expect(isinstance(item, str), f"{where}.data must hold strings for BYTES")
            flat.append(item.encode("utf-8", "surrogatepass"))
    expected = math.prod(dims)
    _expect(len(flat) == expected, f"{where} has {len(flat)} values but shape {list(dims)} needs {expected}")
    values = np.empty(expected, dtype=object)
    values[:] = flat
    return values.reshape(dims)


def _bytes_from_binary(data: memoryview, dims: tuple[int, ...], where: str) -> np.ndarray:
    """Binary BYTES data: each element a 4-byte little-endian length, then that many bytes (tritonclient's)."""
    expected = math.prod(dims)
    values = np.empty(expected, dtype=object)
    offset = 0
    for i in range(expected):
        _expect(offset + 4 <= len(data), f"{where}: binary BYTES data ends before element {i} of {expected}")
        length = int(np.frombuffer(data[offset : offset + 4], dtype=_LENGTH)[0])
        offset += 4
        _expect(offset + length <= len(data), f"{where}: binary BYTES element {i} is cut short")
        values[i] = bytes(data[offset : offset + length])
        offset += length
    _expect(offset == len(data), f"{where}: {len(data) - offset} bytes after the last BYTES element")
    return values.reshape(dims)


def parse_infer_header(body: bytes, limits: RequestLimits, header_length: int | None = None) -> dict[str, Any]:
    """The JSON document of an infer request: the whole body, or its first `header_length` bytes."""
    if header_length is not None:
        _expect(
            0 < header_length <= len(body),
            f"{BINARY_HEADER} is {header_length} but the body has {len(body)} bytes",
        )
    view = memoryview(body)
    header = jsonfast.loads(view[:header_length] if header_length is not None else view, "inference request")
    _expect(isinstance(header, dict), "inference request must be a JSON object")
    jsonfast.check_depth(header, limits.max_json_depth, "inference request")
    return header  # type: ignore[no-any-return]


def decode_infer_request(
    body: bytes,
    model: ModelInfo,
    limits: RequestLimits,
    header_length: int | None = None,
    text_inputs: bool = False,
    header: dict[str, Any] | None = None,
) -> InferRequest:
    """Parse and validate an infer request body against the model.

    `text_inputs`: the model's string inputs take BYTES (a task's signature, whose task turns
    them into the model's own tensors); never for an ONNX model's own string inputs.
    `header`: the request's JSON document when `parse_infer_header` already read it.
    """
    if header is None:
        header = parse_infer_header(body, limits, header_length)
    view = memoryview(body)
    raw_inputs: Any = header.get("inputs")
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
        if spec.dtype is None and text_inputs:  # a task's text input (Task.tensor_signature)
            _expect(datatype == BYTES, f"{where} has datatype {datatype!r} but the model expects BYTES")
            dims = _check_shape(raw.get("shape"), spec, where, limits)
            size = _parameters(raw, where).get("binary_data_size")
            if size is not None:
                _expect(
                    header_length is not None, f"{where} has binary_data_size but the request has no {BINARY_HEADER}"
                )
                _expect(
                    isinstance(size, int) and not isinstance(size, bool) and 0 <= size <= len(body) - offset,
                    f"{where}.parameters.binary_data_size must be an integer within the body",
                )
                inputs[name] = _bytes_from_binary(view[offset : offset + size], dims, where)
                offset += size
            else:
                _expect("data" in raw, f"{where} needs 'data' or parameters.binary_data_size")
                inputs[name] = _bytes_from_json(raw["data"], dims, where)
            continue
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
            _expect(
                isinstance(size, int) and not isinstance(size, bool) and size >= 0,
                f"{where}.parameters.binary_data_size must be an integer >= 0",
            )
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
    names, binary, classification = [], set(), {}
    for position, raw in enumerate(raw_outputs):
        _expect(isinstance(raw, dict) and isinstance(raw.get("name"), str), f"outputs[{position}] needs a 'name'")
        name = raw["name"]
        if model.output(name) is None:
            known = ", ".join(t.name for t in model.outputs)
            raise BadRequest(f"unknown output '{name}'; the model's outputs are: {known}")
        _expect(name not in names, f"output '{name}' is requested twice")
        output_params = _parameters(raw, f"outputs[{position}]")
        wants_binary = output_params.get("binary_data", binary_default)
        _expect(isinstance(wants_binary, bool), f"outputs[{position}].parameters.binary_data must be true or false")
        top = output_params.get("classification")
        if top is not None:
            _expect(
                type(top) is int and top >= 1,
                f"outputs[{position}].parameters.classification must be a positive integer (the classes wanted)",
            )
            classification[name] = top
        names.append(name)
        if wants_binary:
            binary.add(name)
    return InferRequest(request_id, inputs, names or None, binary, params, classification)


@dataclass(frozen=True)
class EncodedBody:
    """An encoded infer request or response: the body and what its headers must say."""

    body: bytes
    content_type: str
    header_length: int | None = None

    @property
    def headers(self) -> dict[str, str]:
        """The HTTP headers that go with the body (the binary header only when there are blobs)."""
        headers = {"Content-Type": self.content_type}
        if self.header_length is not None:
            headers[BINARY_HEADER] = str(self.header_length)
        return headers


def _encode_tensors(
    arrays: Mapping[str, np.ndarray],
    binary: Sequence[str] | set[str],
    float_digits: type[np.floating[Any]] = np.float32,
) -> tuple[list[dict[str, Any]], list[bytes]]:
    """v2 tensor descriptions (JSON data inline, or binary_data_size) and the binary blobs in order.

    JSON floats are written with the digits of `float_digits`: FP16 is widened to it
    (orjson cannot write FP16), and float64 writes any float as Python's float repr would.
    """
    described: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for name, array in arrays.items():
        array = np.array(array, copy=None, order="C")  # not ascontiguousarray: it turns 0-d into shape [1]
        entry: dict[str, Any] = {"name": name, "datatype": v2_datatype(array.dtype), "shape": list(array.shape)}
        if array.dtype == object:  # BYTES (e.g. a classification): length-prefixed, or strings in JSON
            items = [item if isinstance(item, bytes) else str(item).encode() for item in array.reshape(-1)]
            if name in binary:
                blob = length_prefixed(items)
                entry["parameters"] = {"binary_data_size": len(blob)}
                blobs.append(blob)
            else:
                entry["data"] = [item.decode("utf-8", "replace") for item in items]
            described.append(entry)
            continue
        if name in binary:
            blob = array.tobytes()
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            # orjson writes numpy arrays natively (NaN/inf as null); FP16 it does not, so widen it
            flat = array.reshape(-1)
            widen = flat.dtype.kind == "f" and flat.dtype.itemsize < np.dtype(float_digits).itemsize
            entry["data"] = flat.astype(float_digits) if widen else flat
        described.append(entry)
    return described, blobs


def _body(document: dict[str, Any], blobs: list[bytes]) -> EncodedBody:
    header = jsonfast.dumps(document)
    if not blobs:
        return EncodedBody(header, "application/json")
    return EncodedBody(b"".join([header, *blobs]), "application/octet-stream", len(header))


def encode_infer_response(
    model_name: str,
    model_version: str,
    request_id: str | None,
    outputs: Mapping[str, np.ndarray],
    binary_outputs: Sequence[str] | set[str] = (),
) -> EncodedBody:
    """Encode outputs as v2 JSON, with the binary extension for outputs in binary_outputs."""
    described, blobs = _encode_tensors(outputs, binary_outputs)
    document: dict[str, Any] = {"model_name": model_name, "model_version": model_version, "outputs": described}
    if request_id is not None:
        document["id"] = request_id
    return _body(document, blobs)


def encode_infer_request(
    inputs: Mapping[str, np.ndarray],
    binary_inputs: Sequence[str] | set[str] = (),
    *,
    binary_output: bool = False,
    outputs: Sequence[str] | None = None,
    request_id: str | None = None,
    parameters: Mapping[str, Any] | None = None,
    python_floats: bool = False,
) -> EncodedBody:
    """Client side: a v2 infer request (binary extension for inputs in binary_inputs).

    Without `outputs` the server returns all outputs, binary ones if `binary_output`
    (the request parameter `binary_data_output`); with `outputs` only those, each
    asking for `binary_output` through its own `binary_data` parameter.
    `python_floats` writes JSON floats as a plain Python client does (`tensor.tolist()`
    through `json.dumps`: the float64 digits of each value, about twice the text of the
    shortest FP32 form); the server reads the same values either way, only the cost differs.
    """
    described, blobs = _encode_tensors(inputs, binary_inputs, np.float64 if python_floats else np.float32)
    document: dict[str, Any] = {"inputs": described}
    params = dict(parameters or {})
    if outputs is not None:
        document["outputs"] = [{"name": name, "parameters": {"binary_data": binary_output}} for name in outputs]
    elif binary_output:
        params["binary_data_output"] = True
    if params:
        document["parameters"] = params
    if request_id is not None:
        document["id"] = request_id
    return _body(document, blobs)


def decode_infer_response(body: bytes, header_length: int | None = None) -> dict[str, np.ndarray]:
    """Client side: the outputs of a v2 infer response (JSON or binary), by name."""
    if header_length is not None:
        _expect(0 < header_length <= len(body), f"{BINARY_HEADER} is {header_length} but the body has {len(body)}")
    view = memoryview(body)
    document = jsonfast.loads(view[:header_length] if header_length is not None else view, "inference response")
    _expect(isinstance(document, dict) and isinstance(document.get("outputs"), list), "response needs 'outputs'")
    offset = header_length or 0
    outputs: dict[str, np.ndarray] = {}
    for position, raw in enumerate(document["outputs"]):
        where = f"outputs[{position}]"
        _expect(isinstance(raw, dict) and isinstance(raw.get("name"), str), f"{where} needs a 'name'")
        datatype = raw.get("datatype")
        dtype = V2_TO_NUMPY.get(datatype) if isinstance(datatype, str) else None
        _expect(dtype is not None, f"{where} has datatype {datatype!r}; supported: {ALLOWED_DATATYPES}")
        assert dtype is not None
        shape = raw.get("shape")
        _expect(
            isinstance(shape, list) and all(type(d) is int and 0 <= d < 2**40 for d in shape) and len(shape) <= 32,
            f"{where}.shape must be a list of non-negative integers",
        )
        dims = tuple(shape)
        size = _parameters(raw, where).get("binary_data_size")
        if size is None:
            outputs[raw["name"]] = _from_json_data(raw.get("data"), dtype, dims, where)
            continue
        expected = math.prod(dims) * dtype.itemsize
        _expect(type(size) is int and size == expected, f"{where} has binary_data_size {size!r}; needs {expected}")
        _expect(header_length is not None and offset + size <= len(body), f"{where}: binary data is missing")
        outputs[raw["name"]] = np.frombuffer(view[offset : offset + size], dtype=dtype).reshape(dims)
        offset += size
    # As strict as the request decoder: bytes nobody declared mean the reply is not what it says.
    _expect(
        header_length is None or offset == len(body),
        f"{len(body) - offset} bytes after the last binary output were not expected",
    )
    return outputs
