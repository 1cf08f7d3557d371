"""`[model] memory_arena`: which models give their onnxruntime arena back after each run."""

from __future__ import annotations

import pytest

from onnxpool.workers.model_info import ModelInfo, TensorSpec
from onnxpool.workers.session import ArenaMode, releases_arena

IMAGE = ModelInfo(inputs=(TensorSpec("input", "tensor(float)", (-1, 3, 224, 224)),), outputs=())
TEXT = ModelInfo(
    inputs=(
        TensorSpec("input_ids", "tensor(int64)", (-1, -1)),
        TensorSpec("attention_mask", "tensor(int64)", (-1, -1)),
    ),
    outputs=(),
)
FIXED = ModelInfo(inputs=(TensorSpec("x", "tensor(float)", (1, 4)),), outputs=())


@pytest.mark.parametrize(
    ("mode", "info", "released"),
    [
        ("auto", IMAGE, False),  # only the batch varies: every run needs the same memory
        ("auto", FIXED, False),
        ("auto", TEXT, True),  # tokens vary: one long request would pin its memory for good
        ("keep", TEXT, False),
        ("release", IMAGE, True),
    ],
)
def test_auto_releases_only_when_a_non_batch_dimension_varies(mode: ArenaMode, info: ModelInfo, released: bool) -> None:
    assert releases_arena(mode, info) is released
