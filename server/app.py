"""The app factory and the ONE error handler of Flask's routes.

`create_app(settings, backend, task)` builds the WSGI app: the instrumentation outermost,
then the data plane (`server.dataplane`: every request that runs the model, one path),
then Flask (metadata, health, metrics, OpenAPI). It does no onnxruntime work, so the
gunicorn master can preload it safely before forking workers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flask import Flask, Response, current_app, request
from werkzeug.exceptions import HTTPException

from onnxpool.config.callers import CallerBook, caller_book_of
from onnxpool.config.loader import LoadedSettings
from onnxpool.config.settings import Settings
from onnxpool.server import (
    admission,
    auth,
    gates,
    instrument,
    openapi,
    routes_docs,
    routes_host,
    routes_task,
    routes_v1,
    routes_v2,
)
from onnxpool.server import callers as caller_gate
from onnxpool.server.backend import InferenceBackend
from onnxpool.server.context import ServerContext, error_response, json_response
from onnxpool.server.dataplane import DataPlane, Route
from onnxpool.server.inference_log import InferenceLog
from onnxpool.server.inference_log_plan import plan_inference_log
from onnxpool.server.operations import TaskOperation, V2Infer
from onnxpool.server.reply_cache import ReplyCache, settings_fingerprint
from onnxpool.server.tracing import Tracing
from onnxpool.server.tracing_plan import plan_tracing
from onnxpool.server.v2codec import RequestLimits
from onnxpool.tasks.api import Task
from onnxpool.tasks.errors import OnnxpoolError
from onnxpool.tasks.identity import task_identity
from onnxpool.tasks.registry import build_task
from onnxpool.tasks.server_routes import V2_INFER, V2_VERSION_INFER

log = logging.getLogger("onnxpool.server")


def _render(error: OnnxpoolError) -> Response:
    """The one error shape, `{"error": message}`, or the task's own on its routes (OpenAI's, say)."""
    rule = request.url_rule
    ctx: ServerContext = current_app.extensions["onnxpool"]
    if rule is not None and rule.rule in ctx.task.routes:
        document = ctx.task.error_document(error)
        return json_response(document, error.status, error.headers or None)
    return error_response(error.message, error.status, error.headers or None)


def _handle_onnxpool_error(exc: OnnxpoolError) -> Response:
    return _render(exc)


def _handle_http_exception(exc: HTTPException) -> Response:
    # Werkzeug's own 404/405/413...: same JSON shape, keep its headers (e.g. Allow).
    status = exc.code or 500
    headers = {k: v for k, v in exc.get_headers() if k.lower() != "content-type"}
    message = exc.description or exc.name
    if status == 405:
        message = f"method {request.method} is not allowed on {request.path}"
    elif status == 404:
        message = f"no route {request.path}"
    return _render(OnnxpoolError(message, headers=headers, status=status))


def _handle_unexpected(exc: Exception) -> Response:
    # A bug, not bad input: log it whole, answer a JSON 500, keep the worker alive.
    log.exception("unhandled error on %s %s", request.method, request.path)
    return _render(OnnxpoolError("internal server error", status=500))


@dataclass(frozen=True)
class CachePlan:
    """What the master knows about the response cache of a generation (see server.reply_cache)."""

    model_digest: str
    """Digest of the model file the generation's workers load (part of every key)."""
    folder: Path | None
    """The local store's folder, already prepared; None when the cache is off or in Redis."""


