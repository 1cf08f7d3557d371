"""The real text demo model (models/minilm/, built by `make minilm`): skipped until it exists.

Without torch: the model's own files give the limit, pooling and normalisation, and the
ONNX export runs with them; once `make minilm-check` has saved sentence-transformers' own
vectors of the committed sentences beside the model, ours must match them (cosine >= 0.9999).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import openai
import pytest
import requests

from benchmarks.minilm_check import REFERENCE, THRESHOLD, compare_with
from benchmarks.text_sentences import sentences
from onnxpool.local import LocalRequest, load_task
from onnxpool.tasks.errors import BadRequest
from onnxpool.tasks.text.embedding import TextEmbedding
from onnxpool.tasks.text.pooling import PoolingMode
from tests.harness import REPO, running_server

MINILM = REPO / "models" / "minilm"
BUILT = (MINILM / "model.onnx").is_file()
pytestmark = [
    pytest.mark.minilm,
    pytest.mark.skipif(not BUILT and not os.environ.get("CI"), reason="models/minilm not built (make minilm)"),
]


@pytest.fixture(autouse=True)
def _built_in_ci() -> None:
    """.ci/run builds the model (make minilm-check) before the tests: in CI a missing model is a failure."""
    if not BUILT:
        pytest.fail("models/minilm is not built: .ci/run runs `make minilm-check` before `make test`")


def test_the_models_files_decide_and_the_export_runs() -> None:
    local = load_task(REPO / "config" / "minilm.toml", MINILM / "model.onnx")  # the served task, as served
    task = local.task
    assert isinstance(task, TextEmbedding)
    assert tuple(t.name for t in task.model.inputs) == ("input_ids", "attention_mask", "token_type_ids")
    assert task.tokenizer.max_length == 256  # sentence_bert_config.json, not tokenizer.json's 128
    assert task.spec.mode is PoolingMode.MEAN and task.spec.normalize
    with pytest.raises(BadRequest, match="input 1 has 302 tokens"):
        local.answer(LocalRequest.json({"input": ["ok", "word " * 300], "model": task.served.name}))
    texts = ["", "A man is eating food.", "A man is eating a piece of bread.", "The sky is blue today."]
    reply = local.answer(LocalRequest.json({"input": texts, "model": task.served.name}, route="/v1/embeddings"))
    vectors = np.array([item["embedding"] for item in reply["data"]])
    assert vectors.shape == (4, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    similar, unrelated = float(vectors[1] @ vectors[2]), float(vectors[1] @ vectors[3])
    assert similar > 0.6 > unrelated


def test_matches_sentence_transformers() -> None:
    """Against sentence-transformers' vectors that `make minilm-check` saved (no torch needed here)."""
    reference = MINILM / REFERENCE
    if not reference.is_file():
        pytest.skip(f"{reference.name} not saved yet (make minilm-check)")
    saved = np.load(reference)
    texts = sentences()
    assert saved["texts"].tolist() == texts
    result = compare_with(texts, saved["vectors"], saved["lengths"], MINILM)
    assert result.lengths_equal
    assert float(result.cosines.min()) >= THRESHOLD


def served_cosines(url: str, model: str, texts: list[str], reference: np.ndarray) -> np.ndarray:
    """Every text embedded by the server through the official openai client (48 per request),
    and each vector's cosine to its row of `reference`."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
    vectors: list[list[float]] = []
    for start in range(0, len(texts), 48):
        reply = client.embeddings.create(model=model, input=texts[start : start + 48])
        vectors += [item.embedding for item in reply.data]
    got, want = np.array(vectors, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    cosines: np.ndarray = np.sum(got * want, axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    return cosines


def test_the_server_answers_what_sentence_transformers_computes(tmp_path: Path) -> None:
    """The whole path: `onnxpool serve --config minilm`, the official openai client, all sentences."""
    reference = MINILM / REFERENCE
    if not reference.is_file():
        pytest.skip(f"{reference.name} not saved yet (make minilm-check)")
    saved = np.load(reference)
    texts = sentences()
    settings = {"ONNXPOOL_SERVER__WORKERS": "2", "ONNXPOOL_TASK__TRUNCATE": "true"}  # as sentence-transformers cuts
    with running_server(tmp_path, settings, config=REPO / "config" / "minilm.toml", workers=2) as server:
        cosines = served_cosines(server.url, "all-minilm-l6-v2", texts, saved["vectors"])
    assert len(texts) >= 200 and float(cosines.min()) >= THRESHOLD, (float(cosines.min()), float(cosines.mean()))


def test_the_int8_variant_is_served_and_close(tmp_path: Path) -> None:
    """`make minilm-int8` (.ci/run makes it): served by `--config minilm-int8`, mean cosine >= 0.99."""
    int8 = MINILM / "model-int8.onnx"
    if not int8.is_file():
        if os.environ.get("CI"):
            pytest.fail("models/minilm/model-int8.onnx is not built: .ci/run runs `make minilm-int8`")
        pytest.skip("models/minilm/model-int8.onnx not built (make minilm-int8)")
    reference = MINILM / REFERENCE
    if not reference.is_file():
        pytest.skip(f"{reference.name} not saved yet (make minilm-check)")
    texts = sentences()
    settings = {"ONNXPOOL_SERVER__WORKERS": "1", "ONNXPOOL_TASK__TRUNCATE": "true"}
    with running_server(tmp_path, settings, config=REPO / "config" / "minilm-int8.toml", workers=1) as server:
        meta = requests.get(f"{server.url}/v2/models/all-minilm-l6-v2-int8", timeout=10).json()
        quantization = meta["parameters"]["quantization"]
        assert quantization["target"] == "portable" and quantization["reduce_range"] is True
        assert quantization["cpu_fit"] == "ok"
        cosines = served_cosines(server.url, "all-minilm-l6-v2-int8", texts, np.load(reference)["vectors"])
    assert float(cosines.mean()) >= 0.99, (float(cosines.mean()), float(cosines.min()))
