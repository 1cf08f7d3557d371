"""The `[task]` table of a text-embedding model's settings file (config/minilm.toml).

Flat, every key optional, "auto" meaning "what the model's own files say" (TOML has no null).
`resolve` turns it plus the model folder into the objects the building blocks take.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import StrictBool

from onnxpool.tasks.text.base import TextSettings
from onnxpool.tasks.text.pooling import PoolingMode, PoolingSpec
from onnxpool.tasks.text.tokenizing import KNOWN_INPUTS, TextTokenizer, model_max_length

TASK_NAME = "text-embedding"


class TextEmbeddingOptions(TextSettings):
    """`[task]` for `[model] task = "text-embedding"` (with max_length, truncate, max_batch, sub_batch)."""

    pooling: Literal["auto", "mean", "cls", "lasttoken", "max"] = "auto"
    """auto = 1_Pooling/config.json (mean without it)."""
    normalize: Literal["auto"] | StrictBool = "auto"
    """auto = L2-normalise when the model has sentence-transformers' Normalize module."""
    dimensions: StrictBool = False
    """Accept OpenAI's `dimensions` (cut, then re-normalise): only for Matryoshka-trained models."""
    output: str = "last_hidden_state"
    """The model output holding the token embeddings [N, T, D]."""


@dataclass(frozen=True)
class TextEmbeddingTask:
    """Everything a worker needs for the task, resolved against the model folder."""

    tokenizer: TextTokenizer
    pooling: PoolingSpec
    options: TextEmbeddingOptions

    @property
    def sub_batch(self) -> int | None:
        return self.options.sub_batch or None

    @property
    def sub_batch_tokens(self) -> int | None:
        return self.options.sub_batch_tokens or None


def resolve(
    options: TextEmbeddingOptions, folder: Path, input_names: tuple[str, ...] = KNOWN_INPUTS
) -> TextEmbeddingTask:
    """Read the model folder's tokenizer and sentence-transformers files; explicit options win."""
    max_length = model_max_length(folder) if options.max_length == "auto" else options.max_length
    tokenizer = TextTokenizer.from_folder(folder, input_names, max_length)
    spec = PoolingSpec.from_folder(folder).with_overrides(
        mode=None if options.pooling == "auto" else PoolingMode(options.pooling),
        normalize=None if options.normalize == "auto" else bool(options.normalize),
        allow_dimensions=options.dimensions,
    )
    return TextEmbeddingTask(tokenizer=tokenizer, pooling=spec, options=options)
