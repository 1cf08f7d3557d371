"""The Flask app factory and the ONE error handler.

`create_app(settings, backend)` builds the app; it does no onnxruntime work,
so the gunicorn master can preload it safely before forking workers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException

from onnxpool.config.settings import Settings
from onnxpool.server import admission, auth, gates, instrument, openapi
from onnxpool.server.backend import InferenceBackend
from onnxpool.server.caching import ReplyCache, settings_fingerprint
from onnxpool.server.context import ServerContext, error_response
from onnxpool.server.errors import OnnxpoolError
from onnxpool.server.hit_path import HitPath
from onnxpool.server.imaging import ImagePipeline
from onnxpool.server.postprocess import load_labels
from onnxpool.server.routes_image import blueprint as image_blueprint
from onnxpool.server.routes_v2 import blueprint as v2_blueprint

log = logging.getLogger("onnxpool.server")


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


@dataclass(frozen=True)
class CachePlan:
    """What the master knows about the response cache of a generation (see server.caching)."""

    model_digest: str
    """Digest of the model file the generation's workers load (part of every key)."""
    folder: Path | None
    """The local store's folder, already prepared; None when the cache is off or in Redis."""


def create_app(settings: Settings, backend: InferenceBackend, cache: CachePlan | None = None) -> Flask:
    """Build the WSGI app for one model served by `backend`.

    Reads the labels and API key files (raising ConfigError's subclasses with one
    line): the master calls this once per generation, before forking. Without a
    `cache` plan (an app built in-process) replies are never cached.
    """

    app = Flask("onnxpool")
    # Werkzeug stops reading a body without Content-Length (chunked) here; one byte
    # past the limit so that `read_body` can tell "exactly the limit" from "more".
    app.config["MAX_CONTENT_LENGTH"] = settings.server.max_body_bytes + 1
    # Every route's inference goes through the wrapper: infer timing + batch-size metric.
    timed = instrument.InstrumentedBackend(backend, settings.model.name, settings.metrics.enabled)
    labels_file = settings.model.labels
    labels = load_labels(labels_file) if labels_file is not None else None
    section = settings.cache if cache is not None else settings.cache.model_copy(update={"enabled": False})
    ctx = ServerContext(
        settings=settings,
        backend=timed,
        pipeline=ImagePipeline(settings.model.preprocess, settings.limits),
        labels=labels,
        cache=ReplyCache(
            section,
            folder=cache.folder if cache is not None else None,
            model_digest=cache.model_digest if cache is not None else "",
            fingerprint=settings_fingerprint(settings, labels),
            record_metrics=settings.metrics.enabled,
            server_timing=settings.metrics.server_timing,
        ),
    )
    app.extensions["onnxpool"] = ctx
    # Order matters: size (no body read), then who is asking, then is it still worth serving.
    gates.add(app, gates.body_size(settings.server.max_body_bytes))
    auth.install(app, settings.auth)
    admission.install(app, settings.limits.max_queue_ms)
    app.register_error_handler(OnnxpoolError, _handle_onnxpool_error)
    app.register_error_handler(HTTPException, _handle_http_exception)
    app.register_error_handler(Exception, _handle_unexpected)
    app.register_blueprint(v2_blueprint)
    app.register_blueprint(image_blueprint)
    app.register_blueprint(openapi.blueprint)
    if ctx.cache.wanted:  # hits of the image endpoints answered before Flask, after the same gates
        app.wsgi_app = HitPath(app.wsgi_app, ctx, gates.of(app))  # type: ignore[method-assign]
    instrument.install(app, settings)  # request ids, Server-Timing, metrics, GET /metrics: outermost
    return app


def open_in_worker(app: Flask) -> None:
    """In each worker after fork (gunicorn post_fork): open what must not cross fork (the cache)."""
    ctx: ServerContext = app.extensions["onnxpool"]
    ctx.cache.open()
