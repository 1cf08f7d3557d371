"""onnxpool.tasks.text.pooling: modes with the mask, the model's files, normalisation, dimensions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from onnxpool.tasks.text.pooling import (
    DimensionsError,
    PoolingMode,
    PoolingSpec,
    cut_dimensions,
    embed,
    l2_normalize,
    normalizes,
    pool,
    pooling_mode_of,
)
from tests.text_models import build_text_model_folder

# Two inputs: 3 real tokens and 1 real token, padded to 4; padding holds huge values that
# would show up in any result that let them in.
X = np.array(
    [
        [[1.0, 2.0], [3.0, 4.0], [5.0, -6.0], [1e6, 1e6]],
        [[7.0, 8.0], [1e6, -1e6], [1e6, 1e6], [1e6, 1e6]],
    ],
    dtype=np.float32,
)
MASK = np.array([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=np.int64)


def test_mean_ignores_padding() -> None:
    assert pool(X, MASK, PoolingMode.MEAN).tolist() == [[3.0, 0.0], [7.0, 8.0]]


def test_cls_is_the_first_token() -> None:
    assert pool(X, MASK, PoolingMode.CLS).tolist() == [[1.0, 2.0], [7.0, 8.0]]


def test_lasttoken_is_the_last_real_token_whatever_the_padding_side() -> None:
    assert pool(X, MASK, PoolingMode.LASTTOKEN).tolist() == [[5.0, -6.0], [7.0, 8.0]]
    left = np.array([[0, 1, 1, 1]])
    x = np.arange(8, dtype=np.float32).reshape(1, 4, 2)
    assert pool(x, left, PoolingMode.LASTTOKEN).tolist() == [[6.0, 7.0]]


def test_max_ignores_padding() -> None:
    assert pool(X, MASK, PoolingMode.MAX).tolist() == [[5.0, 4.0], [7.0, 8.0]]


def test_all_padding_row_gives_zeros_not_nan() -> None:
    empty = np.zeros((1, 4), dtype=np.int64)
    assert pool(X[:1], empty, PoolingMode.MEAN).tolist() == [[0.0, 0.0]]
    assert l2_normalize(np.zeros((1, 3), np.float32)).tolist() == [[0.0, 0.0, 0.0]]


def test_shapes_must_match() -> None:
    with pytest.raises(ValueError, match="do not match"):
        pool(X, MASK[:, :3], PoolingMode.MEAN)


def test_normalize_gives_unit_rows() -> None:
    vectors = l2_normalize(np.array([[3.0, 4.0], [0.0, -2.0]], np.float32))
    assert np.allclose(vectors, [[0.6, 0.8], [0.0, -1.0]])


def test_dimensions_cut_then_renormalise() -> None:
    vectors = l2_normalize(np.array([[3.0, 4.0, 12.0]], np.float32))
    cut = cut_dimensions(vectors, 2, normalize=True)
    assert np.allclose(cut, [[0.6, 0.8]])
    assert np.allclose(cut_dimensions(vectors, 2, normalize=False), vectors[:, :2])
    for bad in (0, 4):
        with pytest.raises(DimensionsError, match="between 1 and 3"):
            cut_dimensions(vectors, bad, normalize=True)


def test_embed_applies_the_spec() -> None:
    spec = PoolingSpec(PoolingMode.MEAN, normalize=True)
    vectors = embed(X, MASK, spec)
    assert np.allclose(vectors, [[1.0, 0.0], [7 / np.hypot(7, 8), 8 / np.hypot(7, 8)]])
    assert np.allclose(embed(X, MASK, spec, dimensions=2), vectors)  # the full size is always fine
    with pytest.raises(DimensionsError, match="does not support dimensions"):
        embed(X, MASK, spec, dimensions=1)
    allowed = spec.with_overrides(allow_dimensions=True)
    assert np.allclose(embed(X, MASK, allowed, dimensions=1), [[1.0], [1.0]])


@pytest.mark.parametrize("mode", ["mean", "cls", "lasttoken", "max"])
def test_spec_from_the_models_files(tmp_path: Path, mode: str) -> None:
    folder = build_text_model_folder(tmp_path / mode, pooling=mode, normalize=mode != "cls")
    spec = PoolingSpec.from_folder(folder)
    assert spec.mode == PoolingMode(mode)
    assert spec.normalize is (mode != "cls")
    assert spec.allow_dimensions is False


def test_defaults_without_files_and_the_normalize_folder(tmp_path: Path) -> None:
    assert pooling_mode_of(tmp_path) is PoolingMode.MEAN
    assert normalizes(tmp_path) is False
    (tmp_path / "2_Normalize").mkdir()
    assert normalizes(tmp_path) is True


def test_pooling_mode_string_and_bad_configs(tmp_path: Path) -> None:
    config = tmp_path / "1_Pooling" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps({"pooling_mode": "lasttoken"}))
    assert pooling_mode_of(tmp_path) is PoolingMode.LASTTOKEN
    config.write_text(json.dumps({"pooling_mode": "weighted"}))
    with pytest.raises(ValueError, match="not supported"):
        pooling_mode_of(tmp_path)
    config.write_text(json.dumps({"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True}))
    with pytest.raises(ValueError, match="exactly one"):
        pooling_mode_of(tmp_path)
    config.write_text(json.dumps({"pooling_mode_mean_sqrt_len_tokens": True}))
    with pytest.raises(ValueError, match="mean_sqrt_len"):
        pooling_mode_of(tmp_path)
