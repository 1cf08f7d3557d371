"""OpenAI's `POST /v1/embeddings`: the request, the response, the error shape, a cache key.

Request (https://platform.openai.com/docs/api-reference/embeddings/create):
`input` is a string, a list of strings, a list of token ids, or a list of token-id lists;
`model` a string; `encoding_format` "float" (default) or "base64"; `dimensions` an optional
positive int; `user` accepted and ignored. Other keys are ignored, as OpenAI does.

Our rules where OpenAI's documentation leaves room or where onnxpool differs:
- the empty string is a valid input (sentence-transformers embeds it; see tokenizing.py);
  so is an empty token-id list inside a list of lists;
- token ids are the served model's vocabulary ids, without special tokens;
- at most `max_batch` inputs per request (OpenAI: 2048).

Response: `{"object": "list", "data": [{"object": "embedding", "index": i, "embedding": ...}],
"model": ..., "usage": {"prompt_tokens": n, "total_tokens": n}}`; with base64 each embedding
is the little-endian float32 bytes, base64-encoded (what the `openai` client decodes with
`np.frombuffer(base64.b64decode(s), dtype="float32")`).

Errors: `{"error": {"message", "type": "invalid_request_error", "param", "code"}}`.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from enum import StrEnum
from typing import Any, Literal

import numpy as np
import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

DEFAULT_MAX_BATCH = 2048
# A new canonical form gets a new prefix, so keys of the old form never match it.
CANONICAL_PREFIX = b"onnxpool.openai.embeddings/1\n"


class EncodingFormat(StrEnum):
    FLOAT = "float"
    BASE64 = "base64"


class RequestError(ValueError):
    """A request OpenAI's API would refuse with 400 `invalid_request_error`; renders its error body."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        """OpenAI's error object."""
        return error_body(self.message, param=self.param, code=self.code)


def error_body(
    message: str, *, param: str | None = None, code: str | None = None, type_: str = "invalid_request_error"
) -> dict[str, Any]:
    """`{"error": {"message", "type", "param", "code"}}`, OpenAI's shape for every error."""
    return OpenAIError(error=OpenAIErrorDetail(message=message, type=type_, param=param, code=code)).model_dump()


def _kind(value: object) -> str:
    """A JSON type name for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _is_token(value: object) -> bool:
    return type(value) is int and value >= 0


def _invalid(message: str) -> PydanticCustomError:
    return PydanticCustomError("invalid_input", message)


def _check_input(value: object, max_batch: int) -> str | list[str] | list[int] | list[list[int]]:
    """Accept exactly OpenAI's four input forms; a message naming the first problem otherwise."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise _invalid(
            "'input' must be a string, an array of strings, an array of token ids "
            f"or an array of token-id arrays, got {_kind(value)}"
        )
    if not value:
        raise _invalid("'input' is an empty array: give at least one input")
    first = value[0]
    if isinstance(first, int | float) and not isinstance(first, bool):
        # one pre-tokenized input: a flat array of token ids
        for position, token in enumerate(value):
            if not _is_token(token):
                raise _invalid(f"'input' is an array of token ids, but item {position} is not one ({_kind(token)})")
        return list(value)
    if len(value) > max_batch:
        raise _invalid(f"'input' has {len(value)} inputs, more than the limit of {max_batch} per request")
    if isinstance(first, list):
        for index, item in enumerate(value):
            if not isinstance(item, list):
                raise _invalid(f"input {index} must be an array of token ids like input 0, got {_kind(item)}")
            for position, token in enumerate(item):
                if not _is_token(token):
                    raise _invalid(
                        f"input {index} has an invalid token id at position {position} "
                        f"(token ids are integers >= 0, got {_kind(token)})"
                    )
        return [list(item) for item in value]
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise _invalid(f"input {index} must be a string, got {_kind(item)}")
    return list(value)


