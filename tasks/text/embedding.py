"""Text embeddings, OpenAI-compatible: `POST /v1/embeddings`, and v2 infer with a BYTES `text` input.

The tokenizer runs on the server (tasks/text/tokenizing.py: the model's own length limit, padding
to the request's longest input), the model in length-sorted sub-batches, the pooling and L2
normalisation as the model's sentence-transformers files say (tasks/text/pooling.py). Errors are in
OpenAI's shape, so the official `openai` client raises its own exceptions (BadRequestError,
AuthenticationError...). The response cache keys on the normalised request (key order, `user`,
"x" vs ["x"] do not matter).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxpool.tasks.api import BytesLike, JsonDocument, RequestParts, Runner, ServedModel
from onnxpool.tasks.errors import BadRequest, OnnxpoolError
from onnxpool.tasks.text.base import TextTask
from onnxpool.tasks.text.openai_schema import (
    EmbeddingsRequest,
    EncodingFormat,
    RequestError,
    canonical_key,
    error_body,
    parse_request,
    response_document,
)
from onnxpool.tasks.text.options import TextEmbeddingOptions
from onnxpool.tasks.text.pooling import DimensionsError, PoolingMode, PoolingSpec, embed
from onnxpool.workers.model_info import ModelInfo, TensorSpec

EMBEDDING = "embedding"
TEXT_INPUT = "text"
# OpenAI's error `type` by status: what its clients branch on.
ERROR_TYPES = {401: "invalid_request_error", 404: "invalid_request_error", 429: "rate_limit_error", 503: "server_error"}


class OpenAIRequestError(BadRequest):
    """A 400 that also names OpenAI's `param` and `code`."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


@dataclass(frozen=True)
class Embeddings:
    """One request's result: its vectors in input order and the tokens it took (OpenAI's `usage`)."""

    vectors: np.ndarray
    token_count: int


