"""The image task's `[task]` table: class names, scores, top-k, which tensors, and preprocessing.

These keys were `[model]`'s before tasks had tables of their own; a settings file that still has
them there loads, with one warning line per key naming its new place (`onnxpool.config.loader`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from onnxpool.config.loader import LoadedSettings
from onnxpool.tasks.api import TaskSettings
from onnxpool.tasks.registry import validate_task_table


class PreprocessSettings(TaskSettings):
    """`[task.preprocess]`: how an uploaded image becomes the model's input tensor.

    normalised = (pixel * scale - mean) / std, per channel, in `channel_order`.

    The image's geometry, layout and channel count come from the model where its input shape
    tells them (`onnxpool.tasks.image.fit`); these keys say what the shape cannot.
    """

    resize: int = Field(default=256, ge=1)
    """Resize so the shorter side is this many pixels (keeps the aspect ratio). Unset, for a model with a
    fixed input size other than 224: that size x 256/224 (torchvision's ratio)."""

    crop: int = Field(default=224, ge=1)
    """Centre crop to crop x crop pixels after the resize: the model's height and width. Unset, a model
    with a fixed square input size is fed that size; a model with dynamic height and width gets this."""

    mean: tuple[float, float, float] | tuple[float] = (127.0, 127.0, 127.0)
    """Per-channel mean subtracted after scaling (in channel_order); one value = the same for every
    channel. A grey (1-channel) model uses one value (the average of three)."""

    std: tuple[float, float, float] | tuple[float] = (128.0, 128.0, 128.0)
    """Per-channel divisor after the mean (in channel_order); one value = the same for every channel."""

    scale: float = Field(default=1.0, gt=0)
    """Pixel values (0..255) are multiplied by this first (e.g. 1/255)."""

    layout: Literal["auto", "NCHW", "NHWC"] = "auto"
    """Tensor layout the model expects: "auto" reads it from the input's shape ([N, 3, H, W] or
    [N, H, W, 3]; 1 channel for grey); set it where the shape cannot tell (e.g. [N, ?, ?, ?])."""

    channel_order: Literal["RGB", "BGR"] = "RGB"
    """Channel order the model expects."""

    dtype: Literal["float32", "float16", "uint8"] = "float32"
    """Element type of the input tensor."""

    resample: Literal["bilinear", "bicubic", "nearest", "lanczos"] = "bilinear"
    """Resampling filter for the resize."""

    @field_validator("std")
    @classmethod
    def _nonzero_std(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if any(v == 0 for v in value):
            raise ValueError("std values must be non-zero")
        return value

    @model_validator(mode="after")
    def _crop_fits(self) -> PreprocessSettings:
        if self.crop > self.resize:
            raise ValueError(f"crop ({self.crop}) must not exceed resize ({self.resize})")
        return self

    def per_channel(self, channels: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """(mean, std) with one value per channel of a model with `channels` (1 or 3) channels."""
        return _per_channel(self.mean, channels), _per_channel(self.std, channels)


def _per_channel(values: tuple[float, ...], channels: int) -> tuple[float, ...]:
    if len(values) == channels:
        return values
    if channels == 1:  # a grey pixel mixes the three: so does its mean (ImageNet's 3 means on a grey model)
        return (sum(values) / len(values),)
    return values * channels


class ImageClassificationSettings(TaskSettings):
    """`[task]` of `[model] task = "image-classification"`."""

    labels: Literal["auto"] | Path | None = "auto"
    """UTF-8 file with one class name per line, in output-index order; "auto" = `labels.txt` beside
    the model file if there is one; "" = none (classes are named by their indices)."""
    input_name: str = ""
    """The image input ("" = the model's first input)."""
    output_name: str = ""
    """The score output ("" = the model's first output)."""
    postprocess: Literal["auto", "softmax", "sigmoid", "none"] = "auto"
    """What turns the output into scores: softmax (logits), sigmoid (multi-label), none (already scores).
    "auto": none when the model's output is made by a Softmax or Sigmoid node, or when its rows on the
    task's own sample photo already sum to 1; softmax otherwise (the start-up log says which and why)."""
    top_k: int = Field(default=5, ge=1)
    """Default number of labels returned per image (a request may ask for another with `top_k`)."""
    preprocess: PreprocessSettings = PreprocessSettings()
    """How an uploaded image becomes the model's input tensor."""

    @field_validator("labels", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if value == "" else value


def image_settings(loaded: LoadedSettings) -> ImageClassificationSettings:
    """The image task's `[task]` table of these settings: for the tools that prepare images as the
    server does (`onnxpool quantize`, `onnxpool bench`), whatever `[model] task` says."""
    return validate_task_table(ImageClassificationSettings, "image-classification", loaded)
