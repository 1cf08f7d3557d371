"""gRPC's ModelInfer messages <-> the v2 REST infer body with binary tensors: one data plane, two wires.

A gRPC ModelInferRequest carries what a v2 binary-tensor request carries: a JSON-shaped header
(id, parameters, inputs' names, datatypes and shapes, the outputs wanted) and the tensors' bytes
(`raw_input_contents`, in the inputs' order). So a call becomes the REST body the data plane
already reads (header JSON, then the bytes; `Inference-Header-Content-Length` says where the
header ends), and the data plane's reply (every output asked for as binary) becomes a
ModelInferResponse with `raw_output_contents`, the only form tritonclient's `as_numpy` reads.
Decoding, checking, caching and errors stay the data plane's: nothing is parsed twice.

Typed `contents` (KServe's clients may send them instead of raw bytes) are turned into the
same bytes here: the one place a gRPC request's tensors are touched, and only when typed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxpool.server.datatypes import V2_TO_NUMPY
from onnxpool.server.grpc_proto import grpc_service_pb2 as pb
from onnxpool.server.v2codec import BYTES, cast_checked, length_prefixed
from onnxpool.tasks import jsonfast
from onnxpool.tasks.errors import BadRequest

# Which typed `contents` field holds each datatype (the Open Inference Protocol's table).
CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    BYTES: "bytes_contents",
}


@dataclass(frozen=True, slots=True)
class RestBody:
    """A ModelInfer request as the v2 REST body: the JSON header's length, and the whole body."""

    header_length: int
    body: bytes


def parameter_value(parameter: Any) -> Any:
    """An InferParameter's value (its one set field), as the JSON value REST would carry."""
    which = parameter.WhichOneof("parameter_choice")
    return None if which is None else getattr(parameter, which)


def parameters_of(parameters: Mapping[str, Any]) -> dict[str, Any]:
    return {name: parameter_value(value) for name, value in parameters.items()}


def set_parameters(target: Any, values: Mapping[str, Any]) -> None:
    """Fill a message's `parameters` map from JSON values (bool, int, float, str)."""
    for name, value in values.items():
        parameter = target[name]
        if isinstance(value, bool):
            parameter.bool_param = value
        elif isinstance(value, int):
            parameter.int64_param = value
        elif isinstance(value, float):
            parameter.double_param = value
        else:
            parameter.string_param = str(value)


def _typed_bytes(tensor: Any, position: int) -> bytes:
    """The bytes of an input sent as typed `contents` (what raw_input_contents would have held)."""
    where = f"inputs[{position}] ('{tensor.name}')"
    field = CONTENTS_FIELD.get(tensor.datatype)
    if field is None:
        raise BadRequest(f"{where}: datatype {tensor.datatype} has no typed contents; send it in raw_input_contents")
    values = getattr(tensor.contents, field)
    if tensor.datatype == BYTES:
        return length_prefixed(values)
    dtype = V2_TO_NUMPY[tensor.datatype]
    read = np.array(values, dtype=np.float64 if dtype.kind == "f" else dtype if dtype.kind == "b" else np.int64)
    if dtype == np.uint64 and field == "uint64_contents":
        read = np.array(values, dtype=np.uint64)  # above INT64's range: read as it was written
    cast = cast_checked(read, dtype)
    if cast is None:
        raise BadRequest(f"{where}: a value of contents.{field} does not fit {tensor.datatype}")
    return cast.tobytes()


def rest_body(request: Any) -> RestBody:
    """The REST body of a ModelInferRequest: every input binary, every output asked for as binary."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise BadRequest(f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} inputs")
    blobs: list[bytes] = []
    inputs: list[dict[str, Any]] = []
    for position, tensor in enumerate(request.inputs):
        if raw:
            if tensor.HasField("contents") and tensor.contents.ByteSize():
                raise BadRequest(f"inputs[{position}] ('{tensor.name}') has contents and raw_input_contents: send one")
            blob = raw[position]
        else:
            blob = _typed_bytes(tensor, position)
        parameters = parameters_of(tensor.parameters)
        parameters["binary_data_size"] = len(blob)
        inputs.append(
            {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape), "parameters": parameters}
        )
        blobs.append(blob)
    document: dict[str, Any] = {"inputs": inputs}
    parameters = parameters_of(request.parameters)
    if request.outputs:
        document["outputs"] = [
            {"name": output.name, "parameters": {**parameters_of(output.parameters), "binary_data": True}}
            for output in request.outputs
        ]
    else:
        parameters["binary_data_output"] = True
    if parameters:
        document["parameters"] = parameters
    if request.id:
        document["id"] = request.id
    header = jsonfast.dumps(document)
    return RestBody(len(header), b"".join([header, *blobs]))


def _json_output_bytes(output: Mapping[str, Any]) -> bytes:
    """An output the data plane wrote as JSON data (it asks for binary; kept for a task's own reply)."""
    datatype = output.get("datatype", "")
    data = output.get("data", [])
    if datatype == BYTES:
        return length_prefixed(str(item).encode() for item in np.array(data, dtype=object).reshape(-1))
    return np.array(data, dtype=V2_TO_NUMPY[datatype]).reshape(-1).tobytes()


def infer_response(body: bytes, header_length: int | None) -> Any:
    """The ModelInferResponse of the data plane's v2 reply (its JSON header, then the binary outputs)."""
    view = memoryview(body)
    document = jsonfast.loads(view[:header_length] if header_length is not None else view, "inference reply")
    response = pb.ModelInferResponse(
        model_name=document.get("model_name", ""), model_version=document.get("model_version", "")
    )
    if isinstance(document.get("id"), str):
        response.id = document["id"]
    set_parameters(response.parameters, document.get("parameters") or {})
    offset = header_length or 0
    for output in document.get("outputs", []):
        parameters = dict(output.get("parameters") or {})
        size = parameters.pop("binary_data_size", None)
        tensor = response.outputs.add(name=output["name"], datatype=output["datatype"], shape=output["shape"])
        set_parameters(tensor.parameters, parameters)
        if size is None:
            response.raw_output_contents.append(_json_output_bytes(output))
        else:
            response.raw_output_contents.append(view[offset : offset + size].tobytes())
            offset += size
    return response


def tensor_metadata(tensors: Sequence[Mapping[str, Any]]) -> list[Any]:
    """v2 REST tensor metadata (name, datatype, shape) as the gRPC messages."""
    return [
        pb.ModelMetadataResponse.TensorMetadata(name=t["name"], datatype=t["datatype"], shape=t["shape"])
        for t in tensors
    ]
