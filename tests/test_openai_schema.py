"""onnxpool.tasks.text.openai_schema: OpenAI's /v1/embeddings request forms, errors, response, cache key."""

from __future__ import annotations

import base64
import json

import numpy as np
import orjson
import pytest

from onnxpool.tasks.text.openai_schema import (
    EmbeddingsResponse,
    EncodingFormat,
    OpenAIError,
    RequestError,
    canonical_key,
    encode_base64,
    error_body,
    parse_request,
    render_response,
)


def body(**fields: object) -> bytes:
    return json.dumps({"model": "m", **fields}).encode()


def refused(raw: bytes, max_batch: int = 2048) -> RequestError:
    with pytest.raises(RequestError) as caught:
        parse_request(raw, max_batch=max_batch)
    return caught.value


def test_the_four_input_forms() -> None:
    one = parse_request(body(input="hello"))
    assert (one.texts, one.token_ids, one.pretokenized, len(one)) == (["hello"], [], False, 1)
    many = parse_request(body(input=["a", "", "c"]))
    assert (many.texts, len(many)) == (["a", "", "c"], 3)
    ids = parse_request(body(input=[1, 2, 3]))
    assert (ids.token_ids, ids.texts, ids.pretokenized, len(ids)) == ([[1, 2, 3]], [], True, 1)
    lists = parse_request(body(input=[[1, 2], [], [3]]))
    assert (lists.token_ids, len(lists)) == ([[1, 2], [], [3]], 3)


def test_defaults_and_ignored_fields() -> None:
    request = parse_request(body(input="x", user="someone", unknown_key=1))
    assert request.encoding_format is EncodingFormat.FLOAT and request.dimensions is None
    assert parse_request(body(input="x", encoding_format="base64", dimensions=64)).dimensions == 64


@pytest.mark.parametrize(
    ("fields", "message", "param"),
    [
        ({"input": 5}, "'input' must be a string, an array of strings, an array of token ids", "input"),
        ({"input": None}, "got null", "input"),
        ({"input": []}, "'input' is an empty array", "input"),
        ({"input": ["a", 3]}, "input 1 must be a string, got number", "input"),
        ({"input": ["a", ["b"]]}, "input 1 must be a string, got array", "input"),
        ({"input": [1, "a"]}, "item 1 is not one (string)", "input"),
        ({"input": [1, -2]}, "item 1 is not one (number)", "input"),
        ({"input": [1.5]}, "item 0 is not one (number)", "input"),
        ({"input": [[1], 2]}, "input 1 must be an array of token ids like input 0, got number", "input"),
        ({"input": [[1], [2, "x"]]}, "input 1 has an invalid token id at position 1", "input"),
        ({"input": "x", "encoding_format": "int8"}, "'encoding_format' must be 'float' or 'base64', got 'int8'", None),
        ({"input": "x", "encoding_format": 1}, "got number", "encoding_format"),
        ({"input": "x", "dimensions": 0}, "'dimensions' is invalid", "dimensions"),
        ({"input": "x", "model": 3}, "'model' is invalid", "model"),
    ],
)
def test_refusals_name_the_problem(fields: dict[str, object], message: str, param: str | None) -> None:
    error = refused(body(**fields))
    assert message in error.message
    assert error.param == (param or "encoding_format")


def test_more_inputs_than_max_batch() -> None:
    error = refused(body(input=["a"] * 5), max_batch=4)
    assert error.message == "'input' has 5 inputs, more than the limit of 4 per request"
    assert len(parse_request(body(input=["a"] * 4), max_batch=4)) == 4
    assert len(parse_request(body(input=[1] * 50), max_batch=4)) == 1  # one pre-tokenized input


def test_invalid_utf8_json_and_shape() -> None:
    error = refused(b'{"model": "m", "input": "caf\xe9"}')
    assert error.message.startswith("the request body is not valid UTF-8 (byte 28")
    assert "not valid JSON" in refused(b'{"model": "m", "input": "\\ud800"}').message  # a lone surrogate
    assert "not valid JSON" in refused(b"{").message
    assert refused(b"[1]").message == "the request body must be a JSON object, got array"
    missing = refused(b'{"input": "x"}')
    assert (missing.message, missing.param) == ("'model' is required", "model")
    assert refused(b'{"model": "m"}').message == "'input' is required"


def test_error_body_is_openais_shape() -> None:
    error = refused(body(input=[]))
    document = error.body()
    assert document == {
        "error": {
            "message": "'input' is an empty array: give at least one input",
            "type": "invalid_request_error",
            "param": "input",
            "code": None,
        }
    }
    OpenAIError.model_validate(document)
    assert error_body("x", code="model_not_found")["error"]["code"] == "model_not_found"


def test_canonical_key_ignores_form_but_not_meaning() -> None:
    a = parse_request(b'{"model":"m","input":["hi"],"encoding_format":"float"}')
    b = parse_request(b'{ "input" : "hi" ,\n "user": "u", "model": "m" }')
    assert canonical_key(a) == canonical_key(b)
    different = [
        b'{"model":"m","input":"hi "}',
        b'{"model":"n","input":"hi"}',
        b'{"model":"m","input":"hi","encoding_format":"base64"}',
        b'{"model":"m","input":"hi","dimensions":8}',
        b'{"model":"m","input":["hi","hi"]}',
    ]
    keys = {canonical_key(parse_request(raw)) for raw in different}
    assert len(keys) == len(different) and canonical_key(a) not in keys
    assert canonical_key(parse_request(b'{"model":"m","input":[5]}')) == canonical_key(
        parse_request(b'{"model":"m","input":[[5]]}')
    )
    assert canonical_key(parse_request(b'{"model":"m","input":[[5]]}')) != canonical_key(
        parse_request(b'{"model":"m","input":["5"]}')
    )


def test_float_response() -> None:
    vectors = np.array([[0.1, -2.5, 3.0], [1e-8, 0.0, 1.0]], dtype=np.float32)
    raw = render_response(vectors, model="m", prompt_tokens=7)
    document = orjson.loads(raw)
    EmbeddingsResponse.model_validate(document)
    assert document["object"] == "list" and document["model"] == "m"
    assert document["usage"] == {"prompt_tokens": 7, "total_tokens": 7}
    assert [(d["object"], d["index"]) for d in document["data"]] == [("embedding", 0), ("embedding", 1)]
    assert np.array_equal(np.array([d["embedding"] for d in document["data"]], dtype=np.float32), vectors)
    assert b"0.1," in raw  # written from float32, not as 0.10000000149011612


def test_base64_response_decodes_like_the_openai_client() -> None:
    vectors = np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32)
    document = orjson.loads(render_response(vectors, model="m", prompt_tokens=1, encoding_format=EncodingFormat.BASE64))
    decoded = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype="float32") for d in document["data"]])
    assert np.array_equal(decoded, vectors)
    assert base64.b64decode(encode_base64(np.array([1.0], np.float32))) == b"\x00\x00\x80\x3f"  # little-endian
