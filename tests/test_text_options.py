"""The `[task]` table proposed for text-embedding models, and the shipped config/minilm.toml."""

from __future__ import annotations

import tomllib

import pytest
from pydantic import ValidationError

from onnxpool.tasks.text.options import TASK_NAME, TextEmbeddingOptions
from tests.harness import REPO


def test_minilm_toml_task_table_is_valid() -> None:
    document = tomllib.loads((REPO / "config" / "minilm.toml").read_text())
    assert document["model"]["task"] == TASK_NAME
    assert document["model"]["path"] == "../models/minilm/model.onnx"
    options = TextEmbeddingOptions.model_validate(document["task"])
    assert options.pooling == "auto" and options.normalize == "auto" and options.max_length == "auto"
    assert options.truncate is False and options.dimensions is False
    assert options.sub_batch == 8 and options.max_batch == 2048 and options.sub_batch_tokens == 512


def test_defaults_and_refusals() -> None:
    assert TextEmbeddingOptions() == TextEmbeddingOptions.model_validate({})
    for bad in (
        {"pooling": "weighted"},
        {"normalize": "yes"},
        {"sub_batch": -1},
        {"max_batch": 0},
        {"typo": 1},
        {"max_length": 1},
        {"truncate": "no"},
    ):
        with pytest.raises(ValidationError):
            TextEmbeddingOptions.model_validate(bad)
