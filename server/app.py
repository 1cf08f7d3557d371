"""The Flask app factory and the ONE error handler.

`create_app(settings, backend)` builds the app; it does no onnxruntime work,
so the gunicorn master can preload it safely before forking workers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from flask import Flask, Response, current_app, request
from werkzeug.exceptions import HTTPException

from config.settings import Settings
from server import jsonfast
from server.backend import InferenceBackend
from server.errors import BadRequest, OnnxpoolError, PayloadTooLarge

log = logging.getLogger("onnxpool.server")


@dataclass
class ServerContext:
    """Everything routes need, stored on the app (no module globals)."""

    settings: Settings
    backend: InferenceBackend
    extras: dict[str, Any] = field(default_factory=dict)
    """Per-feature state built once per app (e.g. the image pipeline), keyed by feature."""


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


def _handle_onnxpool_error(exc: OnnxpoolError) -> Response:
    return error_response(exc.message, exc.status, exc.headers or None)


def _handle_http_exception(exc: HTTPException) -> Response:
    # Werkzeug's own 404/405/413...: same JSON shape, keep its headers (e.g. Allow).
    status = exc.code or 500
    headers = {k: v for k, v in exc.get_headers() if k.lower() != "content-type"}
    message = exc.description or exc.name
    if status == 405:
        message = f"method {request.method} is not allowed on {request.path}"
    elif status == 404:
        message = f"no route {request.path}"
    return error_response(message, status, headers)


def _handle_unexpected(exc: Exception) -> Response:
    # A bug, not bad input: log it whole, answer a JSON 500, keep the worker alive.
    log.exception("unhandled error on %s %s", request.method, request.path)
    return error_response("internal server error", 500)


def _check_body_size() -> None:
    """Refuse an oversized body from its Content-Length, before reading a byte of it."""
    limit = context().settings.server.max_body_bytes
    length = request.content_length
    if length is not None and length > limit:
        raise PayloadTooLarge(f"request body is {length} bytes; the limit is {limit}")


def read_body() -> bytes:
    """The request body, refused with 413 beyond [server] max_body_bytes, chunked or not.

    For a chunked body werkzeug's stream ends quietly at MAX_CONTENT_LENGTH (a
    truncated body, no error), so reading through it is not enough on its own.
    """
    limit = context().settings.server.max_body_bytes
    length = request.content_length
    if length is not None:
        # Known length (already checked against the limit before the request ran):
        # one read straight from the server's input stream. gunicorn then recv()s
        # in large steps; going through werkzeug's stream wrapper reads 64 KiB at a
        # time, which costs ~0.5 ms per 600 KB tensor body.
        data: bytes = request.environ["wsgi.input"].read(length)
        if len(data) != length:
            raise BadRequest(f"request body ended after {len(data)} of the {length} bytes in Content-Length")
        return data
    data = request.get_data(cache=False)
    if len(data) > limit:
        raise PayloadTooLarge(f"request body is larger than the limit of {limit} bytes")
    return data


def create_app(settings: Settings, backend: InferenceBackend) -> Flask:
    """Build the WSGI app for one model served by `backend`."""
    from server import admission, auth, instrument, openapi
    from server.routes_image import ImageService
    from server.routes_image import blueprint as image_blueprint
    from server.routes_v2 import blueprint as v2_blueprint

    app = Flask("onnxpool")
    # Werkzeug stops reading a body without Content-Length (chunked) here; one byte
    # past the limit so that `read_body` can tell "exactly the limit" from "more".
    app.config["MAX_CONTENT_LENGTH"] = settings.server.max_body_bytes + 1
    # Every route's inference goes through the wrapper: infer timing + batch-size metric.
    timed = instrument.InstrumentedBackend(backend, settings.model.name, settings.metrics.enabled)
    ctx = ServerContext(settings=settings, backend=timed)
    ctx.extras["image"] = ImageService.from_settings(settings)
    app.extensions["onnxpool"] = ctx
    # Order matters: size (no body read), then who is asking, then is it still worth serving.
    app.before_request(_check_body_size)
    auth.install(app, settings.auth)
    admission.install(app)
    app.register_error_handler(OnnxpoolError, _handle_onnxpool_error)
    app.register_error_handler(HTTPException, _handle_http_exception)
    app.register_error_handler(Exception, _handle_unexpected)
    app.register_blueprint(v2_blueprint)
    app.register_blueprint(image_blueprint)
    app.register_blueprint(openapi.blueprint)
    instrument.install(app, settings)  # request ids, Server-Timing, metrics, GET /metrics
    return app
