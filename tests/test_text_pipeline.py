"""onnxpool.tasks.text end to end on a tiny encoder: tokenizing -> onnxruntime -> pooling.

The tiny model attends across the whole row, so a padded position that leaked into the
attention or the pooling would change the vectors: equal results for an input alone, in a
padded batch and in sorted sub-batches show that neither padding nor grouping matters.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from onnxpool.tasks.text.options import TextEmbeddingOptions, resolve
from onnxpool.tasks.text.pipeline import embed_batch
from onnxpool.tasks.text.pooling import PoolingMode, PoolingSpec
from tests.text_models import HIDDEN, build_text_model_folder

TEXTS = ["hello world", "", "the cats sat on the mat. " * 12, "a dog ran!", "Ünïcödé 日本 🙂", "  cat  "]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_text_model_folder(tmp_path_factory.mktemp("pipeline") / "model")


@pytest.fixture(scope="module")
def session(folder: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"])


def runner(session: ort.InferenceSession):
    def run(feeds: dict[str, np.ndarray]) -> np.ndarray:
        return np.asarray(session.run(["last_hidden_state"], feeds)[0])

    return run


def test_alone_batched_and_sub_batched_agree(folder: Path, session: ort.InferenceSession) -> None:
    task = resolve(TextEmbeddingOptions(), folder)
    encoded = task.tokenizer.encode(TEXTS)
    one_batch = embed_batch(encoded, runner(session), task.pooling, batch_size=None)
    sub_batched = embed_batch(encoded, runner(session), task.pooling, batch_size=2)
    alone = np.concatenate(
        [embed_batch(task.tokenizer.encode([t]), runner(session), task.pooling, batch_size=None) for t in TEXTS]
    )
    assert one_batch.shape == (len(TEXTS), HIDDEN) and one_batch.dtype == np.float32
    np.testing.assert_allclose(one_batch, alone, atol=2e-5)
    np.testing.assert_allclose(sub_batched, alone, atol=2e-5)
    capped = embed_batch(encoded, runner(session), task.pooling, batch_size=8, max_tokens=int(encoded.lengths.max()))
    np.testing.assert_allclose(capped, alone, atol=2e-5)
    assert np.allclose(np.linalg.norm(one_batch, axis=1), 1.0, atol=1e-5)  # modules.json lists Normalize
    assert len({row.tobytes() for row in one_batch}) == len(TEXTS)  # different inputs, different vectors


def test_mean_of_the_real_tokens(folder: Path, session: ort.InferenceSession) -> None:
    """An independent reference: the model run on each input alone, averaged in plain Python."""
    task = resolve(TextEmbeddingOptions(normalize=False), folder)
    ours = embed_batch(task.tokenizer.encode(TEXTS), runner(session), task.pooling, batch_size=4)
    for row, text in enumerate(TEXTS):
        single = task.tokenizer.encode([text])
        hidden = runner(session)(single.feeds())[0]
        expected = [sum(float(hidden[t, d]) for t in range(hidden.shape[0])) / hidden.shape[0] for d in range(HIDDEN)]
        np.testing.assert_allclose(ours[row], expected, atol=2e-5)


def test_options_override_the_models_files(folder: Path, session: ort.InferenceSession) -> None:
    task = resolve(TextEmbeddingOptions(pooling="cls", normalize=False, max_length=8, dimensions=True), folder)
    assert task.pooling == PoolingSpec(PoolingMode.CLS, normalize=False, allow_dimensions=True)
    assert task.tokenizer.max_length == 8
    encoded = task.tokenizer.encode(TEXTS, truncate=True)
    assert int(encoded.lengths.max()) == 8
    vectors = embed_batch(encoded, runner(session), task.pooling, dimensions=4)
    assert vectors.shape == (len(TEXTS), 4)