class TextEmbedding(TextTask[EmbeddingsRequest, Embeddings, TextEmbeddingOptions]):
    """Sentence embeddings of a transformer encoder (sentence-transformers layout)."""

    name = "text-embedding"
    settings_model = TextEmbeddingOptions
    routes = ("/v1/embeddings",)
    content_types = ("application/json",)

    def __init__(self, settings: TextEmbeddingOptions, served: ServedModel) -> None:
        super().__init__(settings, served)
        self.spec = PoolingSpec.from_folder(self.folder).with_overrides(
            mode=None if settings.pooling == "auto" else PoolingMode(settings.pooling),
            normalize=None if settings.normalize == "auto" else bool(settings.normalize),
            allow_dimensions=settings.dimensions,
        )
        self.width = -1

    def fingerprint(self) -> str:
        return f"{super().fingerprint()}, {self.spec}"

    def bind(self, model: ModelInfo) -> None:
        super().bind(model)
        self.width = self.output_of(model, self.settings.output, "token-embedding [batch, tokens, width]").shape[2]

    def read(self, request: RequestParts) -> EmbeddingsRequest:
        try:
            asked = parse_request(request.body(), max_batch=self.settings.max_batch)
        except RequestError as exc:
            raise OpenAIRequestError(exc.message, exc.param, exc.code) from None
        served = self.served.name
        if not self.served.known_as(asked.model):
            raise OpenAIRequestError(
                f"the model '{asked.model}' does not exist here; this server serves '{served}'",
                param="model",
                code="model_not_found",
            )
        if asked.dimensions is not None and not self.spec.allow_dimensions:
            raise OpenAIRequestError(
                f"model '{served}' does not support 'dimensions' (it is not trained to be cut)", param="dimensions"
            )
        if asked.dimensions is not None and self.width > 0 and asked.dimensions > self.width:
            raise OpenAIRequestError(
                f"'dimensions' is {asked.dimensions}; the model's embeddings have {self.width}", param="dimensions"
            )
        return asked

    def logged(self, inputs: EmbeddingsRequest) -> JsonDocument:
        if inputs.pretokenized:
            return {"token_ids": inputs.token_ids}
        return {"texts": inputs.texts}

    def canonical(self, inputs: EmbeddingsRequest) -> Sequence[BytesLike]:
        return [canonical_key(inputs)]

    def run(self, inputs: EmbeddingsRequest, runner: Runner) -> Embeddings:
        with runner.phase("decode"), runner.span("tokenize") as span:
            encoded = self.encode(None if inputs.pretokenized else inputs.texts, inputs.token_ids or None)
            span["onnxpool.inputs"], span["onnxpool.tokens"] = len(encoded), int(encoded.token_count)

        def pooled(hidden: np.ndarray, part: Any) -> np.ndarray:
            try:
                return embed(hidden, part.attention_mask, self.spec, inputs.dimensions)
            except DimensionsError as exc:
                raise OpenAIRequestError(str(exc), param="dimensions") from None

        vectors = self.run_sub_batches(encoded, runner, self.settings.output, pooled)
        return Embeddings(vectors, int(encoded.token_count))

    def reply(self, inputs: EmbeddingsRequest, result: Embeddings) -> dict[str, Any]:
        return response_document(
            result.vectors,
            model=self.served.name,
            prompt_tokens=result.token_count,
            encoding_format=inputs.encoding_format,
        )

    def error_document(self, error: OnnxpoolError) -> dict[str, Any]:
        param = getattr(error, "param", None)
        code = getattr(error, "code", None)
        if error.status == 401:
            code = code or "invalid_api_key"
        kind = ERROR_TYPES.get(error.status, "server_error" if error.status >= 500 else "invalid_request_error")
        return error_body(error.message, param=param, code=code, type_=kind)

    # -------------------------------------------------------------- v2 infer: strings in, vectors out

    def tensor_signature(self) -> ModelInfo:
        return ModelInfo(
            inputs=(TensorSpec(TEXT_INPUT, "tensor(string)", (-1,)),),
            outputs=(TensorSpec(EMBEDDING, "tensor(float)", (-1, self.width)),),
        )

    def from_tensors(self, tensors: Mapping[str, np.ndarray]) -> EmbeddingsRequest:
        texts: list[str] = []
        for index, item in enumerate(tensors[TEXT_INPUT].reshape(-1)):
            try:
                texts.append(item.decode("utf-8") if isinstance(item, bytes) else str(item))
            except UnicodeDecodeError as exc:
                raise BadRequest(
                    f"input '{TEXT_INPUT}' element {index} is not valid UTF-8 (byte {exc.start})"
                ) from None
        if len(texts) > self.settings.max_batch:
            raise BadRequest(f"{len(texts)} texts in one request; max_batch is {self.settings.max_batch}")
        return EmbeddingsRequest(input=texts, model=self.served.name, encoding_format=EncodingFormat.FLOAT)

    def to_tensors(self, inputs: EmbeddingsRequest, result: Embeddings) -> dict[str, np.ndarray]:
        return {EMBEDDING: np.asarray(result.vectors, dtype=np.float32)}

    def openapi(self, route: str) -> dict[str, Any]:
        text_list = {"type": "array", "items": {"type": "string"}}
        ids = {"type": "array", "items": {"type": "integer", "minimum": 0}}
        return {
            "summary": "Embeddings of texts (OpenAI-compatible)",
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "required": ["input", "model"],
                            "properties": {
                                "input": {
                                    "anyOf": [{"type": "string"}, text_list, ids, {"type": "array", "items": ids}]
                                },
                                "model": {"type": "string"},
                                "encoding_format": {"type": "string", "enum": ["float", "base64"]},
                                "dimensions": {"type": "integer", "minimum": 1},
                                "user": {"type": "string"},
                            },
                        },
                        "example": {
                            "model": self.served.name,
                            "input": ["The cat sat.", "A feline was sitting."],
                        },
                    }
                },
            },
            "responses": {
                "200": {
                    "description": "One embedding per input, in order",
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "required": ["object", "data", "model", "usage"],
                                "properties": {
                                    "object": {"type": "string"},
                                    "data": {"type": "array", "items": {"type": "object"}},
                                    "model": {"type": "string"},
                                    "usage": {"type": "object"},
                                },
                            }
                        }
                    },
                }
            },
        }
