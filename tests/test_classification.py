"""The v2 classification extension (`parameters.classification: k` on an output): pure logic, no server."""

from __future__ import annotations

import numpy as np
import pytest

from onnxpool.server.classification import apply, classified
from onnxpool.server.v2codec import RequestLimits, decode_infer_request, encode_infer_response
from onnxpool.tasks import jsonfast
from onnxpool.tasks.errors import BadRequest
from onnxpool.workers.model_info import ModelInfo, TensorSpec

MODEL = ModelInfo(
    inputs=(TensorSpec("x", "tensor(float)", (-1, 2)),), outputs=(TensorSpec("scores", "tensor(float)", (-1, 4)),)
)
LIMITS = RequestLimits(max_batch=8, max_elements=1000)


def test_top_classes_highest_first_as_triton_writes_them() -> None:
    scores = np.array([[0.1, 0.7, 0.05, 0.15], [0.4, 0.1, 0.3, 0.2]], np.float32)
    labelled = classified(scores, 2, ["a", "b", "c", "d"], "scores")
    assert labelled.shape == (2, 2) and labelled.dtype == object
    assert labelled.tolist() == [[b"0.700000:1:b", b"0.150000:3:d"], [b"0.400000:0:a", b"0.300000:2:c"]]
    assert classified(scores, 1, None, "scores").tolist() == [[b"0.700000:1"], [b"0.400000:0"]]
    assert classified(scores, 9, None, "scores").shape == (2, 4)  # k past the classes: all of them
    assert classified(scores[0], 1, ["a", "b"], "scores").tolist() == [b"0.700000:1:b"]


def test_only_the_outputs_asked_for_are_classified() -> None:
    outputs = {"scores": np.array([[1.0, 2.0]]), "other": np.array([3.0])}
    done = apply(outputs, {"scores": 1}, None)
    assert done["scores"].tolist() == [[b"2.000000:1"]] and done["other"] is outputs["other"]


def test_a_tensor_without_scores_cannot_be_classified() -> None:
    with pytest.raises(BadRequest, match="output 'names' holds no class scores"):
        classified(np.array([b"x"], dtype=object), 1, None, "names")


def _request(parameters: dict[str, object]) -> bytes:
    document = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}],
        "outputs": [{"name": "scores", "parameters": parameters}],
    }
    return jsonfast.dumps(document)


def test_the_parameter_is_read_and_checked() -> None:
    assert decode_infer_request(_request({"classification": 3}), MODEL, LIMITS).classification == {"scores": 3}
    for bad in (0, -1, True, 1.5, "3"):
        with pytest.raises(BadRequest, match="classification must be a positive integer"):
            decode_infer_request(_request({"classification": bad}), MODEL, LIMITS)


def test_bytes_outputs_are_length_prefixed_binary_or_json_strings() -> None:
    strings = np.array([[b"0.5:1:cat", b"0.25:0"]], dtype=object)
    binary = encode_infer_response("m", "1", None, {"scores": strings}, {"scores"})
    assert binary.header_length is not None
    header = jsonfast.loads(binary.body[: binary.header_length])
    assert header["outputs"][0]["datatype"] == "BYTES" and header["outputs"][0]["shape"] == [1, 2]
    assert binary.body[binary.header_length :] == b"\x09\x00\x00\x000.5:1:cat\x06\x00\x00\x000.25:0"
    as_json = jsonfast.loads(encode_infer_response("m", "1", None, {"scores": strings}).body)
    assert as_json["outputs"][0]["data"] == ["0.5:1:cat", "0.25:0"]
