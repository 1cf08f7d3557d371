"""Which model a URL names and whether it is loaded: the helpers every route shares.

Routes import these (and `server.context`), never each other (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

from onnxpool.server.context import ServerContext
from onnxpool.tasks.errors import NotFound, Unavailable
from onnxpool.workers.model_info import ModelInfo


def check_model(ctx: ServerContext, model: str, version: str | None = None) -> None:
    """404 unless the URL names the configured model (and its version, if given)."""
    config = ctx.settings.model
    if model != config.name and model not in config.aliases:
        raise NotFound(f"unknown model '{model}'; this server serves: {config.name}")
    if version is not None and version != config.version:
        raise NotFound(f"model '{model}' has no version '{version}'; available: {config.version}")


def loaded_model(ctx: ServerContext) -> ModelInfo:
    """The model of this worker, or 503 while it is not loaded yet."""
    info = ctx.backend.info
    if info is None:
        raise Unavailable("model is not loaded yet", headers={"Retry-After": "1"})
    return info
