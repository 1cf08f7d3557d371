"""Text classification: `POST /predict` with `{"inputs": ...}`, answered like text-embeddings-inference.

`inputs` is a string (the reply is one list of `{"label", "score"}`, best first) or a list of
strings (a list of such lists). `raw_scores: true` returns the model's logits instead of
probabilities; `truncate` overrides the `[task] truncate` setting for this request. Scores are a
softmax over the classes, or a sigmoid each when the model's config.json says
`problem_type = "multi_label_classification"` (or `[task] scores` says so). Class names:
`[model] labels`, else config.json `id2label`, else the indices.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from onnxpool.config.settings import Settings
from onnxpool.tasks.api import BytesLike, Feeds, Outputs, RequestParts, Runner, TaskConfigError
from onnxpool.tasks.errors import BadRequest
from onnxpool.tasks.image.postprocess import load_labels
from onnxpool.tasks.json_body import json_operation, read_json
from onnxpool.tasks.text.base import TextSettings, TextTask
from onnxpool.tasks.text.tokenizing import MODEL_CONFIG
from onnxpool.workers.model_info import ModelInfo

SCORES = "scores"


class TextClassificationSettings(TextSettings):
    """`[task]` for `[model] task = "text-classification"` (with max_length, truncate, max_batch, sub_batch)."""

    output: str = "logits"
    """The model output with the class logits [N, classes]."""
    scores: Literal["auto", "softmax", "sigmoid"] = "auto"
    """auto = sigmoid for config.json's multi_label_classification, else softmax."""


@dataclass(frozen=True)
class Classify:
    """One request: the texts, whether one string was sent, and its options."""

    texts: list[str]
    single: bool
    raw_scores: bool
    truncate: bool


class TextClassification(TextTask[Classify, TextClassificationSettings]):
    """Sequence classifiers (sentiment, topic, moderation...) with the tokenizer on the server."""

    name = "text-classification"
    settings_model = TextClassificationSettings
    routes = ("/predict",)
    content_types = ("application/json",)

    def __init__(self, settings: Settings, options: TextClassificationSettings) -> None:
        super().__init__(settings, options)
        config = self._model_config()
        labels_file = settings.model.labels
        id2label = config.get("id2label")
        if labels_file is not None:
            self.labels: list[str] | None = load_labels(labels_file)
        elif isinstance(id2label, dict):
            self.labels = [str(id2label[key]) for key in sorted(id2label, key=lambda k: int(k))]
        else:
            self.labels = None
        multi = config.get("problem_type") == "multi_label_classification"
        self.sigmoid = options.scores == "sigmoid" or (options.scores == "auto" and multi)

    def _model_config(self) -> dict[str, Any]:
        path = self.folder / MODEL_CONFIG
        if not path.is_file():
            return {}
        try:
            loaded = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise TaskConfigError(f"task {self.name}: {path} cannot be read: {exc}") from None
        return loaded if isinstance(loaded, dict) else {}

    def fingerprint(self) -> str:
        return f"{super().fingerprint()}, labels {self.labels}, sigmoid {self.sigmoid}"

    def check(self, model: ModelInfo) -> None:
        super().check(model)
        classes = self.output_of(model, self.options.output, "logits [batch, classes]").shape[1]
        if self.labels is not None and classes > 0 and classes != len(self.labels):
            raise TaskConfigError(
                f"task text-classification: {len(self.labels)} labels but the model has {classes} classes"
            )

    def read(self, request: RequestParts) -> Classify:
        document = read_json(request, self.settings.limits.max_json_depth, '{"inputs": "text" or ["text", ...]}')
        if not isinstance(document, dict) or "inputs" not in document:
            raise BadRequest('the body must be a JSON object with "inputs": a string or a list of strings')
        unknown = sorted(set(document) - {"inputs", "raw_scores", "truncate", "truncation_direction"})
        if unknown:
            raise BadRequest(f"unknown member(s) {', '.join(map(repr, unknown))}")
        inputs = document["inputs"]
        single = isinstance(inputs, str)
        texts = [inputs] if single else inputs
        if not isinstance(texts, list) or not texts:
            raise BadRequest('"inputs" must be a string or a non-empty list of strings')
        for index, text in enumerate(texts):
            if not isinstance(text, str):
                kind = "a list (text pairs are not supported)" if isinstance(text, list) else type(text).__name__
                raise BadRequest(f"inputs[{index}] must be a string, got {kind}")
        if len(texts) > self.options.max_batch:
            raise BadRequest(f"{len(texts)} inputs in one request; max_batch is {self.options.max_batch}")
        flags = {}
        for key in ("raw_scores", "truncate"):
            value = document.get(key, self.options.truncate if key == "truncate" else False)
            if not isinstance(value, bool):
                raise BadRequest(f'"{key}" must be true or false')
            flags[key] = value
        return Classify(texts, single, flags["raw_scores"], flags["truncate"])

    def canonical(self, inputs: Classify) -> Sequence[BytesLike]:
        head = f"{int(inputs.single)}{int(inputs.raw_scores)}{int(inputs.truncate)}".encode()
        return [head, *(text.encode("utf-8", "surrogatepass") for text in inputs.texts)]

    def _encode(self, inputs: Classify) -> Any:
        if inputs.truncate == self.options.truncate:
            return self.encode(inputs.texts, None)
        try:
            return self.tokenizer.encode(inputs.texts, truncate=inputs.truncate)
        except ValueError as exc:  # TokenizingError
            raise BadRequest(str(exc)) from None

    def feeds(self, inputs: Classify, model: ModelInfo) -> Feeds:
        feeds: Feeds = self._encode(inputs).feeds()
        return feeds

    def run(self, inputs: Classify, model: ModelInfo, runner: Runner) -> Outputs:
        with runner.phase("decode"):
            encoded = self._encode(inputs)
        logits = self.run_sub_batches(encoded, runner, self.options.output, lambda out, _: out.astype(np.float32))
        return {SCORES: logits}

    def reply(self, inputs: Classify, outputs: Outputs) -> Any:
        logits = np.asarray(outputs[SCORES], dtype=np.float64)
        if inputs.raw_scores:
            scores = logits
        elif self.sigmoid:
            scores = 1.0 / (1.0 + np.exp(-logits))
        else:
            shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
            scores = shifted / shifted.sum(axis=1, keepdims=True)
        names = self.labels or [str(i) for i in range(scores.shape[1])]
        rows = []
        for row in scores:
            order = np.argsort(-row, kind="stable")
            rows.append([{"score": float(row[i]), "label": names[i]} for i in order])
        return rows[0] if inputs.single else rows

    def openapi(self, route: str) -> dict[str, Any]:
        prediction = {
            "type": "object",
            "required": ["score", "label"],
            "properties": {"score": {"type": "number"}, "label": {"type": "string"}},
        }
        one = {"type": "array", "items": prediction}
        return json_operation(
            "Classify texts (text-embeddings-inference's /predict)",
            {
                "type": "object",
                "required": ["inputs"],
                "properties": {
                    "inputs": {
                        "anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1}]
                    },
                    "raw_scores": {"type": "boolean"},
                    "truncate": {"type": "boolean"},
                },
            },
            "Labels and scores, best first: one list for a string, a list of lists for a list",
            {"anyOf": [one, {"type": "array", "items": one}]},
            {"inputs": ["I love this phone.", "The battery died after an hour."]},
        )
