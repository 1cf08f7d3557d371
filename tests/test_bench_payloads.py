"""The load generator's prepared requests are what the server's own decoders accept."""

from __future__ import annotations

import io

import numpy as np
from werkzeug.formparser import parse_form_data

from onnxpool.measure.paths import CAT_JPEG
from onnxpool.measure.payloads import InputSpec, concrete_shape, predict_request, v2_binary_request, v2_json_request
from onnxpool.server.v2codec import BINARY_HEADER, RequestLimits, decode_infer_request, parse_header_length
from onnxpool.workers.model_info import ModelInfo, TensorSpec

MODEL = ModelInfo(
    inputs=(TensorSpec("input", "tensor(float)", (-1, 3, 224, 224)),),
    outputs=(TensorSpec("logits", "tensor(float)", (-1, 1000)),),
)
SPEC = [InputSpec("input", "FP32", (-1, 3, 224, 224))]
LIMITS = RequestLimits(max_batch=32, max_elements=1 << 26)


def test_concrete_shape() -> None:
    assert concrete_shape((-1, 3, -1), 4) == (4, 3, 1)


def test_binary_request_decodes_with_the_server_codec() -> None:
    prepared = v2_binary_request("m", SPEC, batch=2)
    assert prepared.path == "/v2/models/m/infer" and prepared.items == 2
    decoded = decode_infer_request(prepared.body, MODEL, LIMITS, parse_header_length(prepared.headers[BINARY_HEADER]))
    assert decoded.inputs["input"].shape == (2, 3, 224, 224)
    assert decoded.inputs["input"].dtype == np.float32
    assert decoded.binary_outputs == {"logits"}


def test_json_request_decodes_with_the_server_codec() -> None:
    prepared = v2_json_request("m", SPEC, batch=1)
    decoded = decode_infer_request(prepared.body, MODEL, LIMITS)
    binary = v2_binary_request("m", SPEC, batch=1)
    same = decode_infer_request(binary.body, MODEL, LIMITS, parse_header_length(binary.headers[BINARY_HEADER]))
    np.testing.assert_array_equal(decoded.inputs["input"], same.inputs["input"])


def test_predict_multipart_parses_with_werkzeug() -> None:
    prepared = predict_request(CAT_JPEG, batch=3)
    environ = {
        "REQUEST_METHOD": "POST",
        "CONTENT_TYPE": prepared.headers["Content-Type"],
        "CONTENT_LENGTH": str(len(prepared.body)),
        "wsgi.input": io.BytesIO(prepared.body),
    }
    _, _, files = parse_form_data(environ)
    images = files.getlist("image")
    try:
        assert len(images) == 3
        assert all(f.read() == CAT_JPEG.read_bytes() for f in images)
        assert images[0].mimetype == "image/jpeg"
    finally:
        for f in images:
            f.close()


def test_one_payload_runs_bypass_the_response_cache() -> None:
    """Sent over and over, one payload would measure the cache, not the model (--repeat-fraction measures it)."""
    for prepared in (predict_request(CAT_JPEG, batch=1), v2_binary_request("m", SPEC, batch=1)):
        assert prepared.headers["Cache-Control"] == "no-store"
