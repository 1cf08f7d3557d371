"""Image classification: upload photos, get labels (`/predict`, `/v2/models/{m}/classify`).

Accepts multipart/form-data with one or more files in the field `image`, or a raw
body whose Content-Type is `image/*`. All images of one request run as ONE batched
inference (in chunks of the model's batch size where that is fixed: zoo models often take
[1, 3, 224, 224]). Its `[task]` table (`tasks/image/settings.py`): preprocessing `[task.preprocess]`,
the scores `postprocess`, the class names `labels`, `top_k`, which tensors.

What the model's input shape tells is read from it (`onnxpool.tasks.image.fit`: channels first or
last, 1 or 3 channels, the size, a fixed batch), and `postprocess = "auto"` reads from the graph
whether its output already is probabilities; what the graph cannot tell, the task's own sample
photo does, in the master before any fork (`sample_request`, `rehearsed`: onnxpool.tasks.rehearsal).

`read_images` is public: a task of your own that takes uploaded photos (a detector,
docs/TASKS.md) reads them with it, and preprocesses them with `ImagePipeline`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from onnxpool.config.settings import LimitsSettings
from onnxpool.tasks.api import (
    BytesLike,
    Feeds,
    JsonDocument,
    Outputs,
    RequestParts,
    Runner,
    SampleRequest,
    ServedModel,
    Task,
    TaskConfigError,
)
from onnxpool.tasks.classes import ScoreMode, load_labels, scores, scores_from_graph, scores_from_rows
from onnxpool.tasks.errors import BadRequest, PayloadTooLarge
from onnxpool.tasks.image.fit import ImageInput, image_input
from onnxpool.tasks.image.imaging import ImagePipeline
from onnxpool.tasks.image.postprocess import top_k
from onnxpool.tasks.image.settings import ImageClassificationSettings
from onnxpool.tasks.logged import digest
from onnxpool.tasks.uploads import FileField, not_accepted, read_uploads
from onnxpool.workers.model_info import ModelInfo, TensorSpec

IMAGE_FIELD = "image"
SAMPLE_PHOTO = ("samples", "chelsea-cat.jpg")
"""The photo the task sends itself at start (the package's onnxpool/models/samples): a cat, 451x300 JPEG."""
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
        self.image: ImageInput | None = None
        """The model's image input as `bind` read it (layout, channels, size, fixed batch)."""
        self.score_mode: ScoreMode = "softmax" if settings.postprocess == "auto" else settings.postprocess
        self.score_why = "[task] postprocess"
        self._scores_undecided = False
        """postprocess "auto" that the graph could not tell: the sample's rows decide (`rehearsed`)."""

    def fingerprint(self) -> str:
        return "\n".join(self.labels) if self.labels is not None else ""

    def bind(self, model: ModelInfo) -> None:
        spec = self._input(model)
        try:
            self.image = image_input(spec, self.settings.preprocess)
        except TaskConfigError as exc:
            raise TaskConfigError(f"task {self.name}: {exc}") from None
        spec_of_model = self.image.spec(self.settings.preprocess)
        self.pipeline = ImagePipeline(spec_of_model, self.served.limits, self.image.channels)
        output = self._output(model)
        classes = output.shape[1] if len(output.shape) >= 2 else -1
        if self.labels is not None and classes > 0 and len(self.labels) != classes:
            raise TaskConfigError(
                f"labels file {self.labels_file} has {len(self.labels)} labels but output "
                f"'{output.name}' has {classes} classes"
            )
        self.input_name, self.output_name = spec.name, output.name
        if self.settings.postprocess == "auto":
            mode, why = scores_from_graph(model.made_by(output.name), output.name)
            self._scores_undecided = mode is None
            self.score_mode = mode or "softmax"
            self.score_why = why or f"output '{output.name}' taken as logits (no sample run told otherwise)"

    def sample_request(self) -> SampleRequest | None:
        photo = resources.files("onnxpool.models").joinpath(*SAMPLE_PHOTO).read_bytes()
        return SampleRequest(route=self.routes[0], content_type="image/jpeg", data=photo)

    def rehearsed(self, inputs: ImageRequest, result: Outputs) -> None:
        if self._scores_undecided:
            made_by = self.model.made_by(self.output_name)
            output = np.asarray(result[self.output_name])
            self.score_mode, self.score_why = scores_from_rows(output, self.output_name, made_by)
            self._scores_undecided = False

    def startup_lines(self) -> Sequence[str]:
        lines = [f"scores: {self.score_mode} ({self.score_why})"]
        image = self.image
        if image is not None:
            spec = self.pipeline.spec
            kind = "grey" if image.channels == 1 else spec.channel_order
            batch = f"; the model's batch is fixed at {image.batch}: run in chunks of it" if image.batch > 1 else ""
            batch = "; the model's batch is fixed at 1: images run one by one" if image.batch == 1 else batch
            lines.append(
                f"input '{self.input_name}': {image.layout} ({image.why}), {kind} {image.size}x{image.size} "
                f"(resize {spec.resize}, crop {spec.crop}), {spec.dtype}{batch}"
            )
        return lines

    def _input(self, model: ModelInfo) -> TensorSpec:
        return _named(model.inputs, self.settings.input_name, "input")

    def _output(self, model: ModelInfo) -> TensorSpec:
        return _named(model.outputs, self.settings.output_name, "output")

    def read(self, request: RequestParts) -> ImageRequest:
        uploads = read_images(request, self.served.limits)
        return ImageRequest(
            uploads.images, uploads.names, _requested_top_k(request, self.settings.top_k, uploads.fields)
        )

    def logged(self, inputs: ImageRequest) -> JsonDocument:
        # Each image's digest and size, not its bytes (an audit matches them to the caller's files).
        images = [{"name": name, **digest(image)} for name, image in zip(inputs.names, inputs.images, strict=True)]
        return {"images": images, "top_k": inputs.top_k}

    def canonical(self, inputs: ImageRequest) -> Sequence[BytesLike]:
        # The images' bytes in order (not the multipart framing or file names) and top_k.
        return [b"top_k=%d" % inputs.top_k, *inputs.images]

    def feeds(self, inputs: ImageRequest) -> Feeds:
        return {self.input_name: self.pipeline.preprocess_batch(inputs.images, inputs.names)}

    def run(self, inputs: ImageRequest, runner: Runner) -> Outputs:
        """One inference of all the images; for a model with a fixed batch size, one per chunk of that size
        (the last one padded with copies of its last image, whose rows are dropped), outputs concatenated.
        Splitting costs next to nothing: a chunk is a view of the preprocessed batch, and a batch-1 model
        runs an image per inference in about the time a batch of n spends per image."""
        with runner.phase("decode"):
            batch = self.pipeline.preprocess_batch(inputs.images, inputs.names)
        size = self.image.batch if self.image is not None else 0
        if not size or len(batch) == size:
            return runner.infer({self.input_name: batch}, [self.output_name])
        parts = []
        for start in range(0, len(batch), size):
            chunk = batch[start : start + size]
            real = len(chunk)
            if real < size:
                chunk = np.concatenate([chunk, np.repeat(chunk[-1:], size - real, axis=0)])
            outputs = runner.infer({self.input_name: chunk}, [self.output_name])
            parts.append(np.asarray(outputs[self.output_name])[:real])
        return {self.output_name: np.concatenate(parts)}

    def output_names(self) -> Sequence[str]:
        return [self.output_name]

    def class_names(self) -> Sequence[str] | None:
        return self.labels

    def reply(self, inputs: ImageRequest, result: Outputs) -> dict[str, Any]:
        output = np.asarray(result[self.output_name])
        k = min(inputs.top_k, int(output.shape[-1]) if output.ndim else 1)
        predictions = top_k(scores(output, self.score_mode), k, self.labels)
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
