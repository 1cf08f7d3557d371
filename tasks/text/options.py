"""The `[task]` table of a text-embedding model's settings file (config/minilm.toml).

Flat, every key optional, "auto" meaning "what the model's own files say" (TOML has no null).
The task (`onnxpool.tasks.text.embedding.TextEmbedding`) reads the model folder's files with it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import StrictBool

from onnxpool.tasks.text.base import TextSettings

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