def create_app(
    settings: Settings,
    backend: InferenceBackend,
    cache: CachePlan | None = None,
    task: Task[Any, Any, Any] | None = None,
    callers: CallerBook | None = None,
) -> Flask:
    """Build the WSGI app for one model served by `backend`, running `task` on it.

    Reads the API key files (raising ConfigError's subclasses with one line): the master
    calls this once per generation, before forking, with the task it built and bound to the
    model (`onnxpool.tasks.registry.build_task`); without one (an app built in process), the
    task of `settings` is built here and bound to the backend's model, which must be loaded.
    Without a `cache` plan replies are never cached.
    """

    if task is None:
        if backend.info is None:
            raise ValueError("create_app without a task needs a loaded backend: the task is bound to its model")
        task = build_task(LoadedSettings(settings), backend.info)
    app = Flask("onnxpool")
    # Werkzeug stops reading a body without Content-Length (chunked) here; one byte
    # past the limit so that `read_body` can tell "exactly the limit" from "more".
    app.config["MAX_CONTENT_LENGTH"] = settings.server.max_body_bytes + 1
    section = settings.cache if cache is not None else settings.cache.model_copy(update={"enabled": False})
    ctx = ServerContext(
        settings=settings,
        backend=backend,
        task=task,
        cache=ReplyCache(
            section,
            folder=cache.folder if cache is not None else None,
            model_digest=cache.model_digest if cache is not None else "",
            fingerprint=settings_fingerprint(settings, task_identity(task)),
            record_metrics=settings.metrics.enabled,
            server_timing=settings.metrics.server_timing,
        ),
        # Planned here, in the master (a bad OTEL_* variable is a ConfigError like a bad setting);
        # its provider and exporter are each worker's own, made after fork (open_in_worker).
        tracing=Tracing(plan_tracing(settings, task.name), settings.metrics.enabled),
        # Planned here too; each worker's buffer, shipper thread and connection are made after fork.
        inference_log=InferenceLog(plan_inference_log(settings), settings.metrics.enabled),
    )
    app.extensions["onnxpool"] = ctx
    # Order matters: size (no body read), then who is asking, then is it still worth serving.
    gates.add(app, gates.body_size(settings.server.max_body_bytes))
    if callers is None:  # an app built in process: the callers of its settings (reads the keys file)
        callers = caller_book_of(settings)
    auth.install(app, callers, settings.auth.protect_metrics)
    caller_gate.install(app, callers, settings.model.name, settings.model.aliases)
    admission.install(app, settings.limits.max_queue_ms)
    app.register_error_handler(OnnxpoolError, _handle_onnxpool_error)
    app.register_error_handler(HTTPException, _handle_http_exception)
    app.register_error_handler(Exception, _handle_unexpected)
    app.register_blueprint(routes_host.blueprint)
    app.register_blueprint(routes_v2.blueprint)
    app.register_blueprint(routes_v1.blueprint)
    app.register_blueprint(routes_task.blueprint_for(task))
    app.register_blueprint(openapi.blueprint)
    routes_docs.install(app, settings.server.docs)
    # Every request that runs the model: one path, before Flask (server.dataplane).
    app.wsgi_app = DataPlane(app.wsgi_app, ctx, gates.of(app), operation_routes(ctx))  # type: ignore[method-assign]
    # request state, ids, Server-Timing, metrics, GET /metrics: outermost
    instrument.install(app, settings, task.name, ctx.tracing)
    return app


def operation_routes(ctx: ServerContext) -> dict[str, Route]:
    """The data plane's exact paths: each task route, and v2 infer, for this model's name (and version)."""
    model = ctx.settings.model
    bounds = ctx.settings.limits
    limits = RequestLimits(bounds.max_batch, bounds.max_elements, bounds.max_json_depth)
    v2 = V2Infer(
        ctx.task, ctx.task.model, model.name, model.version, limits, ctx.settings.inference_log.tensor_elements
    )
    on_task = TaskOperation(ctx.task)
    routes: dict[str, Route] = {}
    # The model's aliases name it in URLs too (those without a `/`: a Hugging Face id is for bodies).
    for name in (model.name, *(alias for alias in model.aliases if "/" not in alias)):
        routes[f"/v2/models/{name}/infer"] = Route(V2_INFER, v2)
        routes[f"/v2/models/{name}/versions/{model.version}/infer"] = Route(V2_VERSION_INFER, v2)
        for rule in ctx.task.routes:
            routes.setdefault(rule.replace(routes_task.MODEL_PART, name), Route(rule, on_task))
    return routes


def task_of(app: Flask) -> Task[Any, Any, Any]:
    """The task an app runs."""
    ctx: ServerContext = app.extensions["onnxpool"]
    return ctx.task


def open_in_worker(app: Flask, cores: int) -> None:
    """In each worker after fork (gunicorn post_fork): make what must not cross fork (the task's, the cache,
    the tracing exporter and its thread)."""
    ctx: ServerContext = app.extensions["onnxpool"]
    ctx.task.start_in_worker(cores)
    ctx.cache.open()
    ctx.tracing.open(cores)  # `cores` is the session's intra-op threads: the inference spans say it
    ctx.inference_log.open()


def close_in_worker(app: Flask) -> None:
    """In each worker as it exits (gunicorn worker_exit), if `open_in_worker` ran: the task's `finish`, then
    the last spans flushed (bounded by [tracing] flush_timeout_seconds). An error is one logged line: the
    worker is leaving anyway, and its exit must stay clean."""
    ctx: ServerContext = app.extensions["onnxpool"]
    task = ctx.task
    try:
        task.finish()
    except Exception as exc:  # a user's task may raise anything
        log.error("task %s: finish() raised %s: %s", task.name, type(exc).__name__, exc)
    try:
        ctx.tracing.close()
    except Exception as exc:
        log.error("tracing: the last spans were not flushed: %s: %s", type(exc).__name__, exc)
    try:
        ctx.inference_log.close()
    except Exception as exc:
        log.error("inference log: the last events were not sent: %s: %s", type(exc).__name__, exc)


def inference_log_settle(app: Flask) -> Callable[[], None] | None:
    """In a worker after `open_in_worker`: what to call after each reply has left (gunicorn post_request, a
    gRPC call's end) so that what the request left for the inference log goes into its buffer
    (`server.inference_log`); None while the log is off (nothing to call)."""
    ctx: ServerContext = app.extensions["onnxpool"]
    return ctx.inference_log.settle if ctx.inference_log.shipper is not None else None
