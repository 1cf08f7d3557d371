"""The served text-embedding task end to end on a tiny encoder: tokenizing -> onnxruntime -> pooling.

The task is built as the server builds it (settings file, registry, bind) and run in process
(`onnxpool.local`) on one session. The tiny model attends across the whole row, so a padded
position that leaked into the attention or the pooling would change the vectors: equal results
for an input alone, in a padded batch and in sorted sub-batches show that neither padding nor
grouping matters.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from onnxpool.local import LocalRequest, LocalTask, load_task, settings_for
from onnxpool.tasks.registry import build_task
from onnxpool.tasks.text.embedding import TextEmbedding
from onnxpool.tasks.text.pooling import PoolingMode, PoolingSpec
from tests.text_models import HIDDEN, build_text_model_folder

TEXTS = ["hello world", "", "the cats sat on the mat. " * 12, "a dog ran!", "Ünïcödé 日本 🙂", "  cat  "]
MODEL = "tiny-text"


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> LocalTask:
    folder = build_text_model_folder(tmp_path_factory.mktemp("pipeline") / "model")
    config = folder / "onnxpool.toml"
    config.write_text(f'[model]\nname = "{MODEL}"\npath = "model.onnx"\ntask = "text-embedding"\n')
    return load_task(config)


def served(local: LocalTask, **task: Any) -> TextEmbedding:
    """The task of the same settings file with `[task]` keys overridden, bound to the same model."""
    loaded = settings_for(local.settings.config_file or "", overrides={f"task.{k}": v for k, v in task.items()})
    built = build_task(loaded, local.task.model)
    assert isinstance(built, TextEmbedding)
    return built


def embed(local: LocalTask, task: TextEmbedding, texts: list[str], **asked: Any) -> np.ndarray:
    request = task.read(LocalRequest.json({"input": texts, "model": MODEL, **asked}, route="/v1/embeddings"))
    return np.asarray(task.run(request, local.runner).vectors)


def test_alone_batched_and_sub_batched_agree(local: LocalTask) -> None:
    one_batch = embed(local, served(local, sub_batch=0), TEXTS)
    sub_batched = embed(local, served(local, sub_batch=2), TEXTS)
    alone_task = served(local, sub_batch=0)
    alone = np.concatenate([embed(local, alone_task, [t]) for t in TEXTS])
    assert one_batch.shape == (len(TEXTS), HIDDEN) and one_batch.dtype == np.float32
    np.testing.assert_allclose(one_batch, alone, atol=2e-5)
    np.testing.assert_allclose(sub_batched, alone, atol=2e-5)
    longest = int(alone_task.encode(TEXTS, None).lengths.max())
    capped = embed(local, served(local, sub_batch=8, sub_batch_tokens=longest), TEXTS)
    np.testing.assert_allclose(capped, alone, atol=2e-5)
    assert np.allclose(np.linalg.norm(one_batch, axis=1), 1.0, atol=1e-5)  # modules.json lists Normalize
    assert len({row.tobytes() for row in one_batch}) == len(TEXTS)  # different inputs, different vectors


def test_mean_of_the_real_tokens(local: LocalTask) -> None:
    """An independent reference: the model run on each input alone, averaged in plain Python."""
    task = served(local, normalize=False, sub_batch=4)
    ours = embed(local, task, TEXTS)
    for row, text in enumerate(TEXTS):
        single = task.tokenizer.encode([text])
        hidden = local.runner.infer(single.feeds(), ["last_hidden_state"])["last_hidden_state"][0]
        expected = [sum(float(hidden[t, d]) for t in range(hidden.shape[0])) / hidden.shape[0] for d in range(HIDDEN)]
        np.testing.assert_allclose(ours[row], expected, atol=2e-5)


def test_settings_override_the_models_files(local: LocalTask) -> None:
    task = served(local, pooling="cls", normalize=False, max_length=8, dimensions=True, truncate=True)
    assert task.spec == PoolingSpec(PoolingMode.CLS, normalize=False, allow_dimensions=True)
    assert task.tokenizer.max_length == 8
    assert int(task.encode(TEXTS, None).lengths.max()) == 8
    vectors = embed(local, task, TEXTS, dimensions=4)
    assert vectors.shape == (len(TEXTS), 4)
