"""Open Inference Protocol v2 REST routes (KServe / Triton compatible): metadata and health.

Infer runs the model, so the data plane serves it (`server.dataplane`, `server.operations`).
"""

from __future__ import annotations

from flask import Blueprint, Response

from onnxpool import __version__
from onnxpool.server.context import context, json_response
from onnxpool.server.datatypes import v2_datatype
from onnxpool.server.served import check_model, loaded_model
from onnxpool.tasks import jsonfast
from onnxpool.tasks import server_routes as paths
from onnxpool.tasks.errors import NotFound
from onnxpool.workers.cpu_fit import cpu_flags, describe
from onnxpool.workers.model_info import TensorSpec

blueprint = Blueprint("v2", __name__)

SERVER_NAME = "onnxpool"
EXTENSIONS = ["binary_tensor_data", "classification"]


def _tensor_metadata(spec: TensorSpec) -> dict[str, object]:
    return {"name": spec.name, "datatype": v2_datatype(spec.dtype), "shape": list(spec.shape)}


@blueprint.get(paths.V2_SERVER)
def server_metadata() -> Response:
    return json_response({"name": SERVER_NAME, "version": __version__, "extensions": EXTENSIONS})


@blueprint.get(paths.V2_LIVE)
def live() -> Response:
    return json_response({"live": True})


@blueprint.get(paths.V2_MODEL)
@blueprint.get(paths.V2_MODEL_VERSION)
def model_metadata(model: str, version: str | None = None) -> Response:
    ctx = context()
    check_model(ctx, model, version)
    loaded = loaded_model(ctx)
    info = ctx.task.tensor_signature() or loaded  # what v2 clients send and get (a text task: strings)
    config = ctx.settings.model
    parameters: dict[str, object] = {}
    # issue 21: the INT8 recipe inside the MODEL (not the task's tensor view) and whether this CPU fits it
    if quantization := describe(loaded.metadata_map, cpu_flags()):
        parameters["quantization"] = quantization
    if classes := ctx.task.class_names():  # a classifier's probabilities, column by column
        parameters["classes"] = list(classes)
    sample = ctx.task.sample_request()
    if sample is not None and sample.mimetype == "application/json":
        # A body this model accepts: the task's own sample, which the master ran on the model before any fork.
        parameters["example"] = {"route": sample.route, "body": jsonfast.loads(sample.data, "example")}
    return json_response(
        {
            "name": config.name,
            "versions": [config.version],
            "platform": "onnxruntime_onnx",
            "inputs": [_tensor_metadata(t) for t in info.inputs],
            "outputs": [_tensor_metadata(t) for t in info.outputs],
            **({"parameters": parameters} if parameters else {}),
        }
    )


@blueprint.get(paths.V2_MODEL_READY)
@blueprint.get(paths.V2_MODEL_VERSION_READY)
def model_ready(model: str, version: str | None = None) -> Response:
    check_model(context(), model, version)
    is_ready = context().backend.ready
    return json_response({"name": model, "ready": is_ready}, 200 if is_ready else 503)


@blueprint.post(paths.V2_INFER)
@blueprint.post(paths.V2_VERSION_INFER)
def infer(model: str, version: str | None = None) -> Response:
    """Only a URL naming another model (or version) reaches Flask: the data plane serves this model's."""
    ctx = context()
    check_model(ctx, model, version)
    raise NotFound(f"no route /v2/models/{model}/infer")
