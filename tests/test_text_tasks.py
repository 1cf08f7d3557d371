"""The text tasks through real gunicorn, on a tiny randomly initialised BERT with a real tokenizer:
OpenAI's /v1/embeddings with the official `openai` client (API keys included), v2 infer with BYTES
strings from tritonclient, text classification's /predict, every bad input as an OpenAI-shaped 400,
and the response cache keyed on the normalised request."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest
import requests
import tritonclient.http as triton

from onnxpool.local import LocalRequest, load_task
from tests.harness import Server, running_server
from tests.text_models import build_classifier_folder, build_text_model_folder, text_settings_file

pytestmark = pytest.mark.slow

MODEL = "tiny-text"
KEY = "text-task-test-key-0123456789"
TEXTS = ["hello world", "", "the cat sat on the mat", "  dogs ran!  ", "héllo wörld ✓ 🐱", "a " * 20]


def reference(folder: Path, texts: list[str]) -> np.ndarray:
    """The embeddings of the served task (the folder's settings) computed in process, one text at a time
    (no padding, no sub-batches)."""
    local = load_task(folder / "onnxpool.toml", overrides={"task.sub_batch": 0})
    rows = []
    for text in texts:
        request = local.task.read(LocalRequest.json({"input": [text], "model": MODEL}, route="/v1/embeddings"))
        rows.append(local.task.run(request, local.runner).vectors)
    return np.concatenate(rows)


def settings_file(folder: Path, task: str, extra: str = "") -> Path:
    return text_settings_file(folder, task, KEY, extra)


@pytest.fixture(scope="module")
def embedder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    folder = build_text_model_folder(tmp_path_factory.mktemp("text") / "model")
    config = settings_file(folder, "text-embedding", "sub_batch = 2\n")
    with running_server(folder, {"ONNXPOOL_SERVER__WORKERS": "2"}, config=config, workers=2) as server:
        yield server, folder


def client(server: Server, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=30)


def test_openai_client_gets_the_models_embeddings(embedder: tuple[Server, Path]) -> None:
    server, folder = embedder
    expected = reference(folder, TEXTS)
    for encoding in ("float", "base64"):
        reply = client(server).embeddings.create(model=MODEL, input=TEXTS, encoding_format=encoding)
        rows = [item.embedding for item in reply.data]  # base64 asked for by name: the client leaves it as sent
        got = np.array([np.frombuffer(base64.b64decode(r), "<f4") if isinstance(r, str) else r for r in rows])
        assert [item.index for item in reply.data] == list(range(len(TEXTS)))
        cosines = np.sum(got * expected, axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(expected, axis=1))
        assert cosines.min() >= 0.9999, cosines
        assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)  # modules.json: Normalize
        assert reply.model == MODEL and reply.usage.prompt_tokens == reply.usage.total_tokens > len(TEXTS) * 2
    one = client(server).embeddings.create(model=MODEL, input="hello world")
    assert np.allclose(one.data[0].embedding, expected[0], atol=1e-5)
    tokens = client(server).embeddings.create(model=MODEL, input=[[45, 46], []])  # token ids, no special tokens
    assert len(tokens.data) == 2 and tokens.usage.prompt_tokens == 6  # [CLS] ids [SEP], [CLS] [SEP]
    # [model] memory_arena = "auto": the arena is kept, and given back past the headroom.
    assert server.log().count("arena=kept, given back past +64 MB") == 2


def test_api_keys_are_required_in_openais_shape(embedder: tuple[Server, Path]) -> None:
    server, _ = embedder
    with pytest.raises(openai.AuthenticationError) as err:
        client(server, "wrong-key-wrong-key-wrong").embeddings.create(model=MODEL, input="hello")
    body = err.value.body
    assert isinstance(body, dict) and body["code"] == "invalid_api_key" and body["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("document", "message", "param"),
    [
        ({"model": MODEL, "input": 5}, "input", "input"),
        ({"model": MODEL, "input": [1.5]}, "input", "input"),
        ({"model": MODEL, "input": ["ok", 3]}, "input 1 must be a string", "input"),
        ({"model": MODEL, "input": []}, "empty", "input"),
        ({"model": MODEL, "input": ["x"] * 9}, "9", "input"),
        ({"model": MODEL, "input": ["ok", "a " * 60]}, "input 1 has 62 tokens", None),
        ({"model": "gpt-4", "input": "hi"}, "the model 'gpt-4' does not exist here", "model"),
        (
            {"model": MODEL, "input": "hi", "encoding_format": "int8"},
            "'encoding_format' must be 'float' or 'base64'",
            "encoding_format",
        ),
        ({"model": MODEL, "input": "hi", "dimensions": 8}, "does not support 'dimensions'", "dimensions"),
        ({"input": "hi"}, "'model' is required", "model"),
    ],
)
def test_bad_input_is_an_openai_400_naming_it(
    embedder: tuple[Server, Path], document: dict[str, object], message: str, param: str | None
) -> None:
    server, _ = embedder
    reply = requests.post(
        server.url + "/v1/embeddings", json=document, headers={"Authorization": f"Bearer {KEY}"}, timeout=30
    )
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert message in error["message"] and error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param
    if "model" in document:  # the client itself requires a model
        with pytest.raises(openai.BadRequestError):
            client(server).embeddings.create(**document)  # type: ignore[arg-type]


def test_invalid_utf8_and_broken_json_lose_nothing(embedder: tuple[Server, Path]) -> None:
    server, _ = embedder
    workers = sorted(server.workers())
    auth = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    for body in (b'{"model": "tiny-text", "input": "\xff\xfe"}', b'{"model": "tiny-text", "input": ['):
        reply = requests.post(server.url + "/v1/embeddings", data=body, headers=auth, timeout=30)
        assert reply.status_code == 400 and reply.json()["error"]["type"] == "invalid_request_error"
    assert (
        "not valid UTF-8"
        in requests.post(server.url + "/v1/embeddings", data=b'{"input": "\xff"}', headers=auth, timeout=30).text
    )
    assert len(client(server).embeddings.create(model=MODEL, input=TEXTS).data) == len(TEXTS)
    assert sorted(server.workers()) == workers  # no worker died


def test_the_cache_keys_on_the_normalised_request(embedder: tuple[Server, Path]) -> None:
    server, _ = embedder
    auth = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    first = requests.post(
        server.url + "/v1/embeddings", data=b'{"model":"tiny-text","input":"the cat sat"}', headers=auth, timeout=30
    )
    again = requests.post(
        server.url + "/v1/embeddings",
        data=b'{ "input" : ["the cat sat"], "user": "someone", "model" : "tiny-text" }',
        headers=auth,
        timeout=30,
    )
    assert first.headers["X-Cache"] == "MISS" and again.headers["X-Cache"] == "HIT"
    assert again.content == first.content
    other = requests.post(
        server.url + "/v1/embeddings",
        data=b'{"model":"tiny-text","input":"the cat sat","encoding_format":"base64"}',
        headers=auth,
        timeout=30,
    )
    assert other.headers["X-Cache"] == "MISS"
    vector = np.frombuffer(base64.b64decode(other.json()["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(vector, first.json()["data"][0]["embedding"], atol=1e-6)


def test_tritonclient_sends_strings_as_bytes(embedder: tuple[Server, Path]) -> None:
    server, folder = embedder
    texts = TEXTS[:4]
    expected = reference(folder, texts)
    with triton.InferenceServerClient(server.url.removeprefix("http://")) as tc:
        metadata = tc.get_model_metadata(MODEL, headers={"Authorization": f"Bearer {KEY}"})
        assert metadata["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
        assert metadata["outputs"][0]["name"] == "embedding"
        for binary in (True, False):
            text = triton.InferInput("text", [len(texts)], "BYTES")
            text.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object), binary_data=binary)
            # a new dict each call: tritonclient writes its Inference-Header-Content-Length into the one given
            result = tc.infer(MODEL, [text], headers={"Authorization": f"Bearer {KEY}"})
            assert np.allclose(result.as_numpy("embedding"), expected, atol=1e-5)


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = build_classifier_folder(tmp_path_factory.mktemp("classify") / "model")
    config = settings_file(folder, "text-classification")
    with running_server(folder, {"ONNXPOOL_SERVER__WORKERS": "1"}, config=config, workers=1) as server:
        yield server


def classify(server: Server, document: object) -> requests.Response:
    return requests.post(server.url + "/predict", json=document, headers={"Authorization": f"Bearer {KEY}"}, timeout=30)


def test_text_classification_answers_like_tei(classifier: Server) -> None:
    one = classify(classifier, {"inputs": "the cat sat"})
    assert one.status_code == 200, one.text
    labels = one.json()
    assert {item["label"] for item in labels} == {"negative", "positive"}
    assert labels[0]["score"] >= labels[1]["score"] and sum(i["score"] for i in labels) == pytest.approx(1.0)
    many = classify(classifier, {"inputs": ["the cat sat", "hello world", ""]}).json()
    assert len(many) == 3 and many[0] == labels  # sub-batches and padding change nothing
    raw = classify(classifier, {"inputs": ["the cat sat"], "raw_scores": True}).json()
    assert sum(item["score"] for item in raw[0]) != pytest.approx(1.0)
    for bad, message in (
        ({"inputs": []}, "non-empty list"),
        ({"inputs": [["a", "b"]]}, "text pairs are not supported"),
        ({"inputs": ["a " * 60]}, "input 0 has 62 tokens"),
        ({"inputs": "x", "raw_scores": "yes"}, '"raw_scores" must be true or false'),
        ({"text": "x"}, '"inputs"'),
    ):
        reply = classify(classifier, bad)
        assert reply.status_code == 400 and message in reply.json()["error"], reply.text
    cut = classify(classifier, {"inputs": ["a " * 60], "truncate": True})
    assert cut.status_code == 200


def test_an_output_that_is_not_the_tasks_is_refused_at_start(tmp_path: Path) -> None:
    from onnxpool.config.loader import load_settings
    from onnxpool.tasks.api import TaskConfigError
    from onnxpool.tasks.registry import build_task
    from onnxpool.workers.model_info import ModelInfo, TensorSpec

    folder = build_text_model_folder(tmp_path / "model")
    loaded = load_settings(settings_file(folder, "text-embedding", 'output = "pooled"\n'), environ={})
    ids = TensorSpec("input_ids", "tensor(int64)", (-1, -1))
    model = ModelInfo(inputs=(ids,), outputs=(TensorSpec("pooled", "tensor(float)", (-1, 16)),))
    with pytest.raises(
        TaskConfigError, match=r"task.output = 'pooled': not a token-embedding \[batch, tokens, width\]"
    ):
        build_task(loaded, model)