class EmbeddingsRequest(BaseModel):
    """A validated request; `parse_request` builds it from the raw body."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    input: str | list[str] | list[int] | list[list[int]]
    model: str
    encoding_format: EncodingFormat = EncodingFormat.FLOAT
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _input(cls, value: object, info: ValidationInfo) -> object:
        context = info.context if isinstance(info.context, dict) else {}
        return _check_input(value, int(context.get("max_batch", DEFAULT_MAX_BATCH)))

    @field_validator("encoding_format", mode="before")
    @classmethod
    def _format(cls, value: object) -> object:
        if value not in {f.value for f in EncodingFormat}:
            shown = repr(value) if isinstance(value, str) else _kind(value)
            raise PydanticCustomError(
                "invalid_encoding_format", f"'encoding_format' must be 'float' or 'base64', got {shown}"
            )
        return value

    @property
    def pretokenized(self) -> bool:
        """The inputs are token ids (`token_ids`), not strings (`texts`)."""
        return isinstance(self.input, list) and bool(self.input) and not isinstance(self.input[0], str)

    @property
    def texts(self) -> list[str]:
        """The string inputs, in order (empty for token-id requests)."""
        if isinstance(self.input, str):
            return [self.input]
        return [item for item in self.input if isinstance(item, str)]

    @property
    def token_ids(self) -> list[list[int]]:
        """The token-id inputs, in order (empty for string requests)."""
        if not self.pretokenized or not isinstance(self.input, list):
            return []
        if isinstance(self.input[0], int):
            return [[token for token in self.input if isinstance(token, int)]]
        return [item for item in self.input if isinstance(item, list)]

    def __len__(self) -> int:
        return len(self.token_ids) if self.pretokenized else len(self.texts)


def parse_request(body: bytes, *, max_batch: int = DEFAULT_MAX_BATCH) -> EmbeddingsRequest:
    """The raw HTTP body -> a validated request, or RequestError naming the problem."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError(f"the request body is not valid UTF-8 (byte {exc.start}: {exc.reason})") from None
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise RequestError(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise RequestError(f"the request body must be a JSON object, got {_kind(document)}")
    try:
        return EmbeddingsRequest.model_validate(document, context={"max_batch": max_batch})
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        param = str(error["loc"][0]) if error["loc"] else None
        if error["type"] == "missing":
            raise RequestError(f"'{param}' is required", param=param) from None
        if error["type"] in {"invalid_input", "invalid_encoding_format"}:
            raise RequestError(error["msg"], param=param) from None
        raise RequestError(f"'{param}' is invalid: {error['msg']}", param=param) from None


def canonical_key(request: EmbeddingsRequest) -> bytes:
    """The request's meaning as bytes, for a response-cache key: equal for requests that must get
    the same response (key order, whitespace, `user`, unknown keys, "x" vs ["x"] do not matter)."""
    inputs: dict[str, Any] = {"token_ids": request.token_ids} if request.pretokenized else {"texts": request.texts}
    canonical = {
        "model": request.model,
        "encoding_format": request.encoding_format.value,
        "dimensions": request.dimensions,
        "input": inputs,
    }
    return CANONICAL_PREFIX + orjson.dumps(canonical, option=orjson.OPT_SORT_KEYS)


class EmbeddingItem(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(BaseModel):
    """The response's shape (for documentation and checks; `render_response` writes the bytes)."""

    object: Literal["list"] = "list"
    data: list[EmbeddingItem]
    model: str
    usage: Usage


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None


class OpenAIError(BaseModel):
    error: OpenAIErrorDetail


def encode_base64(vector: np.ndarray) -> str:
    """Little-endian float32 bytes, base64: OpenAI's `encoding_format: "base64"`."""
    return base64.b64encode(np.ascontiguousarray(vector, dtype="<f4").tobytes()).decode("ascii")


def response_document(
    vectors: np.ndarray, *, model: str, prompt_tokens: int, encoding_format: EncodingFormat = EncodingFormat.FLOAT
) -> dict[str, Any]:
    """The response as a document (numpy rows: orjson writes float32 in its shortest round-trip form)."""
    rows: Sequence[object]
    if encoding_format is EncodingFormat.BASE64:
        rows = [encode_base64(row) for row in vectors]
    else:
        rows = list(np.asarray(vectors, dtype=np.float32))
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": index, "embedding": row} for index, row in enumerate(rows)],
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }


def render_response(
    vectors: np.ndarray, *, model: str, prompt_tokens: int, encoding_format: EncodingFormat = EncodingFormat.FLOAT
) -> bytes:
    """The response body as JSON bytes."""
    document = response_document(vectors, model=model, prompt_tokens=prompt_tokens, encoding_format=encoding_format)
    return orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY)
