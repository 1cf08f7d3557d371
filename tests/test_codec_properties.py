"""Property tests for the v2 tensor codecs (hypothesis).

- any tensor of any v2 datatype round-trips exactly: binary bit for bit, JSON
  value for value (FP16 travels as FP32; NaN and ±inf travel as null and read
  back as NaN: the documented JSON limit);
- any bytes, and any JSON document, fed to the decoders end in an
  OnnxpoolError with a 4xx status, never another exception.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from onnxpool.server.datatypes import V2_TO_NUMPY
from onnxpool.server.v2codec import (
    RequestLimits,
    decode_infer_request,
    decode_infer_response,
    encode_infer_request,
    encode_infer_response,
)
from onnxpool.tasks.errors import OnnxpoolError
from onnxpool.tasks.jsonfast import check_depth
from onnxpool.workers.model_info import ONNX_TO_NUMPY, ModelInfo, TensorSpec

NUMPY_TO_ONNX = {dtype: onnx for onnx, dtype in ONNX_TO_NUMPY.items()}
LIMITS = RequestLimits(max_batch=1000, max_elements=10_000, max_json_depth=16)
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

dtypes = st.sampled_from(list(V2_TO_NUMPY.values()))
shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5)


@st.composite
def tensors(draw: st.DrawFn) -> np.ndarray:
    dtype = draw(dtypes)
    array: np.ndarray = draw(hnp.arrays(dtype, draw(shapes)))
    return array


def _model_for(array: np.ndarray) -> ModelInfo:
    spec = TensorSpec("t", NUMPY_TO_ONNX[array.dtype], tuple(-1 for _ in array.shape))
    return ModelInfo(inputs=(spec,), outputs=(TensorSpec("y", "tensor(float)", (-1,)),))


def _json_expected(array: np.ndarray) -> np.ndarray:
    """What JSON can carry: non-finite floats become NaN."""
    if array.dtype.kind != "f":
        return array
    return np.where(np.isfinite(array), array, np.nan).astype(array.dtype)


def _assert_same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)  # NaN == NaN here, and values exact


@FAST
@given(tensors(), st.booleans())
def test_request_round_trips(array: np.ndarray, binary: bool) -> None:
    encoded = encode_infer_request({"t": array}, {"t"} if binary else set())
    decoded = decode_infer_request(encoded.body, _model_for(array), LIMITS, encoded.header_length)
    got = decoded.inputs["t"]
    if binary:
        assert got.tobytes() == np.ascontiguousarray(array).tobytes() and got.shape == array.shape
    else:
        _assert_same(got, _json_expected(array))


@FAST
@given(tensors(), st.booleans())
def test_response_round_trips(array: np.ndarray, binary: bool) -> None:
    encoded = encode_infer_response("m", "1", "id-1", {"y": array}, {"y"} if binary else set())
    got = decode_infer_response(encoded.body, encoded.header_length)["y"]
    if binary:
        assert got.tobytes() == np.ascontiguousarray(array).tobytes() and got.shape == array.shape
    else:
        _assert_same(got, _json_expected(array))


@FAST
@given(hnp.arrays(np.float16, hnp.array_shapes(max_dims=2, max_side=50), elements=st.floats(width=16)))
def test_fp16_survives_json_widening(array: np.ndarray) -> None:
    body = encode_infer_response("m", "1", None, {"y": array}).body
    assert b"nan" not in body.lower() and b"inf" not in body.lower()  # valid JSON: null instead
    _assert_same(decode_infer_response(body)["y"], _json_expected(array))


MODEL = ModelInfo(
    inputs=(TensorSpec("a", "tensor(float)", (-1, 3)), TensorSpec("b", "tensor(int64)", (2,))),
    outputs=(TensorSpec("y", "tensor(float)", (-1,)),),
)


def _decode_any(body: bytes, header_length: int | None) -> None:
    for decode in (
        lambda: decode_infer_request(body, MODEL, LIMITS, header_length),
        lambda: decode_infer_response(body, header_length),
    ):
        try:
            decode()
        except OnnxpoolError as exc:
            assert 400 <= exc.status < 500, exc
            assert exc.message


@FAST
@given(st.binary(max_size=400), st.none() | st.integers(min_value=-5, max_value=500))
def test_any_bytes_give_a_client_error(body: bytes, header_length: int | None) -> None:
    _decode_any(body, header_length)


json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5)
    | st.sampled_from(["a", "b", "y", "FP32", "INT64", "BOOL", "FP16", "UINT8"])
)
KEYS = ["inputs", "outputs", "name", "datatype", "shape", "data", "parameters", "binary_data_size", "id"]
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=3), inner),
    max_leaves=40,
)


@st.composite
def infer_like(draw: st.DrawFn) -> tuple[bytes, int | None]:
    """Documents shaped like infer requests, with any field possibly wrong, plus binary tails."""
    tensor = st.fixed_dictionaries(
        {"name": st.sampled_from(["a", "b", "zz"]) | json_values},
        optional={
            "datatype": st.sampled_from(["FP32", "INT64", "FP16", "BOOL", "BYTES"]) | json_values,
            "shape": st.lists(st.integers(min_value=-2, max_value=4), max_size=3) | json_values,
            "data": st.lists(st.integers(-3, 3) | st.floats() | st.booleans() | st.none(), max_size=8) | json_values,
            "parameters": st.fixed_dictionaries({}, optional={"binary_data_size": st.integers(-1, 40) | json_values}),
        },
    )
    document = draw(
        st.fixed_dictionaries(
            {"inputs": st.lists(tensor, max_size=3) | json_values},
            optional={
                "outputs": st.lists(st.fixed_dictionaries({"name": json_values}), max_size=2) | json_values,
                "parameters": st.fixed_dictionaries({}, optional={"binary_data_output": json_values}),
                "id": json_values,
            },
        )
    )
    header = orjson.dumps(document)
    tail = draw(st.binary(max_size=64))
    length = draw(st.none() | st.just(len(header)))
    return header + (tail if length is not None else b""), length


@FAST
@given(infer_like())
def test_any_json_document_gives_a_client_error(case: tuple[bytes, int | None]) -> None:
    _decode_any(*case)


def test_deep_nesting_is_refused_cheaply() -> None:
    deep: Any = 1
    for _ in range(40):
        deep = [deep]
    body = orjson.dumps({"inputs": [{"name": "a", "datatype": "FP32", "shape": [1, 3], "parameters": {"x": deep}}]})
    with pytest.raises(OnnxpoolError, match="nests deeper than 16"):
        decode_infer_request(body, MODEL, LIMITS)
    check_depth({"data": list(range(150_000))}, 3)  # a flat data list is a leaf: no per-value walk


@pytest.mark.parametrize(
    ("data", "datatype", "message"),
    [
        (["1", "2", "3"], "FP32", "must hold numbers"),
        ([True, False, True], "FP32", "must hold numbers"),
        ([1.5, 2, 3], "INT64", "must hold integers"),
        ([2**63, 0, 0], "INT64", "integers in range|outside the range"),
        ([2**62, -1, 0], "UINT8", "outside the range"),
        ([1e300, 0, 0], "FP32", "outside the range"),
        (["false", "true", "false"], "BOOL", "true/false"),
    ],
)
def test_json_values_are_checked_not_coerced(data: list[Any], datatype: str, message: str) -> None:
    model = ModelInfo(
        inputs=(TensorSpec("a", NUMPY_TO_ONNX[V2_TO_NUMPY[datatype]], (3,)),),
        outputs=MODEL.outputs,
    )
    body = orjson.dumps({"inputs": [{"name": "a", "datatype": datatype, "shape": [3], "data": data}]})
    with pytest.raises(OnnxpoolError, match=message) as caught:
        decode_infer_request(body, model, LIMITS)
    assert caught.value.status == 400


def test_null_reads_as_nan_for_floats() -> None:
    body = orjson.dumps({"inputs": [{"name": "a", "datatype": "FP32", "shape": [1, 3], "data": [1, None, 2.5]}]})
    model = ModelInfo(inputs=(MODEL.inputs[0],), outputs=MODEL.outputs)
    got = decode_infer_request(body, model, LIMITS).inputs["a"]
    assert got.dtype == np.float32 and got[0, 0] == 1 and math.isnan(got[0, 1]) and got[0, 2] == 2.5
