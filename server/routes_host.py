"""The server-wide routes of a one-model server, answered for its one model (as Triton and KServe do).

- GET /v2/health/ready: 200 when this worker's model is loaded and warm, else 503.
- GET /v2/models: the model, its versions, aliases and state.
- POST /v2/repository/index (Triton's model repository extension): [{name, version, state, reason}].

A host serving several models answers these for every model from its own process (onnxpool.host's
routes, behind the same front door): each model's pool is a one-model server and knows only itself.
"""

from __future__ import annotations

from flask import Blueprint, Response, request

from onnxpool.server.context import ServerContext, context, json_response
from onnxpool.server.model_states import READY, UNAVAILABLE, ServedModel, model_list, repository_index
from onnxpool.tasks import server_routes as paths

blueprint = Blueprint("host", __name__)


def _models(ctx: ServerContext) -> list[ServedModel]:
    model = ctx.settings.model
    return [ServedModel(model.name, model.version, model.aliases, READY if ctx.backend.ready else UNAVAILABLE)]


@blueprint.get(paths.V2_READY)
def ready() -> Response:
    is_ready = context().backend.ready
    return json_response({"ready": is_ready}, 200 if is_ready else 503)


@blueprint.get(paths.V2_MODELS)
def models() -> Response:
    return json_response(model_list(_models(context())))


@blueprint.post(paths.V2_REPOSITORY_INDEX)
def repository_index_route() -> Response:
    return json_response(repository_index(_models(context()), request.get_data(cache=False)))
