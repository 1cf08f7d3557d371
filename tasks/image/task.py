"""Image classification: upload photos, get labels (`/predict`, `/v2/models/{m}/classify`).

Accepts multipart/form-data with one or more files in the field `image`, or a raw
body whose Content-Type is `image/*`. All images of one request run as ONE batched
inference. Its `[task]` table (`tasks/image/settings.py`): preprocessing `[task.preprocess]`,
the scores `postprocess`, the class names `labels`, `top_k`, which tensors.

`read_images` is public: a task of your own that takes uploaded photos (a detector,
docs/TASKS.md) reads them with it, and preprocesses them with `ImagePipeline`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from onnxpool.config.settings import LimitsSettings
from onnxpool.tasks.api import BytesLike, Feeds, Outputs, RequestParts, ServedModel, Task, TaskConfigError
from onnxpool.tasks.classes import load_labels, scores
from onnxpool.tasks.errors import BadRequest, PayloadTooLarge
from onnxpool.tasks.image.imaging import ImagePipeline
from onnxpool.tasks.image.postprocess import top_k
from onnxpool.tasks.image.settings import ImageClassificationSettings
from onnxpool.tasks.uploads import FileField, not_accepted, read_uploads
from onnxpool.workers.model_info import ModelInfo, TensorSpec

IMAGE_FIELD = "image"
IMAGE_TYPES = ("image/*",)


@dataclass(frozen=True)
class ImageUploads:
    """The images of one request, a name for each (for error messages), and its other form fields."""

    images: list[bytes]
    names: list[str]
    fields: dict[str, str]


@functools.cache
def _image_field(max_images: int) -> FileField:
    return FileField(IMAGE_FIELD, media_types=IMAGE_TYPES, max_files=max_images, noun="images")


def image_field(limits: LimitsSettings) -> FileField:
    """The field `image`: at most `[limits] max_images` files, of any image type (made once per limit:
    this is on every request's path, a cache hit's too)."""
    return _image_field(limits.max_images)


def read_images(request: RequestParts, limits: LimitsSettings) -> ImageUploads:
    """The uploaded images: multipart files in field `image`, or a raw `image/*` body (4xx otherwise).

    At most `[limits] max_images` files and `max_batch` images; each image's bytes are checked
    when `ImagePipeline` decodes them.
    """
    uploads = read_uploads(request, image_field(limits))
    files = uploads.files[IMAGE_FIELD]
    if len(files) > limits.max_batch:
        raise PayloadTooLarge(f"{len(files)} images in one request; max_batch is {limits.max_batch}")
    return ImageUploads([upload.data for upload in files], [upload.name for upload in files], uploads.fields)


LABELS_BESIDE_MODEL = "labels.txt"


def labels_file(setting: Path | str | None, model: Path) -> Path | None:
    """The labels file `[task] labels` names: "auto" = labels.txt beside the model, if there is one."""
    if setting != "auto":
        return Path(setting) if setting is not None else None
    beside = model.parent / LABELS_BESIDE_MODEL
    return beside if beside.is_file() else None


@dataclass(frozen=True)
class ImageRequest:
    """What an image request asks: its images (with a name for each, for error messages) and top_k."""

    images: list[bytes]
    names: list[str]
    top_k: int
    """As asked (or the default), before clamping to the model's number of classes."""


class ImageClassification(Task[ImageRequest, Outputs, ImageClassificationSettings]):
    """ImageNet-style classifiers: one image tensor in, class scores out."""

    name = "image-classification"
    settings_model = ImageClassificationSettings
    routes = ("/predict", "/v2/models/<model>/classify")
    content_types = ("multipart/form-data", *IMAGE_TYPES)

    def __init__(self, settings: ImageClassificationSettings, served: ServedModel) -> None:
        super().__init__(settings, served)
        self.pipeline = ImagePipeline(settings.preprocess, served.limits)
        self.labels_file = labels_file(settings.labels, served.path)
        self.labels = load_labels(self.labels_file) if self.labels_file is not None else None
        """Class names in output-index order ([task] labels), read once, in the master."""
        self.input_name = ""
        self.output_name = ""

    def fingerprint(self) -> str:
        return "\n".join(self.labels) if self.labels is not None else ""

    def bind(self, model: ModelInfo) -> None:
        spec = self._input(model)
        if len(spec.shape) != 4:
            raise TaskConfigError(
                f"task {self.name}: input '{spec.name}' has shape {list(spec.shape)}; an image input is "
                "4-dimensional (batch, and channels/height/width in [task.preprocess] layout)"
            )
        output = self._output(model)
        classes = output.shape[1] if len(output.shape) >= 2 else -1
        if self.labels is not None and classes > 0 and len(self.labels) != classes:
            raise TaskConfigError(
                f"labels file {self.labels_file} has {len(self.labels)} labels but output "
                f"'{output.name}' has {classes} classes"
            )
        self.input_name, self.output_name = spec.name, output.name

    def _input(self, model: ModelInfo) -> TensorSpec:
        return _named(model.inputs, self.settings.input_name, "input")

    def _output(self, model: ModelInfo) -> TensorSpec:
        return _named(model.outputs, self.settings.output_name, "output")

    def read(self, request: RequestParts) -> ImageRequest:
        uploads = read_images(request, self.served.limits)
        return ImageRequest(
            uploads.images, uploads.names, _requested_top_k(request, self.settings.top_k, uploads.fields)
        )

    def canonical(self, inputs: ImageRequest) -> Sequence[BytesLike]:
        # The images' bytes in order (not the multipart framing or file names) and top_k.
        return [b"top_k=%d" % inputs.top_k, *inputs.images]

    def feeds(self, inputs: ImageRequest) -> Feeds:
        return {self.input_name: self.pipeline.preprocess_batch(inputs.images, inputs.names)}

    def output_names(self) -> Sequence[str]:
        return [self.output_name]

    def class_names(self) -> Sequence[str] | None:
        return self.labels

    def reply(self, inputs: ImageRequest, result: Outputs) -> dict[str, Any]:
        output = np.asarray(result[self.output_name])
        k = min(inputs.top_k, int(output.shape[-1]) if output.ndim else 1)
        predictions = top_k(scores(output, self.settings.postprocess), k, self.labels)
        return {"model": self.served.name, "predictions": predictions}

    def not_accepted(self, request: RequestParts) -> str:
        return not_accepted(request.mimetype, [image_field(self.served.limits)])

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
                    "description": "Labels per image (default: [task] top_k).",
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


def _named(specs: tuple[TensorSpec, ...], name: str, kind: str) -> TensorSpec:
    """The tensor `[task] {kind}_name` names ("" = the first); TaskConfigError naming the model's own."""
    spec = next((t for t in specs if t.name == name), None) if name else specs[0]
    if spec is None:
        known = ", ".join(t.name for t in specs)
        raise TaskConfigError(f"task.{kind}_name = {name!r} is not an {kind} of the model; {kind}s: {known}")
    return spec


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
