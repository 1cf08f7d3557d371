"""The documents that list models and their states: GET /v2/models and Triton's repository index.

One shape for both servers that answer them: a one-model server (server/routes_host.py, its one
model) and a host serving several models (onnxpool.host's routes, every model with the state its
pool is in).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from onnxpool.tasks.errors import BadRequest

READY = "READY"
LOADING = "LOADING"
UNAVAILABLE = "UNAVAILABLE"


@dataclass(frozen=True)
class ServedModel:
    """One model as the model list shows it."""

    name: str
    """Its name in URLs, OpenAI bodies, metrics labels."""
    version: str
    aliases: tuple[str, ...]
    """Other names it answers to."""
    state: str
    """READY (serving), LOADING (its pool is starting or restarting), UNAVAILABLE (`reason` says why)."""
    reason: str = ""


def model_list(models: Sequence[ServedModel]) -> dict[str, object]:
    """GET /v2/models: every model with its versions, aliases, state (and reason, when not ready)."""
    return {
        "models": [
            {
                "name": model.name,
                "versions": [model.version],
                "aliases": list(model.aliases),
                "state": model.state,
                **({"reason": model.reason} if model.reason else {}),
            }
            for model in models
        ]
    }


def repository_index(models: Sequence[ServedModel], body: bytes) -> list[dict[str, str]]:
    """POST /v2/repository/index (Triton's): every model with its state; `{"ready": true}` lists only
    the ready ones. A body that is not that is a 400 naming what was wrong."""
    only_ready = False
    if body.strip():
        try:
            document = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise BadRequest(f"request body is not JSON: {exc}") from None
        if not isinstance(document, dict) or not isinstance(document.get("ready", False), bool):
            raise BadRequest('the body is {"ready": true|false} or empty')
        only_ready = bool(document.get("ready", False))
    return [
        {"name": model.name, "version": model.version, "state": model.state, "reason": model.reason}
        for model in models
        if model.state == READY or not only_ready
    ]
