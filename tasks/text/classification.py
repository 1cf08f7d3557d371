"""Text classification: `POST /predict` with `{"inputs": ...}`, answered like text-embeddings-inference.

`inputs` is a string (the reply is one list of `{"label", "score"}`, best first) or a list of
strings (a list of such lists). `raw_scores: true` returns the model's logits instead of
probabilities; `truncate` overrides the `[task] truncate` setting for this request. Scores are a
softmax over the classes, or a sigmoid each when the model's config.json says
`problem_type = "multi_label_classification"` (or `[task] scores` says so); none when the output is made
by a Softmax or Sigmoid node (an export with the probabilities inside: a second softmax would flatten
them). Class names: `[task] labels` (a file), else config.json `id2label`, else the indices.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import field_validator

from onnxpool.tasks.api import BytesLike, JsonDocument, RequestParts, Runner, ServedModel, TaskConfigError
from onnxpool.tasks.classes import ScoreMode, load_labels, scores, scores_from_graph
from onnxpool.tasks.errors import BadRequest
from onnxpool.tasks.json_body import json_operation, read_json
from onnxpool.tasks.text.base import TextSettings, TextTask
from onnxpool.tasks.text.tokenizing import MODEL_CONFIG
from onnxpool.workers.model_info import ModelInfo


class TextClassificationSettings(TextSettings):
    """`[task]` for `[model] task = "text-classification"` (with max_length, truncate, max_batch, sub_batch)."""

    output: str = "logits"
    """The model output with the class logits [N, classes]."""
    scores: Literal["auto", "softmax", "sigmoid"] = "auto"
    """auto = none when the output is made by a Softmax or Sigmoid node (already probabilities), else sigmoid
    for config.json's multi_label_classification, else softmax."""
    labels: Path | None = None
    """UTF-8 file with one class name per line, in output-index order ("" = config.json's id2label)."""

    @field_validator("labels", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if value == "" else value


@dataclass(frozen=True)
class Classify:
    """One request: the texts, whether one string was sent, and its options."""

    texts: list[str]
    single: bool
    raw_scores: bool
    truncate: bool


class TextClassification(TextTask[Classify, np.ndarray, TextClassificationSettings]):
    """Sequence classifiers (sentiment, topic, moderation...) with the tokenizer on the server."""

    name = "text-classification"
    settings_model = TextClassificationSettings
    routes = ("/predict",)
    content_types = ("application/json",)

    def __init__(self, settings: TextClassificationSettings, served: ServedModel) -> None:
        super().__init__(settings, served)
        config = self._model_config()
        id2label = config.get("id2label")
        if settings.labels is not None:
            self.labels: list[str] | None = load_labels(settings.labels)
        elif isinstance(id2label, dict):
            self.labels = [str(id2label[key]) for key in sorted(id2label, key=lambda k: int(k))]
        else:
            self.labels = None
        multi = config.get("problem_type") == "multi_label_classification"
        self.sigmoid = settings.scores == "sigmoid" or (settings.scores == "auto" and multi)
        self.score_mode: ScoreMode = "sigmoid" if self.sigmoid else "softmax"
        self.score_why = "[task] scores" if settings.scores != "auto" else "config.json problem_type"
        if settings.scores == "auto" and not multi:
            self.score_why = "logits: no multi_label_classification in config.json"

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

    def startup_lines(self) -> Sequence[str]:
        return [f"scores: {self.score_mode} ({self.score_why})"]

    def bind(self, model: ModelInfo) -> None:
        super().bind(model)
        classes = self.output_of(model, self.settings.output, "logits [batch, classes]").shape[1]
        if self.settings.scores == "auto":
            mode, why = scores_from_graph(model.made_by(self.settings.output), self.settings.output)
            if mode is not None:
                self.score_mode, self.score_why = mode, why
        if self.labels is not None and classes > 0 and classes != len(self.labels):
            raise TaskConfigError(
                f"task text-classification: {len(self.labels)} labels but the model has {classes} classes"
            )

    def read(self, request: RequestParts) -> Classify:
        document = read_json(request, self.served.limits.max_json_depth, '{"inputs": "text" or ["text", ...]}')
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
        if len(texts) > self.settings.max_batch:
            raise BadRequest(f"{len(texts)} inputs in one request; max_batch is {self.settings.max_batch}")
        flags = {}
        for key in ("raw_scores", "truncate"):
            value = document.get(key, self.settings.truncate if key == "truncate" else False)
            if not isinstance(value, bool):
                raise BadRequest(f'"{key}" must be true or false')
            flags[key] = value
        return Classify(texts, single, flags["raw_scores"], flags["truncate"])

    def logged(self, inputs: Classify) -> JsonDocument:
        return {"texts": inputs.texts}

    def canonical(self, inputs: Classify) -> Sequence[BytesLike]:
        head = f"{int(inputs.single)}{int(inputs.raw_scores)}{int(inputs.truncate)}".encode()
        return [head, *(text.encode("utf-8", "surrogatepass") for text in inputs.texts)]

    def _encode(self, inputs: Classify) -> Any:
        if inputs.truncate == self.settings.truncate:
            return self.encode(inputs.texts, None)
        try:
            return self.tokenizer.encode(inputs.texts, truncate=inputs.truncate)
        except ValueError as exc:  # TokenizingError
            raise BadRequest(str(exc)) from None

    def run(self, inputs: Classify, runner: Runner) -> np.ndarray:
        """The logits [N, classes], float32, in input order."""
        with runner.phase("decode"), runner.span("tokenize") as span:
            encoded = self._encode(inputs)
            span["onnxpool.inputs"], span["onnxpool.tokens"] = len(encoded), int(encoded.token_count)
        return self.run_sub_batches(encoded, runner, self.settings.output, lambda out, _: out.astype(np.float32))

    def class_names(self) -> Sequence[str] | None:
        return self.labels

    def reply(self, inputs: Classify, result: np.ndarray) -> Any:
        logits = np.asarray(result, dtype=np.float64)
        if inputs.raw_scores:
            values = logits
        else:
            values = scores(logits, self.score_mode)
        names = self.labels or [str(i) for i in range(values.shape[1])]
        rows = []
        for row in values:
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
