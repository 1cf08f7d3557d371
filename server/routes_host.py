"""The host's routes on a host that serves several models (onnxpool.host): any pool answers them for all.

nginx sends every request that names no model to any pool; these routes then read the host's
list of models (workers/host_state.py) and ask each model's pool over its own socket. On a
one-model server (no host) they answer for the one model, as Triton and KServe do.
- GET /v2/health/ready: 200 when every model the host serves is ready (each pool asked), else 503
  naming those that are not.
- GET /v2/models: the models, their versions, aliases and state.
- POST /v2/repository/index (Triton's model repository extension): [{name, version, state, reason}].
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from flask import Blueprint, Response, request

from onnxpool import probe
from onnxpool.server.context import ServerContext, context, json_response
from onnxpool.tasks.errors import BadRequest
from onnxpool.workers.host_state import HostModel, read_host

blueprint = Blueprint("host", __name__)
PROBE_SECONDS = 2.0


def _models(ctx: ServerContext) -> list[HostModel]:
    """The host's models, or this server's one model."""
    if ctx.host_dir is not None:
        return list(read_host(ctx.host_dir).models)
    model = ctx.settings.model
    return [HostModel(model.name, model.version, model.aliases, "", "READY" if ctx.backend.ready else "UNAVAILABLE")]


def _not_ready(ctx: ServerContext, models: list[HostModel]) -> list[str]:
    """The names of the served models whose pool does not answer ready now (asked in parallel)."""
    own = ctx.settings.model.name

    def problem(model: HostModel) -> str | None:
        if model.name == own:
            return None if ctx.backend.ready else model.name
        answer = probe.probe(model.address, f"/v2/models/{model.name}/ready", timeout=PROBE_SECONDS)
        return None if answer is None else model.name

    serving = [model for model in models if model.state == "READY"]
    with ThreadPoolExecutor(max_workers=max(1, len(serving))) as pool:
        return [name for name in pool.map(problem, serving) if name is not None]


@blueprint.get("/v2/health/ready")
def ready() -> Response:
    ctx = context()
    if ctx.host_dir is None:
        is_ready = ctx.backend.ready
        return json_response({"ready": is_ready}, 200 if is_ready else 503)
    models = _models(ctx)
    waiting = _not_ready(ctx, models)
    if not any(model.state == "READY" for model in models):
        waiting = ["(the host has not started its models yet)"]
    document: dict[str, object] = {"ready": not waiting}
    if waiting:
        document["not_ready"] = waiting
    return json_response(document, 503 if waiting else 200)


@blueprint.get("/v2/models")
def models() -> Response:
    ctx = context()
    return json_response(
        {
            "models": [
                {
                    "name": model.name,
                    "versions": [model.version],
                    "aliases": list(model.aliases),
                    "state": model.state,
                    **({"reason": model.reason} if model.reason else {}),
                }
                for model in _models(ctx)
            ]
        }
    )


@blueprint.post("/v2/repository/index")
def repository_index() -> Response:
    """Triton's index: every model with its state; `{"ready": true}` lists only the ready ones."""
    ctx = context()
    body = request.get_data(cache=False)
    only_ready = False
    if body.strip():
        try:
            import orjson

            document = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise BadRequest(f"request body is not JSON: {exc}") from None
        if not isinstance(document, dict) or not isinstance(document.get("ready", False), bool):
            raise BadRequest('the body is {"ready": true|false} or empty')
        only_ready = bool(document.get("ready", False))
    entries = [
        {"name": model.name, "version": model.version, "state": model.state, "reason": model.reason}
        for model in _models(ctx)
        if model.state == "READY" or not only_ready
    ]
    return json_response(entries)
