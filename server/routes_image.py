"""The image endpoint: upload photos, get labels (`/v2/models/{m}/classify`, alias `/predict`).

Accepts multipart/form-data with one or more files in the field `image`, or a
raw body whose Content-Type is `image/*`. All images of one request run as ONE
batched inference. Preprocessing is declared in `[model.preprocess]`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from flask import Blueprint, Response, request
from werkzeug.wrappers import Request

from onnxpool.server.context import ServerContext, context, json_response, read_body
from onnxpool.server.errors import BadRequest, PayloadTooLarge, UnsupportedMediaType
from onnxpool.server.formdata import parse_form
from onnxpool.server.postprocess import scores, top_k
from onnxpool.server.routes_v2 import check_model, loaded_model
from onnxpool.server.timing import phase

blueprint = Blueprint("image", __name__)

IMAGE_FIELD = "image"
PREDICT_RULE = "/predict"
CLASSIFY_RULE = "/v2/models/<model>/classify"
CACHE_ENDPOINT = "classify"
"""The endpoint's name in response-cache keys (both URLs give the same reply)."""
IMAGE_REQUEST_KEY = "onnxpool.image_request"


def image_paths(model_name: str) -> dict[str, str]:
    """The image endpoints' exact paths for this model, mapped to their route rules."""
    return {PREDICT_RULE: PREDICT_RULE, CLASSIFY_RULE.replace("<model>", model_name): CLASSIFY_RULE}


@dataclass(frozen=True)
class ImageRequest:
    """What an image request asks: its images (with a name for each, for error messages) and top_k."""

    images: list[bytes]
    names: list[str]
    top_k: int
    """As asked (or the default), before clamping to the model's number of classes."""

    def cache_params(self) -> dict[str, int]:
        """The parameters in the response-cache key (the images are its payload)."""
        return {"top_k": self.top_k}


def read_image_request(req: Request, ctx: ServerContext) -> ImageRequest:
    """Read and check the images and top_k of an image request; 4xx errors name what is wrong.

    Kept in the WSGI environ: the cache's hit path (server.hit_path) reads the request
    before Flask, and on a miss the route asks again without parsing it twice.
    """
    kept: ImageRequest | None = req.environ.get(IMAGE_REQUEST_KEY)
    if kept is not None:
        return kept
    limits = ctx.settings.limits
    images, names, fields = _uploads(req, limits.max_images, ctx.settings.server.max_body_bytes)
    if len(images) > limits.max_batch:
        raise PayloadTooLarge(f"{len(images)} images in one request; max_batch is {limits.max_batch}")
    asked = ImageRequest(images, names, _requested_top_k(req, ctx.settings.model.top_k, fields))
    req.environ[IMAGE_REQUEST_KEY] = asked
    return asked


def _uploads(req: Request, max_uploads: int, max_body: int) -> tuple[list[bytes], list[str], dict[str, str]]:
    """The request's images, a name for each (used in error messages), and its form fields."""
    # What werkzeug's `req.mimetype` gives, without its full parse of the parameters.
    mimetype = (req.content_type or "").partition(";")[0].strip().lower()
    if mimetype == "multipart/form-data":
        form = parse_form(read_body(req, max_body), req.content_type or "", IMAGE_FIELD, max_uploads)
        if not form.uploads:
            # part names come from the client: any text (or none at all), so shown bounded
            sent = sorted({repr(name)[:40] for name in form.names})
            fields = ", ".join(sent[:10]) + (", ..." if len(sent) > 10 else "") or "none"
            raise BadRequest(f"multipart body has no file in field '{IMAGE_FIELD}' (fields sent: {fields})")
        names = [f'image[{i}] "{filename or "unnamed"}"' for i, (filename, _) in enumerate(form.uploads)]
        return [content for _, content in form.uploads], names, form.fields
    if mimetype.startswith("image/"):
        return [read_body(req, max_body)], [f"request body ({mimetype})"], {}
    raise UnsupportedMediaType(
        f"Content-Type {mimetype or 'missing'} is not accepted: send multipart/form-data with the file(s) "
        f"in field '{IMAGE_FIELD}', or the raw image with an image/* Content-Type"
    )


def _requested_top_k(req: Request, default: int, fields: dict[str, str]) -> int:
    """`top_k` from the query or a form field, else the default (before clamping to the classes)."""
    args = req.args  # `in` first: werkzeug's MultiDict.get raises and catches an exception on a missing key
    raw = (args["top_k"] if "top_k" in args else None) or fields.get("top_k")
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
        asked = read_image_request(request, ctx)

    def compute() -> Response:
        with phase("decode"):
            batch = ctx.pipeline.preprocess_batch(asked.images, asked.names)
        outputs = ctx.backend.infer({input_name: batch}, [output_name])  # timed as "infer" by the backend
        with phase("encode"):  # scores, top-k labels, JSON
            result = np.asarray(outputs[output_name])
            k = min(asked.top_k, int(result.shape[-1]) if result.ndim else 1)
            predictions = top_k(scores(result, config.postprocess), k, ctx.labels)
            return json_response({"model": config.name, "predictions": predictions})

    # The key: the images' bytes in order (not the multipart framing or file names) and top_k.
    return ctx.cache.serve(CACHE_ENDPOINT, asked.cache_params(), asked.images, compute)


@blueprint.post(CLASSIFY_RULE)
def classify(model: str) -> Response:
    return classify_images(model)


@blueprint.post(PREDICT_RULE)
def predict() -> Response:
    return classify_images(context().settings.model.name)
