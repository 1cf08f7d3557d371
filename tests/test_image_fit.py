"""What the image task reads from an input shape (tasks/image/fit.py), and how scores are chosen
(tasks/classes.py): pure functions, no model."""

from __future__ import annotations

import numpy as np
import pytest

from onnxpool.tasks.api import TaskConfigError
from onnxpool.tasks.classes import scores_from_graph, scores_from_rows
from onnxpool.tasks.image.fit import image_input
from onnxpool.tasks.image.settings import PreprocessSettings
from onnxpool.workers.model_info import TensorSpec

DEFAULTS = PreprocessSettings()


@pytest.mark.parametrize(
    ("shape", "layout", "channels", "size", "batch"),
    [
        ((-1, 3, 224, 224), "NCHW", 3, 224, 0),
        ((-1, 224, 224, 3), "NHWC", 3, 224, 0),
        ((1, 3, 224, 224), "NCHW", 3, 224, 1),
        ((-1, 3, -1, -1), "NCHW", 3, 224, 0),
        ((-1, -1, -1, 3), "NHWC", 3, 224, 0),
        ((1, 1, 28, 28), "NCHW", 1, 28, 1),
        ((-1, 28, 28, 1), "NHWC", 1, 28, 0),
        ((4, 3, 300, 300), "NCHW", 3, 300, 4),
    ],
)
def test_the_shape_tells_layout_channels_size_and_batch(
    shape: tuple[int, ...], layout: str, channels: int, size: int, batch: int
) -> None:
    image = image_input(TensorSpec("x", "tensor(float)", shape), DEFAULTS)
    assert (image.layout, image.channels, image.size, image.batch) == (layout, channels, size, batch)
    spec = image.spec(DEFAULTS)
    assert spec.crop == size and spec.layout == layout
    assert spec.resize == max(size, round(size * 256 / 224))


def test_settings_say_what_the_shape_cannot() -> None:
    spec = TensorSpec("x", "tensor(float)", (-1, -1, -1, -1))
    with pytest.raises(TaskConfigError, match=r'set \[task.preprocess\] layout = "NCHW" or "NHWC"'):
        image_input(spec, DEFAULTS)
    image = image_input(spec, PreprocessSettings(layout="NHWC", crop=160, resize=180))
    assert (image.layout, image.size, image.spec(PreprocessSettings(layout="NHWC", crop=160, resize=180)).resize) == (
        "NHWC",
        160,
        180,
    )
    assert image_input(TensorSpec("x", "tensor(uint8)", (-1, 3, 64, 64)), DEFAULTS).dtype == "uint8"


@pytest.mark.parametrize(
    ("shape", "settings", "message"),
    [
        ((-1, 10), DEFAULTS, r"input 'x' \[N, 10\] is not an image input: an image input is 4-dimensional"),
        ((-1, 5, 32, 32), DEFAULTS, r"input 'x' \[N, 5, 32, 32\] is not an image input"),
        ((-1, 3, 32, 32), PreprocessSettings(crop=28), r"\[task.preprocess\] crop is 28: set crop = 32"),
        ((-1, 3, 32, 48), DEFAULTS, r"takes 32x48 images; the task crops squares"),
        ((-1, 4, 32, 32), PreprocessSettings(layout="NCHW"), r"has 4 channels in layout NCHW"),
    ],
)
def test_a_shape_no_setting_fits_is_one_line_naming_the_input(
    shape: tuple[int, ...], settings: PreprocessSettings, message: str
) -> None:
    with pytest.raises(TaskConfigError, match=message):
        image_input(TensorSpec("x", "tensor(float)", shape), settings)


def test_one_mean_for_a_grey_model() -> None:
    assert DEFAULTS.per_channel(1) == ((127.0,), (128.0,))
    assert PreprocessSettings(mean=(0.5,), std=(0.25,)).per_channel(3) == ((0.5,) * 3, (0.25,) * 3)


def test_scores_from_the_graph_then_from_the_rows() -> None:
    assert scores_from_graph("Softmax", "p")[0] == "none"
    assert scores_from_graph("Sigmoid", "p")[0] == "none"
    assert scores_from_graph("Gemm", "logits") == (None, "")
    probabilities = np.asarray([[0.7, 0.2, 0.1]], np.float32)
    assert scores_from_rows(probabilities, "p")[0] == "none"
    assert scores_from_rows(np.asarray([[2.0, -1.0, 0.5]]), "logits", "Gemm") == (
        "softmax",
        "output 'logits', made by Gemm: its rows on the task's sample do not sum to 1, logits",
    )
