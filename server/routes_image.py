"""The image endpoint: upload photos, get labels (`/v2/models/{m}/classify`, alias `/predict`).

Accepts multipart/form-data with one or more files in the field `image`, or a
raw body whose Content-Type is `image/*`. All images of one request run as ONE
batched inference. Preprocessing is declared in `[model.preprocess]`.
"""

from __future__ import annotations

import numpy as np
from flask import Blueprint, Response, request

from onnxpool.server.context import context, json_response, read_body
from onnxpool.server.errors import BadRequest, PayloadTooLarge, UnsupportedMediaType
from onnxpool.server.formdata import parse_form
from onnxpool.server.postprocess import scores, top_k
from onnxpool.server.routes_v2 import check_model, loaded_model
from onnxpool.server.timing import phase

blueprint = Blueprint("image", __name__)

IMAGE_FIELD = "image"


def _uploads(max_uploads: int) -> tuple[list[bytes], list[str], dict[str, str]]:
    """The request's images, a name for each (used in error messages), and its form fields."""
    mimetype = request.mimetype
    if mimetype == "multipart/form-data":
        form = parse_form(read_body(), request.content_type or "", IMAGE_FIELD, max_uploads)
        if not form.uploads:
            # part names come from the client: any text (or none at all), so shown bounded
            sent = sorted({repr(name)[:40] for name in form.names})
            fields = ", ".join(sent[:10]) + (", ..." if len(sent) > 10 else "") or "none"
            raise BadRequest(f"multipart body has no file in field '{IMAGE_FIELD}' (fields sent: {fields})")
        names = [f'image[{i}] "{filename or "unnamed"}"' for i, (filename, _) in enumerate(form.uploads)]
        return [content for _, content in form.uploads], names, form.fields
    if mimetype.startswith("image/"):
        return [read_body()], [f"request body ({mimetype})"], {}
    raise UnsupportedMediaType(
        f"Content-Type {mimetype or 'missing'} is not accepted: send multipart/form-data with the file(s) "
        f"in field '{IMAGE_FIELD}', or the raw image with an image/* Content-Type"
    )


def _requested_top_k(default: int, fields: dict[str, str]) -> int:
    """`top_k` from the query or a form field, else the default (before clamping to the classes)."""
    raw = request.args.get("top_k") or fields.get("top_k")
    if raw is None:
        return default
    try:
        k = int(raw)
    except ValueError:
        raise BadRequest(f"top_k must be a positive integer, got {raw[:40]!r}") from None
    if k < 1:
        raise BadRequest(f"top_k must be a positive integer, got {k}")
    return k


def classify_images(model: str) -> Response:
    ctx = context()
    config = ctx.settings.model
    check_model(model)
    info = loaded_model()
    input_name = config.input_name or info.inputs[0].name
    output_name = config.output_name or info.outputs[0].name
    with phase("decode"):  # read the uploads (decoding and preprocessing: on a cache miss)
        images, names, fields = _uploads(ctx.settings.limits.max_images)
        if len(images) > ctx.settings.limits.max_batch:
            raise PayloadTooLarge(f"{len(images)} images in one request; max_batch is {ctx.settings.limits.max_batch}")
    requested = _requested_top_k(config.top_k, fields)

    def compute() -> Response:
        with phase("decode"):
            batch = ctx.pipeline.preprocess_batch(images, names)
        outputs = ctx.backend.infer({input_name: batch}, [output_name])  # timed as "infer" by the backend
        with phase("encode"):  # scores, top-k labels, JSON
            result = np.asarray(outputs[output_name])
            k = min(requested, int(result.shape[-1]) if result.ndim else 1)
            predictions = top_k(scores(result, config.postprocess), k, ctx.labels)
            return json_response({"model": config.name, "predictions": predictions})

    # The key: the images' bytes in order (not the multipart framing or file names) and top_k.
    return ctx.cache.serve("classify", {"top_k": requested}, images, compute)


@blueprint.post("/v2/models/<model>/classify")
def classify(model: str) -> Response:
    return classify_images(model)


@blueprint.post("/predict")
def predict() -> Response:
    return classify_images(context().settings.model.name)
