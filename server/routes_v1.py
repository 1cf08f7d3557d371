"""KServe's v1 protocol: the model list and status (a task may answer `/v1/models/<m>:predict`).

Backends written against KServe's v1 REST API ask `GET /v1/models/<name>` whether a model
is ready before they predict; these answer like KServe's model server does.
"""

from __future__ import annotations

from flask import Blueprint, Response

from onnxpool.server.context import context, json_response
from onnxpool.server.served import check_model
from onnxpool.tasks import server_routes as paths

blueprint = Blueprint("v1", __name__)


@blueprint.get(paths.V1_MODELS)
def list_models() -> Response:
    return json_response({"models": [context().settings.model.name]})


@blueprint.get(paths.V1_MODEL)
def model_status(model: str) -> Response:
    ctx = context()
    check_model(ctx, model)
    is_ready = ctx.backend.ready
    return json_response({"name": model, "ready": is_ready}, 200 if is_ready else 503)
