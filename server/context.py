"""What every route needs, and the helpers they share: the app's context, JSON replies.

Routes, hooks and checks import this module; `server.app` builds the app from
them. Keeping these here (not in `server.app`) is what keeps the package free of
import loops (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flask import Response, current_app

from onnxpool.config.settings import Settings
from onnxpool.server.backend import InferenceBackend
from onnxpool.server.inference_log import InferenceLog
from onnxpool.server.reply_cache import ReplyCache
from onnxpool.server.tracing import Tracing
from onnxpool.tasks import jsonfast
from onnxpool.tasks.api import Task


@dataclass
class ServerContext:
    """Everything routes need, stored on the app (no module globals)."""

    settings: Settings
    backend: InferenceBackend
    """The worker's one session (`workers.session.RUNTIME`, loaded after fork); the data plane
    runs it through a per-request `server.runner.RequestRunner`, which times and counts."""
    task: Task[Any, Any, Any]
    """The model's task ([model] task), bound to the model: reads requests, runs, writes replies."""
    cache: ReplyCache
    """The response cache ([cache]); opened in each worker after fork, until then it just computes."""
    tracing: Tracing
    """Tracing ([tracing]); started in each worker after fork, off until then (and when not configured)."""
    inference_log: InferenceLog = field(default_factory=lambda: InferenceLog(None, False))
    """The inference log ([inference_log]); started in each worker after fork, off until then."""


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
