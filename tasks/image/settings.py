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
    """

    resize: int = Field(default=256, ge=1)
    """Resize so the shorter side is this many pixels (keeps the aspect ratio)."""

    crop: int = Field(default=224, ge=1)
    """Centre crop to crop x crop pixels after the resize."""

    mean: tuple[float, float, float] = (127.0, 127.0, 127.0)
    """Per-channel mean subtracted after scaling (in channel_order)."""

    std: tuple[float, float, float] = (128.0, 128.0, 128.0)
    """Per-channel divisor after the mean (in channel_order)."""

    scale: float = Field(default=1.0, gt=0)
    """Pixel values (0..255) are multiplied by this first (e.g. 1/255)."""

    layout: Literal["NCHW", "NHWC"] = "NCHW"
    """Tensor layout the model expects."""

    channel_order: Literal["RGB", "BGR"] = "RGB"
    """Channel order the model expects."""

    dtype: Literal["float32", "float16", "uint8"] = "float32"
    """Element type of the input tensor."""

    resample: Literal["bilinear", "bicubic", "nearest", "lanczos"] = "bilinear"
    """Resampling filter for the resize."""

    @field_validator("std")
    @classmethod
    def _nonzero_std(cls, value: tuple[float, float, float]) -> tuple[float, float, float]:
        if any(v == 0 for v in value):
            raise ValueError("std values must be non-zero")
        return value

    @model_validator(mode="after")
    def _crop_fits(self) -> PreprocessSettings:
        if self.crop > self.resize:
            raise ValueError(f"crop ({self.crop}) must not exceed resize ({self.resize})")
        return self


class ImageClassificationSettings(TaskSettings):
    """`[task]` of `[model] task = "image-classification"`."""

    labels: Literal["auto"] | Path | None = "auto"
    """UTF-8 file with one class name per line, in output-index order; "auto" = `labels.txt` beside
    the model file if there is one; "" = none (classes are named by their indices)."""
    input_name: str = ""
    """The image input ("" = the model's first input)."""
    output_name: str = ""
    """The score output ("" = the model's first output)."""
    postprocess: Literal["softmax", "sigmoid", "none"] = "softmax"
    """What turns the output into scores: softmax (logits), sigmoid (multi-label), none."""
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
