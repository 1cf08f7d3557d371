"""The v2 codec on its own: JSON and binary tensors, every datatype, and every way to get it wrong."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from onnxpool.server.datatypes import NUMPY_TO_V2, V2_TO_NUMPY
from onnxpool.server.v2codec import (
    BINARY_HEADER,
    RequestLimits,
    decode_infer_request,
    decode_infer_response,
    encode_infer_request,
    encode_infer_response,
    parse_header_length,
)
from onnxpool.tasks.errors import BadRequest, OnnxpoolError, PayloadTooLarge
from onnxpool.workers.model_info import ModelInfo, TensorSpec

LIMITS = RequestLimits(max_batch=8, max_elements=10_000)
ONNX_TYPES = {
    "BOOL": "tensor(bool)",
    "UINT8": "tensor(uint8)",
    "UINT16": "tensor(uint16)",
    "UINT32": "tensor(uint32)",
    "UINT64": "tensor(uint64)",
    "INT8": "tensor(int8)",
    "INT16": "tensor(int16)",
    "INT32": "tensor(int32)",
    "INT64": "tensor(int64)",
    "FP16": "tensor(float16)",
    "FP32": "tensor(float)",
    "FP64": "tensor(double)",
}


def model(datatype: str = "FP32", shape: tuple[int, ...] = (-1, 3)) -> ModelInfo:
    return ModelInfo(
        inputs=(TensorSpec("x", ONNX_TYPES[datatype], shape),),
        outputs=(TensorSpec("y", "tensor(float)", (-1, 2)), TensorSpec("z", "tensor(float)", (-1,))),
    )


def body(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode()


def binary_body(doc: dict[str, Any], *arrays: np.ndarray) -> tuple[bytes, int]:
    header = json.dumps(doc).encode()
    return header + b"".join(a.tobytes() for a in arrays), len(header)


def sample(datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    dtype = V2_TO_NUMPY[datatype]
    values = np.arange(int(np.prod(shape))) % 7
    return (values % 2 == 0).reshape(shape) if dtype == np.bool_ else values.astype(dtype).reshape(shape)


@pytest.mark.parametrize("datatype", list(V2_TO_NUMPY))
def test_json_flat_and_nested_give_the_same_tensor(datatype: str) -> None:
    expected = sample(datatype, (2, 3))
    flat = {"inputs": [{"name": "x", "datatype": datatype, "shape": [2, 3], "data": expected.ravel().tolist()}]}
    nested = {"inputs": [{"name": "x", "datatype": datatype, "shape": [2, 3], "data": expected.tolist()}]}
    for doc in (flat, nested):
        decoded = decode_infer_request(body(doc), model(datatype), LIMITS)
        assert decoded.inputs["x"].dtype == expected.dtype
        np.testing.assert_array_equal(decoded.inputs["x"], expected)


@pytest.mark.parametrize("datatype", list(V2_TO_NUMPY))
def test_binary_input_is_a_view_with_the_exact_bytes(datatype: str) -> None:
    expected = sample(datatype, (2, 3))
    doc = {
        "inputs": [
            {"name": "x", "datatype": datatype, "shape": [2, 3], "parameters": {"binary_data_size": expected.nbytes}}
        ]
    }
    raw, n = binary_body(doc, expected)
    decoded = decode_infer_request(raw, model(datatype), LIMITS, header_length=n)
    np.testing.assert_array_equal(decoded.inputs["x"], expected)
    assert decoded.inputs["x"].base is not None  # a view over the body, not a copy


def test_id_outputs_and_binary_flags() -> None:
    doc: dict[str, Any] = {
        "id": "abc",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}],
        "outputs": [{"name": "z", "parameters": {"binary_data": True}}, {"name": "y"}],
    }
    decoded = decode_infer_request(body(doc), model(), LIMITS)
    assert decoded.id == "abc"
    assert decoded.output_names == ["z", "y"]
    assert decoded.binary_outputs == {"z"}
    doc["parameters"] = {"binary_data_output": True}
    del doc["outputs"]
    assert decode_infer_request(body(doc), model(), LIMITS).binary_outputs == {"y", "z"}


def test_encode_json_and_binary_responses() -> None:
    y = np.array([[1.5, -2.0]], dtype=np.float32)
    z = np.array([0.25], dtype=np.float16)
    plain = encode_infer_response("m", "1", "rid", {"y": y, "z": z})
    doc = json.loads(plain.body)
    assert plain.header_length is None and plain.content_type == "application/json"
    assert doc["id"] == "rid" and doc["model_name"] == "m"
    assert doc["outputs"][0] == {"name": "y", "datatype": "FP32", "shape": [1, 2], "data": [1.5, -2.0]}
    assert doc["outputs"][1]["datatype"] == "FP16" and doc["outputs"][1]["data"] == [0.25]

    mixed = encode_infer_response("m", "1", None, {"y": y, "z": z}, {"z"})
    assert mixed.header_length is not None
    header = json.loads(mixed.body[: mixed.header_length])
    assert "id" not in header
    assert header["outputs"][1]["parameters"] == {"binary_data_size": 2}
    tail = np.frombuffer(mixed.body[mixed.header_length :], dtype=np.float16)
    np.testing.assert_array_equal(tail, z)


def test_every_numpy_dtype_maps_back() -> None:
    for name, dtype in V2_TO_NUMPY.items():
        assert NUMPY_TO_V2[dtype] == name


def base_input(**overrides: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": "x", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}
    entry.update(overrides)
    return {"inputs": [entry]}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([], "must be a JSON object"),
        ({}, "non-empty 'inputs' list"),
        ({"inputs": [1]}, "inputs[0] must be an object"),
        (base_input(name="nope"), "unknown input 'nope'; the model's inputs are: x"),
        (base_input(datatype="FP64"), "has datatype FP64 but the model expects FP32"),
        (base_input(datatype="BYTES"), "supported: BOOL, UINT8"),
        (base_input(shape=[1, 4], data=[1, 2, 3, 4]), "dimension 1 must be 3"),
        (base_input(shape=[3]), "expects rank 2"),
        (base_input(shape=[1, -3]), "non-negative integers"),
        (base_input(shape="1,3"), "non-negative integers"),
        (base_input(data=[1, 2]), "has 2 values but shape [1, 3] needs 3"),
        (base_input(data=["a", "b", "c"]), "must hold numbers for FP32"),
        (base_input(data=[[1, 2], [3]]), "cannot be read as FP32"),
        (base_input(data="123"), "must be a list"),
        ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3]}]}, "needs 'data'"),
        ({"inputs": [base_input()["inputs"][0]] * 2}, "is given twice"),
        ({**base_input(), "outputs": [{"name": "w"}]}, "unknown output 'w'"),
        ({**base_input(), "id": 5}, "'id' must be a string"),
        (base_input(parameters={"binary_data_size": 12}), "has no Inference-Header-Content-Length"),
    ],
)
def test_malformed_json_requests(doc: Any, message: str) -> None:
    with pytest.raises(BadRequest) as info:
        decode_infer_request(body(doc), model(), LIMITS)
    assert message in info.value.message


def test_declared_shape_far_larger_than_data_is_refused_before_allocating() -> None:
    doc = base_input(shape=[8, 3], data=[1, 2, 3])
    with pytest.raises(BadRequest, match="has 3 values but shape"):
        decode_infer_request(body(doc), model(), LIMITS)
    huge = ModelInfo(inputs=(TensorSpec("x", "tensor(float)", (-1, -1)),), outputs=model().outputs)
    with pytest.raises(PayloadTooLarge, match="elements; the limit is 10000"):
        decode_infer_request(body(base_input(shape=[1, 10**12], data=[1])), huge, LIMITS)


def test_batch_limit() -> None:
    with pytest.raises(PayloadTooLarge, match="batch size 9; the limit is 8"):
        decode_infer_request(body(base_input(shape=[9, 3], data=[0] * 27)), model(), LIMITS)


@pytest.mark.parametrize(
    ("size", "extra", "header_delta", "message"),
    [
        (12, b"", 0, None),
        (8, b"", 0, "has 8 bytes of binary data but shape [1, 3] needs 12"),
        (12, b"", None, "binary data is truncated"),
        (12, b"xx", 0, "2 bytes after the last binary input"),
        (12, b"", 10_000, "Inference-Header-Content-Length is"),
    ],
)
def test_binary_framing_errors(size: int, extra: bytes, header_delta: int | None, message: str | None) -> None:
    array = np.ones((1, 3), dtype=np.float32)
    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3], "parameters": {"binary_data_size": size}}]}
    raw, n = binary_body(doc, array)
    raw += extra
    if header_delta is None:
        raw = raw[:-4]
    else:
        n += header_delta
    if message is None:
        decode_infer_request(raw, model(), LIMITS, header_length=n)
        return
    with pytest.raises(OnnxpoolError) as info:
        decode_infer_request(raw, model(), LIMITS, header_length=n)
    assert message in info.value.message
    assert 400 <= info.value.status < 500


# --- the client side: requests as the tests and the load generator send them ---------------------


def test_client_request_headers_and_output_choices() -> None:
    x = np.zeros((1, 3), np.float32)
    as_json = encode_infer_request({"x": x}, request_id="r1")
    assert as_json.headers == {"Content-Type": "application/json"}
    assert json.loads(as_json.body)["id"] == "r1"
    everything = encode_infer_request({"x": x}, {"x"}, binary_output=True)
    assert everything.headers == {
        "Content-Type": "application/octet-stream",
        BINARY_HEADER: str(everything.header_length),
    }
    decoded = decode_infer_request(everything.body, model(), LIMITS, everything.header_length)
    assert decoded.output_names is None and decoded.binary_outputs == {"y", "z"}
    for binary in (True, False):
        chosen = encode_infer_request({"x": x}, outputs=["z"], binary_output=binary)
        decoded = decode_infer_request(chosen.body, model(), LIMITS)
        assert decoded.output_names == ["z"] and decoded.binary_outputs == ({"z"} if binary else set())
        assert "parameters" not in json.loads(chosen.body)  # per output, not binary_data_output


def test_python_floats_carry_the_same_values_in_longer_text() -> None:
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    short = encode_infer_request({"x": x})
    plain = encode_infer_request({"x": x}, python_floats=True)
    assert json.loads(plain.body)["inputs"][0]["data"] == x.ravel().tolist()  # what json.dumps(x.tolist()) says
    assert len(plain.body) > len(short.body)
    for encoded in (short, plain):
        np.testing.assert_array_equal(decode_infer_request(encoded.body, model(), LIMITS).inputs["x"], x)


def test_client_reply_decoding_refuses_undeclared_bytes() -> None:
    reply = encode_infer_response("m", "1", None, {"y": np.ones((1, 2), np.float32)}, {"y"})
    np.testing.assert_array_equal(decode_infer_response(reply.body, reply.header_length)["y"], [[1, 1]])
    with pytest.raises(BadRequest, match="3 bytes after the last binary output"):
        decode_infer_response(reply.body + b"abc", reply.header_length)


@pytest.mark.parametrize(("raw", "expected"), [(None, None), ("0", 0), (" 17 ", 17)])
def test_parse_header_length(raw: str | None, expected: int | None) -> None:
    assert parse_header_length(raw) == expected


@pytest.mark.parametrize("raw", ["", "x", "-1", "1.5"])
def test_parse_header_length_refuses(raw: str) -> None:
    with pytest.raises(BadRequest, match="must be a non-negative integer"):
        parse_header_length(raw)
