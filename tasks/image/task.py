"""Image classification: upload photos, get labels (`/predict`, `/v2/models/{m}/classify`).

Accepts multipart/form-data with one or more files in the field `image`, or a raw
body whose Content-Type is `image/*`. All images of one request run as ONE batched
inference. Preprocessing is `[model.preprocess]`, the scores `[model] postprocess`,
the class names `[model] labels`: the settings this endpoint always had, so the task
needs no `[task]` table of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxpool.config.settings import Settings
from onnxpool.tasks.api import BytesLike, Feeds, Outputs, RequestParts, Task, TaskConfigError, TaskSettings
from onnxpool.tasks.errors import BadRequest, PayloadTooLarge, UnsupportedMediaType
from onnxpool.tasks.image.formdata import parse_form
from onnxpool.tasks.image.imaging import ImagePipeline
from onnxpool.tasks.image.postprocess import load_labels, scores, top_k
from onnxpool.workers.model_info import ModelInfo, TensorSpec

IMAGE_FIELD = "image"


@dataclass(frozen=True)
class ImageRequest:
    """What an image request asks: its images (with a name for each, for error messages) and top_k."""

    images: list[bytes]
    names: list[str]
    top_k: int
    """As asked (or the default), before clamping to the model's number of classes."""


class ImageClassification(Task[ImageRequest, TaskSettings]):
    """ImageNet-style classifiers: one image tensor in, class scores out."""

    name = "image-classification"
    routes = ("/predict", "/v2/models/<model>/classify")
    content_types = ("multipart/form-data", "image/*")

    def __init__(self, settings: Settings, options: TaskSettings) -> None:
        super().__init__(settings, options)
        self.pipeline = ImagePipeline(settings.model.preprocess, settings.limits)
        labels_file = settings.model.labels
        self.labels = load_labels(labels_file) if labels_file is not None else None
        """Class names in output-index order ([model] labels), read once, in the master."""

    def fingerprint(self) -> str:
        return "\n".join(self.labels) if self.labels is not None else ""

    def check(self, model: ModelInfo) -> None:
        spec = self._input(model)
        if len(spec.shape) != 4:
            raise TaskConfigError(
                f"task {self.name}: input '{spec.name}' has shape {list(spec.shape)}; an image input is "
                "4-dimensional (batch, and channels/height/width in [model.preprocess] layout)"
            )

    def _input(self, model: ModelInfo) -> TensorSpec:
        name = self.settings.model.input_name
        spec = model.input(name) if name else model.inputs[0]
        assert spec is not None  # preflight checked [model] input_name
        return spec

    def _output(self, model: ModelInfo) -> str:
        return self.settings.model.output_name or model.outputs[0].name

    def read(self, request: RequestParts) -> ImageRequest:
        limits = self.settings.limits
        images, names, fields = self._uploads(request, limits.max_images)
        if len(images) > limits.max_batch:
            raise PayloadTooLarge(f"{len(images)} images in one request; max_batch is {limits.max_batch}")
        return ImageRequest(images, names, _requested_top_k(request, self.settings.model.top_k, fields))

    def _uploads(self, request: RequestParts, max_uploads: int) -> tuple[list[bytes], list[str], dict[str, str]]:
        """The request's images, a name for each (used in error messages), and its form fields."""
        mimetype = request.mimetype
        if mimetype == "multipart/form-data":
            form = parse_form(request.body(), request.content_type, IMAGE_FIELD, max_uploads)
            if not form.uploads:
                # part names come from the client: any text (or none at all), so shown bounded
                sent = sorted({repr(name)[:40] for name in form.names})
                fields = ", ".join(sent[:10]) + (", ..." if len(sent) > 10 else "") or "none"
                raise BadRequest(f"multipart body has no file in field '{IMAGE_FIELD}' (fields sent: {fields})")
            names = [f'image[{i}] "{filename or "unnamed"}"' for i, (filename, _) in enumerate(form.uploads)]
            return [content for _, content in form.uploads], names, form.fields
        if mimetype.startswith("image/"):
            return [request.body()], [f"request body ({mimetype})"], {}
        raise UnsupportedMediaType(
            f"Content-Type {mimetype or 'missing'} is not accepted: send multipart/form-data with the file(s) "
            f"in field '{IMAGE_FIELD}', or the raw image with an image/* Content-Type"
        )

    def canonical(self, inputs: ImageRequest) -> Sequence[BytesLike]:
        # The images' bytes in order (not the multipart framing or file names) and top_k.
        return [b"top_k=%d" % inputs.top_k, *inputs.images]

    def feeds(self, inputs: ImageRequest, model: ModelInfo) -> Feeds:
        return {self._input(model).name: self.pipeline.preprocess_batch(inputs.images, inputs.names)}

    def output_names(self, model: ModelInfo) -> Sequence[str]:
        return [self._output(model)]

    def reply(self, inputs: ImageRequest, outputs: Outputs) -> dict[str, Any]:
        result = np.asarray(next(iter(outputs.values())))
        k = min(inputs.top_k, int(result.shape[-1]) if result.ndim else 1)
        predictions = top_k(scores(result, self.settings.model.postprocess), k, self.labels)
        return {"model": self.settings.model.name, "predictions": predictions}

    def openapi(self, route: str) -> dict[str, Any]:
        binary = {"type": "string", "format": "binary"}
        prediction = {
            "type": "object",
            "required": ["label", "index", "score"],
            "properties": {
                "label": {"type": "string"},
                "index": {"type": "integer", "minimum": 0},
                "score": {"type": "number"},
            },
        }
        return {
            "summary": "Classify uploaded images: the top-k labels per image",
            "parameters": [
                {
                    "name": "top_k",
                    "in": "query",
                    "required": False,
                    "description": "Labels per image (default: [model] top_k).",
                    "schema": {"type": "integer", "minimum": 1},
                    "example": 3,
                }
            ],
            "requestBody": {
                "required": True,
                "content": {
                    "multipart/form-data": {
                        "schema": {
                            "type": "object",
                            "required": [IMAGE_FIELD],
                            "properties": {
                                IMAGE_FIELD: {
                                    "type": "array",
                                    "items": binary,
                                    "description": "One or more image files (JPEG, PNG, WebP, BMP, GIF, TIFF), "
                                    "run as one batch.",
                                },
                                "top_k": {
                                    "type": "integer",
                                    "minimum": 1,
                                    "description": "Same as the query parameter.",
                                    "example": 3,
                                },
                            },
                        }
                    },
                    "image/*": {"schema": binary},
                },
            },
            "responses": {
                "200": {
                    "description": "Top-k labels per image",
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "required": ["model", "predictions"],
                                "properties": {
                                    "model": {"type": "string"},
                                    "predictions": {
                                        "type": "array",
                                        "description": "One list per image, best first.",
                                        "items": {"type": "array", "items": prediction},
                                    },
                                },
                            }
                        }
                    },
                }
            },
        }


def _requested_top_k(request: RequestParts, default: int, fields: dict[str, str]) -> int:
    """`top_k` from the query or a form field, else the default (before clamping to the classes)."""
    raw = request.query.get("top_k") or fields.get("top_k")
    if raw is None:
        return default
    try:
        k = int(raw)
    except ValueError:
        raise BadRequest(f"top_k must be a positive integer, got {raw[:40]!r}") from None
    if k < 1:
        raise BadRequest(f"top_k must be a positive integer, got {k}")
    return k
