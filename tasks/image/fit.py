"""How an image model's input shape shapes the preprocessing: layout, channels, size, batch.

Zoo and Keras exports come channels-last ([N, H, W, 3], tf2onnx), grey ([N, 1, 28, 28], MNIST),
with a fixed batch ([1, 3, 224, 224]) or with dynamic height and width ([N, 3, h, w]). The task
reads what the shape tells and takes from `[task.preprocess]` only what it cannot tell; a shape
no setting makes an image input is one TaskConfigError line naming the input and the settings.
Pure: no onnxruntime, no I/O (`bind` runs it in the master).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from onnxpool.tasks.api import TaskConfigError
from onnxpool.tasks.image.settings import PreprocessSettings
from onnxpool.workers.model_info import TensorSpec

CHANNELS = (1, 3)
"""Grey or colour: what a photo becomes (an alpha channel is composited away, tasks/image/imaging.py)."""
TORCHVISION_RATIO = 256 / 224
"""Resize 256 for a 224 crop: the shorter side is resized by this over the crop (torchvision's eval)."""
_DTYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(uint8)": "uint8"}


@dataclass(frozen=True)
class ImageInput:
    """What the model's image input takes, settled from its shape and `[task.preprocess]`."""

    layout: Literal["NCHW", "NHWC"]
    channels: int
    size: int
    """The crop: height = width = size."""
    batch: int
    """The model's fixed batch size, or 0 when its first dimension is dynamic."""
    dtype: Literal["float32", "float16", "uint8"]
    why: str
    """How layout and channels were told, for the start-up line."""

    def spec(self, settings: PreprocessSettings) -> PreprocessSettings:
        """`settings` with this input's layout and size (its resize scaled along when it was not set)."""
        update: dict[str, object] = {"layout": self.layout, "crop": self.size, "dtype": self.dtype}
        if "resize" not in settings.model_fields_set:
            update["resize"] = max(self.size, round(self.size * TORCHVISION_RATIO))
        elif settings.resize < self.size:
            update["resize"] = self.size
        return settings.model_copy(update=update)


def image_input(spec: TensorSpec, settings: PreprocessSettings) -> ImageInput:
    """The image input `spec` describes (see the module doc), or TaskConfigError saying what does not fit."""
    shape = list(spec.shape)
    shown = "[" + ", ".join("N" if i == 0 and d < 0 else ("?" if d < 0 else str(d)) for i, d in enumerate(shape)) + "]"
    where = f"input '{spec.name}' {shown}"
    fix = 'set [task] input_name to the image input, or [model] task = "tensors" to send tensors as they are'
    if len(shape) != 4:
        raise TaskConfigError(
            f"{where} is not an image input: an image input is 4-dimensional, [N, C, H, W] or [N, H, W, C] "
            f"with C = 1 or 3 ({fix})"
        )
    if spec.onnx_type not in _DTYPES:
        raise TaskConfigError(f"{where} takes {spec.onnx_type}; an image input takes float, float16 or uint8 ({fix})")
    dtype: Literal["float32", "float16", "uint8"] = _DTYPES[spec.onnx_type]  # type: ignore[assignment]
    if settings.dtype != dtype and "dtype" in settings.model_fields_set:
        raise TaskConfigError(f"{where} takes {spec.onnx_type} but [task.preprocess] dtype is {settings.dtype!r}")
    layout, why = _layout(shape, settings, where, fix)
    c, h, w = (shape[1], shape[2], shape[3]) if layout == "NCHW" else (shape[3], shape[1], shape[2])
    channels = c if c in CHANNELS else 3
    if c > 0 and c not in CHANNELS:
        raise TaskConfigError(
            f"{where} has {c} channels in layout {layout}: an image input has 1 (grey) or 3 (colour) ({fix})"
        )
    size = _size(h, w, settings, where)
    return ImageInput(layout, channels, size, max(shape[0], 0), dtype, why)


def _layout(
    shape: list[int], settings: PreprocessSettings, where: str, fix: str
) -> tuple[Literal["NCHW", "NHWC"], str]:
    first, last = shape[1] in CHANNELS, shape[3] in CHANNELS
    if settings.layout != "auto":
        return settings.layout, "[task.preprocess] layout"
    if first and not last:
        return "NCHW", f"{_channels(shape[1])} first"
    if last and not first:
        return "NHWC", f"{_channels(shape[3])} last"
    if shape[1] < 0 and shape[3] < 0:
        raise TaskConfigError(
            f'{where}: its shape does not tell where the channels are; set [task.preprocess] layout = "NCHW" or "NHWC"'
        )
    if first and last:  # [N, 3, H, 3]: a 3-pixel-wide image is no image; channels first is the ONNX default
        return "NCHW", f"{_channels(shape[1])} first"
    if shape[1] < 0 or shape[3] < 0:  # one end dynamic, the other not a channel count: that end is C
        return ("NCHW", "dynamic channels first") if shape[1] < 0 else ("NHWC", "dynamic channels last")
    raise TaskConfigError(
        f"{where} is not an image input: neither its second nor its last dimension is 1 or 3 channels ({fix})"
    )


def _channels(count: int) -> str:
    return "1 channel" if count == 1 else f"{count} channels"


def _size(h: int, w: int, settings: PreprocessSettings, where: str) -> int:
    """The crop: the model's fixed height = width, else [task.preprocess] crop."""
    fixed = [d for d in (h, w) if d > 0]
    if not fixed:
        return settings.crop  # dynamic height and width: the size this task crops to
    if len(fixed) == 2 and h != w:
        raise TaskConfigError(
            f"{where} takes {h}x{w} images; the task crops squares: serve it with a task of your own "
            "(docs/TASKS.md) or export the model with a square input"
        )
    size = fixed[0]
    if "crop" in settings.model_fields_set and settings.crop != size:
        raise TaskConfigError(
            f"{where} takes {size}x{size} images but [task.preprocess] crop is {settings.crop}: "
            f"set crop = {size} (or leave it out)"
        )
    return size
