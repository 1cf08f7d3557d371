"""Open Inference Protocol v2 REST routes (KServe / Triton compatible)."""

from __future__ import annotations

from flask import Blueprint, Response, request

from onnxpool import __version__
from onnxpool.server import admission
from onnxpool.server.context import context, json_response, read_body
from onnxpool.server.datatypes import v2_datatype
from onnxpool.server.errors import NotFound, Unavailable
from onnxpool.server.timing import phase
from onnxpool.server.v2codec import (
    BINARY_HEADER,
    RequestLimits,
    decode_infer_request,
    encode_infer_response,
    parse_header_length,
)
from onnxpool.workers.model_info import ModelInfo, TensorSpec

blueprint = Blueprint("v2", __name__)

SERVER_NAME = "onnxpool"
EXTENSIONS = ["binary_tensor_data", "classification"]


def check_model(model: str, version: str | None = None) -> None:
    """404 unless the URL names the configured model (and its version, if given)."""
    config = context().settings.model
    if model != config.name:
        raise NotFound(f"unknown model '{model}'; this server serves: {config.name}")
    if version is not None and version != config.version:
        raise NotFound(f"model '{model}' has no version '{version}'; available: {config.version}")


def loaded_model() -> ModelInfo:
    """The model of this worker, or 503 while it is not loaded yet."""
    info = context().backend.info
    if info is None:
        raise Unavailable("model is not loaded yet", headers={"Retry-After": "1"})
    return info


def _tensor_metadata(spec: TensorSpec) -> dict[str, object]:
    return {"name": spec.name, "datatype": v2_datatype(spec.dtype), "shape": list(spec.shape)}


@blueprint.get("/v2")
def server_metadata() -> Response:
    return json_response({"name": SERVER_NAME, "version": __version__, "extensions": EXTENSIONS})


@blueprint.get("/v2/health/live")
def live() -> Response:
    return json_response({"live": True})


@blueprint.get("/v2/health/ready")
def ready() -> Response:
    is_ready = context().backend.ready
    return json_response({"ready": is_ready}, 200 if is_ready else 503)


@blueprint.get("/v2/models/<model>")
@blueprint.get("/v2/models/<model>/versions/<version>")
def model_metadata(model: str, version: str | None = None) -> Response:
    check_model(model, version)
    info = loaded_model()
    config = context().settings.model
    return json_response(
        {
            "name": config.name,
            "versions": [config.version],
            "platform": "onnxruntime_onnx",
            "inputs": [_tensor_metadata(t) for t in info.inputs],
            "outputs": [_tensor_metadata(t) for t in info.outputs],
        }
    )


@blueprint.get("/v2/models/<model>/ready")
@blueprint.get("/v2/models/<model>/versions/<version>/ready")
def model_ready(model: str, version: str | None = None) -> Response:
    check_model(model, version)
    is_ready = context().backend.ready
    return json_response({"name": model, "ready": is_ready}, 200 if is_ready else 503)


@blueprint.post("/v2/models/<model>/infer")
@blueprint.post("/v2/models/<model>/versions/<version>/infer")
def infer(model: str, version: str | None = None) -> Response:
    check_model(model, version)
    ctx = context()
    info = loaded_model()
    bounds = ctx.settings.limits
    limits = RequestLimits(bounds.max_batch, bounds.max_elements, bounds.max_json_depth)
    with phase("decode"):
        body = read_body()  # first: an oversized body is a 413 even when the binary header is bad too
        decoded = decode_infer_request(body, info, limits, parse_header_length(request.headers.get(BINARY_HEADER)))
    admission.check_infer_timeout(decoded.parameters)
    outputs = ctx.backend.infer(decoded.inputs, decoded.output_names)  # timed as "infer" by the backend
    with phase("encode"):
        encoded = encode_infer_response(
            ctx.settings.model.name, ctx.settings.model.version, decoded.id, outputs, decoded.binary_outputs
        )
        response = Response(encoded.body, headers=encoded.headers)
    return response
