"""Open Inference Protocol v2 REST routes (KServe / Triton compatible)."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, request

from onnxpool import __version__
from onnxpool.cache.key import BytesLike, v2_request_payload
from onnxpool.server import admission
from onnxpool.server.context import SessionRunner, context, json_response, read_body
from onnxpool.server.datatypes import v2_datatype
from onnxpool.server.reply_cache import insert_v2_id
from onnxpool.server.request_state import RequestState, phase
from onnxpool.server.v2codec import (
    BINARY_HEADER,
    RequestLimits,
    decode_infer_request,
    encode_infer_response,
    parse_header_length,
)
from onnxpool.tasks import jsonfast
from onnxpool.tasks.errors import BadRequest, NotFound, Unavailable
from onnxpool.workers.cpu_fit import cpu_flags, describe
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
    ctx = context()
    loaded = loaded_model()
    info = ctx.task.tensor_signature(loaded) or loaded  # what v2 clients send and get (a text task: strings)
    config = ctx.settings.model
    return json_response(
        {
            "name": config.name,
            "versions": [config.version],
            "platform": "onnxruntime_onnx",
            "inputs": [_tensor_metadata(t) for t in info.inputs],
            "outputs": [_tensor_metadata(t) for t in info.outputs],
            # issue 21: the INT8 recipe inside the MODEL (not the task's tensor view) and whether this CPU fits it
            **({"parameters": {"quantization": q}} if (q := describe(loaded.metadata_map, cpu_flags())) else {}),
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
        body = read_body(
            request, ctx.settings.server.max_body_bytes
        )  # first: an oversized body is a 413 even when the binary header is bad too
        header_length = parse_header_length(request.headers.get(BINARY_HEADER))

    task = ctx.task
    signature = task.tensor_signature(info)

    def compute(echo_id: bool) -> Response:
        with phase("decode"):
            decoded = decode_infer_request(body, signature or info, limits, header_length, signature is not None)
        admission.check_infer_timeout(decoded.parameters)
        if signature is None:
            outputs = ctx.backend.infer(decoded.inputs, decoded.output_names)  # timed as "infer" by the backend
        else:  # the task's own tensors: through the task, like its routes
            with phase("decode"):
                inputs = task.from_tensors(decoded.inputs)
            produced = task.run(inputs, info, SessionRunner(ctx))
            with phase("encode"):
                tensors = task.to_tensors(inputs, produced)
                wanted = decoded.output_names
                outputs = {name: tensors[name] for name in wanted} if wanted is not None else tensors
        with phase("encode"):
            encoded = encode_infer_response(
                ctx.settings.model.name,
                ctx.settings.model.version,
                decoded.id if echo_id else None,
                outputs,
                decoded.binary_outputs,
            )
            return Response(encoded.body, headers=encoded.headers)

    header = _cacheable_header(body, header_length)
    if header is None:
        return compute(True)
    # Binary tensors: the key is the JSON header without its echo-only `id`, then the tensor bytes.
    # The reply is computed and stored without the id; the caller's id goes in fresh (hit or miss).
    request_id = header.get("id")
    payload: list[BytesLike] = [v2_request_payload(header), memoryview(body)[header_length:]]
    state = RequestState.of(request.environ)
    response = ctx.cache.serve(state, "v2-infer", lambda: payload, lambda: compute(False), replay=(BINARY_HEADER,))
    if isinstance(request_id, str) and response.status_code == 200:
        insert_v2_id(response, request_id, BINARY_HEADER)
    return response


def _cacheable_header(body: bytes, header_length: int | None) -> dict[str, Any] | None:
    """The JSON header of a binary-tensor request the cache may answer, else None (computed as always).

    JSON-tensor requests are not cached: keying them would mean parsing the whole tensor body
    twice. Nor is a header that does not parse or has a non-string `id` (computing reports it).
    """
    if not context().cache.active or header_length is None or not 0 < header_length <= len(body):
        return None
    try:
        header = jsonfast.loads(memoryview(body)[:header_length])
    except BadRequest:
        return None
    if not isinstance(header, dict) or not isinstance(header.get("id", ""), str):
        return None
    return header
