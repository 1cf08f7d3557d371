"""What every route needs, and the helpers they share: the app's context, JSON replies, the body.

Routes, hooks and checks import this module; `server.app` builds the app from
them. Keeping these here (not in `server.app`) is what keeps the package free of
import loops (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from flask import Response, current_app
from werkzeug.wrappers import Request

from onnxpool.config.settings import Settings
from onnxpool.server.backend import InferenceBackend
from onnxpool.server.reply_cache import ReplyCache
from onnxpool.server.request_state import RequestState, phase
from onnxpool.tasks import jsonfast
from onnxpool.tasks.api import Feeds, Outputs, Task
from onnxpool.tasks.errors import BadRequest, PayloadTooLarge


@dataclass
class ServerContext:
    """Everything routes need, stored on the app (no module globals)."""

    settings: Settings
    backend: InferenceBackend
    task: Task[Any, Any]
    """The model's task ([model] task): reads requests, makes feeds, writes replies."""
    cache: ReplyCache
    """The response cache ([cache]); opened in each worker after fork, until then it just computes."""


class SessionRunner:
    """`onnxpool.tasks.api.Runner`: the app's instrumented backend and the request's phases."""

    __slots__ = ("_backend",)

    def __init__(self, ctx: ServerContext) -> None:
        self._backend = ctx.backend

    def infer(self, feeds: Feeds, output_names: Sequence[str] | None = None) -> Outputs:
        return self._backend.infer(feeds, output_names)  # timed as "infer", batch size recorded

    def phase(self, name: str) -> AbstractContextManager[None]:
        return phase(name)


def json_response(document: object, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """A UTF-8 JSON reply (non-ASCII kept as is) built with orjson."""
    return Response(jsonfast.dumps(document), status=status, headers=headers, content_type="application/json")


def error_response(message: str, status: int, headers: dict[str, str] | None = None) -> Response:
    """The one error shape: {"error": message}."""
    return json_response({"error": message}, status, headers)


def context() -> ServerContext:
    """The ServerContext of the app handling the current request."""
    ctx: ServerContext = current_app.extensions["onnxpool"]
    return ctx


def read_body(req: Request, limit: int) -> bytes:
    """The request body, refused with 413 beyond `limit` ([server] max_body_bytes), chunked or not.

    Read once per request and kept in the request's state: `server.front` may read the
    body before Flask, and on a miss the route asks again.
    For a chunked body werkzeug's stream ends quietly at MAX_CONTENT_LENGTH (a
    truncated body, no error), so reading through it is not enough on its own.
    """
    environ = req.environ
    state = RequestState.of(environ)
    if state.body is not None:
        return state.body
    length = req.content_length
    if length is not None:
        # Known length (already checked against the limit by the body-size gate):
        # one read straight from the server's input stream. gunicorn then recv()s
        # in large steps; going through werkzeug's stream wrapper reads 64 KiB at a
        # time, which costs ~0.5 ms per 600 KB tensor body.
        data: bytes = environ["wsgi.input"].read(length)
        if len(data) != length:
            raise BadRequest(f"request body ended after {len(data)} of the {length} bytes in Content-Length")
    else:
        data = req.get_data(cache=False)
        if len(data) > limit:
            raise PayloadTooLarge(f"request body is larger than the limit of {limit} bytes")
    state.body = data
    return data
