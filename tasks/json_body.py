"""What the JSON tasks share: reading a JSON request body, and describing a JSON operation."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from onnxpool.tasks import jsonfast
from onnxpool.tasks.api import RequestParts
from onnxpool.tasks.describe import describe
from onnxpool.tasks.errors import BadRequest, UnsupportedMediaType

ModelT = TypeVar("ModelT", bound=BaseModel)


def read_json(request: RequestParts, max_depth: int, shape: str) -> Any:
    """The body as JSON (400 naming where it fails, or where it nests past `max_depth`).

    Lenient like KServe's server about the Content-Type (curl -d sends a form type); only
    uploads are refused outright, with `shape` (an example of the expected body) as advice.
    """
    if request.mimetype.startswith(("multipart/", "image/")):
        raise UnsupportedMediaType(
            f"Content-Type {request.mimetype} is not accepted: send application/json with {shape}"
        )
    document = jsonfast.loads(request.body())
    jsonfast.check_depth(document, max_depth)
    return document


def read_model(request: RequestParts, model: type[ModelT], max_depth: int) -> ModelT:
    """The JSON body validated by a pydantic `model`: a 400 naming the first field that is wrong
    (`measurements.0.2: Field required`)."""
    document = read_json(request, max_depth, f"a JSON {model.__name__}")
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in error["loc"]) or "the body"
        raise BadRequest(f"{where}: {error['msg']}") from None


def json_operation(
    summary: str, request_schema: dict[str, Any], reply: str, reply_schema: dict[str, Any], example: Any = None
) -> dict[str, Any]:
    """An OpenAPI operation fragment (`Task.openapi`) with a JSON body and a JSON 200 reply.

    `example`: a request body that works, shown and filled in by /docs' try-it-out."""
    return describe(summary, json=request_schema, example=example, reply=reply_schema, reply_description=reply)
