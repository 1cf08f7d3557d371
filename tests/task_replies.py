"""Tabular, text-embedding and text-classification requests whose replies were recorded, byte for
byte, before the task requests got one path (the data plane) and the task contract its second version.

`python -m tests.task_replies --record` starts real servers (response cache off): the iris demo
(tabular), and a tiny BERT with a real tokenizer built here deterministically (text-embedding,
text-classification), and writes every case's status, content type and body to
tests/fixtures/task_replies.json; tests/test_task_wire.py sends the same requests to today's code,
computed and replayed from the cache, and compares. Successes and refusals alike: OpenAI-shaped
errors, v2 infer with strings, API keys.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import requests

from tests.harness import REPO, Server, running_server
from tests.image_replies import as_recorded, recording_command
from tests.text_models import build_classifier_folder, build_text_model_folder, text_settings_file

RECORDING = Path(__file__).resolve().parent / "fixtures" / "task_replies.json"
TEXT_MODEL = "tiny-text"
KEY = "task-replies-test-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}


@dataclass(frozen=True)
class Case:
    name: str
    server: str
    """Which server answers: iris, embedder or classifier."""
    path: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)

    def send(self, base_url: str) -> requests.Response:
        headers = {"Content-Type": "application/json", **self.headers}
        return requests.post(base_url + self.path, data=self.body, headers=headers, timeout=60)


def _json(document: object) -> bytes:
    return json.dumps(document).encode()


def _v2_strings(texts: list[str], binary: bool) -> tuple[bytes, dict[str, str]]:
    """A v2 infer request with a BYTES `text` input, as JSON or as tritonclient's binary form."""
    if not binary:
        document = {"id": "t1", "inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts)], "data": texts}]}
        return _json(document), {}
    raw = b"".join(struct.pack("<I", len(t.encode())) + t.encode() for t in texts)
    header = _json(
        {
            "id": "b1",
            "inputs": [
                {
                    "name": "text",
                    "datatype": "BYTES",
                    "shape": [len(texts)],
                    "parameters": {"binary_data_size": len(raw)},
                }
            ],
            "outputs": [{"name": "embedding", "parameters": {"binary_data": True}}],
        }
    )
    return header + raw, {"Inference-Header-Content-Length": str(len(header))}


def cases() -> Iterator[Case]:
    iris = "/v1/models/iris:predict"
    setosa = [5.1, 3.5, 1.4, 0.2]
    named = {"sepal_length": 6.7, "sepal_width": 3.0, "petal_length": 5.2, "petal_width": 2.3}
    yield Case("iris one list", "iris", iris, _json({"instances": [setosa]}))
    yield Case("iris list and object", "iris", iris, _json({"instances": [setosa, named, [6.0, 2.7, 4.1, 1.1]]}))
    yield Case("iris on /predict", "iris", "/predict", _json({"instances": [named]}))
    yield Case("iris v2 infer", "iris", "/v2/models/iris/infer", _json(
        {"id": "i1", "inputs": [{"name": "sepal_length", "datatype": "FP32", "shape": [1, 1], "data": [5.1]},
                                {"name": "sepal_width", "datatype": "FP32", "shape": [1, 1], "data": [3.5]},
                                {"name": "petal_length", "datatype": "FP32", "shape": [1, 1], "data": [1.4]},
                                {"name": "petal_width", "datatype": "FP32", "shape": [1, 1], "data": [0.2]}]}
    ))  # fmt: skip
    yield Case("iris broken json", "iris", iris, b'{"instances": [[1,')
    yield Case("iris no instances", "iris", iris, _json({"rows": [setosa]}))
    yield Case("iris short row", "iris", iris, _json({"instances": [[1.0, 2.0]]}))
    yield Case("iris unknown feature", "iris", iris, _json({"instances": [{**named, "colour": 1}]}))
    yield Case("iris text value", "iris", iris, _json({"instances": [[1.0, "two", 3.0, 4.0]]}))
    yield Case("iris other model", "iris", "/v1/models/roses:predict", _json({"instances": [setosa]}))

    texts = ["hello world", "", "the cat sat on the mat", "  dogs ran!  ", "héllo wörld ✓ 🐱", "a " * 20]
    embed = "/v1/embeddings"
    yield Case("embed list", "embedder", embed, _json({"model": TEXT_MODEL, "input": texts}), AUTH)
    yield Case("embed one", "embedder", embed, _json({"model": TEXT_MODEL, "input": "the cat"}), AUTH)
    yield Case(
        "embed base64", "embedder", embed,
        _json({"model": TEXT_MODEL, "input": texts[:3], "encoding_format": "base64"}), AUTH,
    )  # fmt: skip
    yield Case("embed token ids", "embedder", embed, _json({"model": TEXT_MODEL, "input": [[5, 6, 7], [8]]}), AUTH)
    yield Case("embed no key", "embedder", embed, _json({"model": TEXT_MODEL, "input": "x"}))
    yield Case(
        "embed wrong key", "embedder", embed, _json({"model": TEXT_MODEL, "input": "x"}), {"Authorization": "Bearer no"}
    )
    yield Case("embed other model", "embedder", embed, _json({"model": "gpt-4", "input": "x"}), AUTH)
    yield Case("embed no input", "embedder", embed, _json({"model": TEXT_MODEL}), AUTH)
    yield Case("embed empty list", "embedder", embed, _json({"model": TEXT_MODEL, "input": []}), AUTH)
    yield Case("embed too long", "embedder", embed, _json({"model": TEXT_MODEL, "input": "cat " * 100}), AUTH)
    yield Case("embed too many", "embedder", embed, _json({"model": TEXT_MODEL, "input": ["x"] * 9}), AUTH)
    yield Case("embed dimensions", "embedder", embed, _json({"model": TEXT_MODEL, "input": "x", "dimensions": 4}), AUTH)
    yield Case(
        "embed bad format", "embedder", embed,
        _json({"model": TEXT_MODEL, "input": "x", "encoding_format": "hex"}), AUTH,
    )  # fmt: skip
    yield Case("embed broken json", "embedder", embed, b'{"model": "tiny-text", "input": ["x"', AUTH)
    yield Case("embed bad utf-8", "embedder", embed, b'{"model": "tiny-text", "input": "\xff\xfe"}', AUTH)
    body, headers = _v2_strings(texts[:4], binary=False)
    yield Case("embed v2 json strings", "embedder", f"/v2/models/{TEXT_MODEL}/infer", body, {**AUTH, **headers})
    body, headers = _v2_strings(texts[2:], binary=True)
    yield Case("embed v2 binary strings", "embedder", f"/v2/models/{TEXT_MODEL}/infer", body, {**AUTH, **headers})

    classify = "/predict"
    yield Case("classify one", "classifier", classify, _json({"inputs": "the cat sat"}), AUTH)
    yield Case("classify list", "classifier", classify, _json({"inputs": texts}), AUTH)
    yield Case("classify raw", "classifier", classify, _json({"inputs": ["a dog", "hello"], "raw_scores": True}), AUTH)
    yield Case("classify truncate", "classifier", classify, _json({"inputs": "cat " * 100, "truncate": True}), AUTH)
    yield Case("classify too long", "classifier", classify, _json({"inputs": "cat " * 100}), AUTH)
    yield Case("classify pair", "classifier", classify, _json({"inputs": [["a", "b"]]}), AUTH)
    yield Case("classify unknown member", "classifier", classify, _json({"inputs": "x", "top": 2}), AUTH)
    yield Case("classify empty", "classifier", classify, _json({"inputs": []}), AUTH)
    yield Case("classify no key", "classifier", classify, _json({"inputs": "x"}))


def settings_file(folder: Path, task: str, extra: str = "") -> Path:
    """A text model's settings in the layout every onnxpool release since the text tasks reads."""
    return text_settings_file(folder, task, KEY, extra, old_layout=True)


def servers(stack: ExitStack, root: Path, cache: bool) -> dict[str, Server]:
    """The three servers the cases go to (2 workers each; the response cache on or off)."""
    env = {"ONNXPOOL_SERVER__WORKERS": "2", "ONNXPOOL_CACHE__ENABLED": "true" if cache else "false"}
    embed_folder = build_text_model_folder(root / "embedder")
    classify_folder = build_classifier_folder(root / "classifier")
    return {
        "iris": stack.enter_context(running_server(root / "iris", env, config=REPO / "config" / "iris.toml")),
        "embedder": stack.enter_context(
            running_server(embed_folder, env, config=settings_file(embed_folder, "text-embedding", "sub_batch = 2\n"))
        ),
        "classifier": stack.enter_context(
            running_server(classify_folder, env, config=settings_file(classify_folder, "text-classification"))
        ),
    }


def record(urls: dict[str, str]) -> dict[str, dict[str, str | int]]:
    return {case.name: as_recorded(case.send(urls[case.server])) for case in cases()}


def record_from_servers(root: Path) -> dict[str, dict[str, str | int]]:
    """Every case's reply from fresh servers of this code (response cache off)."""
    (root / "iris").mkdir()
    with ExitStack() as stack:
        return record({name: server.url for name, server in servers(stack, root, cache=False).items()})


if __name__ == "__main__":
    recording_command(__doc__ or "", RECORDING, record_from_servers)
