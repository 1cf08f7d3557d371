"""Token embeddings [N, T, D] + attention mask [N, T] -> one vector per input [N, D], numpy only.

How to pool is the model's decision, read from its sentence-transformers files:
`1_Pooling/config.json` (`pooling_mode_mean_tokens`, `pooling_mode_cls_token`,
`pooling_mode_lasttoken`, `pooling_mode_max_tokens`, or the newer `pooling_mode` string);
without that file, mean pooling (what sentence-transformers does for a plain encoder).
L2 normalisation when the model has a Normalize module: a `2_Normalize` folder, or a
`sentence_transformers.models.Normalize` entry in `modules.json` (the all-MiniLM-L6-v2
package lists it there but ships no folder: the module has no files).

Padding never counts: every mode uses the attention mask, so a row's vector does not
depend on how long the other inputs of its batch were.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path

import numpy as np

POOLING_CONFIG = Path("1_Pooling") / "config.json"
NORMALIZE_FOLDER = "2_Normalize"
MODULES_FILE = "modules.json"
NORMALIZE_MODULE = "sentence_transformers.models.Normalize"
# torch.nn.functional.normalize's default eps: a zero vector stays zero instead of NaN.
NORM_EPS = 1e-12
# sentence-transformers' floor for the token count of mean pooling.
COUNT_EPS = 1e-9


class PoolingMode(StrEnum):
    """How token vectors become one vector."""

    MEAN = "mean"
    CLS = "cls"
    LASTTOKEN = "lasttoken"
    MAX = "max"


# 1_Pooling/config.json's boolean keys, by mode.
_CONFIG_FLAGS: dict[str, PoolingMode] = {
    "pooling_mode_mean_tokens": PoolingMode.MEAN,
    "pooling_mode_cls_token": PoolingMode.CLS,
    "pooling_mode_lasttoken": PoolingMode.LASTTOKEN,
    "pooling_mode_max_tokens": PoolingMode.MAX,
}
_UNSUPPORTED_FLAGS = ("pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens")
_MODE_NAMES: dict[str, PoolingMode] = {
    "mean": PoolingMode.MEAN,
    "cls": PoolingMode.CLS,
    "lasttoken": PoolingMode.LASTTOKEN,
    "max": PoolingMode.MAX,
}


class DimensionsError(ValueError):
    """A requested `dimensions` the model does not allow (an HTTP 400)."""


@dataclass(frozen=True)
class PoolingSpec:
    """What `pool` does: the mode, whether to L2-normalise, and whether `dimensions` may cut."""

    mode: PoolingMode = PoolingMode.MEAN
    normalize: bool = False
    allow_dimensions: bool = False

    @classmethod
    def from_folder(cls, folder: Path, *, allow_dimensions: bool = False) -> PoolingSpec:
        """The model's own pooling and normalisation, from its sentence-transformers files."""
        return cls(mode=pooling_mode_of(folder), normalize=normalizes(folder), allow_dimensions=allow_dimensions)

    def with_overrides(
        self, mode: PoolingMode | None = None, normalize: bool | None = None, allow_dimensions: bool | None = None
    ) -> PoolingSpec:
        """This spec with the settings' explicit choices (None = keep the model's)."""
        return replace(
            self,
            mode=self.mode if mode is None else mode,
            normalize=self.normalize if normalize is None else normalize,
            allow_dimensions=self.allow_dimensions if allow_dimensions is None else allow_dimensions,
        )


def pooling_mode_of(folder: Path) -> PoolingMode:
    """The mode of `folder/1_Pooling/config.json`; MEAN when there is no such file."""
    path = folder / POOLING_CONFIG
    if not path.is_file():
        return PoolingMode.MEAN
    config = json.loads(path.read_text())
    if isinstance(config.get("pooling_mode"), str):
        name = config["pooling_mode"]
        if name not in _MODE_NAMES:
            raise ValueError(f"{path}: pooling_mode {name!r} is not supported (supported: {sorted(_MODE_NAMES)})")
        return _MODE_NAMES[name]
    unsupported = [key for key in _UNSUPPORTED_FLAGS if config.get(key)]
    chosen = [mode for key, mode in _CONFIG_FLAGS.items() if config.get(key)]
    if unsupported or len(chosen) != 1:
        raise ValueError(
            f"{path}: exactly one of {sorted(_CONFIG_FLAGS)} must be true (found {sorted(chosen) + unsupported})"
        )
    return chosen[0]


def normalizes(folder: Path) -> bool:
    """Whether the model ends in sentence-transformers' Normalize module."""
    if (folder / NORMALIZE_FOLDER).is_dir():
        return True
    modules = folder / MODULES_FILE
    if modules.is_file():
        entries = json.loads(modules.read_text())
        return any(isinstance(e, dict) and e.get("type") == NORMALIZE_MODULE for e in entries)
    return False


def pool(token_embeddings: np.ndarray, attention_mask: np.ndarray, mode: PoolingMode) -> np.ndarray:
    """[N, T, D] float + [N, T] mask (1 = token, 0 = padding) -> [N, D] float32.

    Assumes right padding (the tokenizer's), except LASTTOKEN, which takes the last
    position whose mask is 1 wherever the padding is.
    """
    if token_embeddings.ndim != 3 or attention_mask.shape != token_embeddings.shape[:2]:
        raise ValueError(f"embeddings {token_embeddings.shape} and mask {attention_mask.shape} do not match")
    x = token_embeddings.astype(np.float32, copy=False)
    mask = attention_mask.astype(np.float32)
    if mode is PoolingMode.MEAN:
        summed = np.einsum("ntd,nt->nd", x, mask)
        counts = np.maximum(mask.sum(axis=1, keepdims=True), COUNT_EPS)
        return np.asarray(summed / counts, dtype=np.float32)
    if mode is PoolingMode.CLS:
        return np.ascontiguousarray(x[:, 0, :])
    if mode is PoolingMode.LASTTOKEN:
        width = attention_mask.shape[1]
        last = width - 1 - np.argmax(attention_mask[:, ::-1] != 0, axis=1)
        return np.ascontiguousarray(x[np.arange(x.shape[0]), last, :])
    masked = np.where(mask[:, :, None] > 0, x, np.float32(-1e9))
    return np.asarray(masked.max(axis=1), dtype=np.float32)


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    """Each row divided by its L2 norm (at least NORM_EPS), as torch's F.normalize."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return np.asarray(vectors / np.maximum(norms, NORM_EPS), dtype=np.float32)


def cut_dimensions(vectors: np.ndarray, dimensions: int, *, normalize: bool) -> np.ndarray:
    """Matryoshka-style: the first `dimensions` components, re-normalised when the model normalises."""
    full = vectors.shape[1]
    if not 1 <= dimensions <= full:
        raise DimensionsError(f"dimensions must be between 1 and {full}, got {dimensions}")
    cut = np.ascontiguousarray(vectors[:, :dimensions])
    return l2_normalize(cut) if normalize else cut


def embed(
    token_embeddings: np.ndarray, attention_mask: np.ndarray, spec: PoolingSpec, dimensions: int | None = None
) -> np.ndarray:
    """Pool, normalise as the model says, and cut to `dimensions` when asked and allowed."""
    vectors = pool(token_embeddings, attention_mask, spec.mode)
    if spec.normalize:
        vectors = l2_normalize(vectors)
    if dimensions is None or dimensions == vectors.shape[1]:
        return vectors
    if not spec.allow_dimensions:
        raise DimensionsError(f"this model does not support dimensions other than {vectors.shape[1]}")
    return cut_dimensions(vectors, dimensions, normalize=spec.normalize)
