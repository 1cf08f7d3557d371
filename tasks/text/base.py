"""What the text tasks share: the tokenizer from the model folder, its threads, sub-batched runs.

Process rules: the tokenizer is read in the master (reading tokenizer.json starts no thread) and
bound to the model's inputs there (`bind`);
its thread pool is sized in each worker after fork (`start_in_worker` -> `configure_threads`)
and never exists in the master, which never encodes. A request's texts are tokenized in the
worker, run length-sorted in sub-batches (short inputs are not padded to the longest) and
put back in request order.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal, TypeVar

import numpy as np
from pydantic import Field, StrictBool, StrictInt

from onnxpool.tasks.api import Runner, ServedModel, Task, TaskConfigError, TaskSettings
from onnxpool.tasks.errors import BadRequest
from onnxpool.tasks.text.sorting import plan_sub_batches
from onnxpool.tasks.text.tokenizing import (
    INPUT_IDS,
    KNOWN_INPUTS,
    TOKENIZER_FILE,
    EncodedBatch,
    TextTokenizer,
    TokenizingError,
    configure_threads,
    model_max_length,
)
from onnxpool.workers.model_info import ModelInfo, TensorSpec


class TextSettings(TaskSettings):
    """The `[task]` keys every text task has."""

    max_length: Literal["auto"] | Annotated[StrictInt, Field(ge=3)] = "auto"
    """Tokens per input, special tokens included; auto = sentence_bert_config.json max_seq_length,
    else config.json max_position_embeddings (never what tokenizer.json carries)."""
    truncate: StrictBool = False
    """An input over max_length: false = a 400 naming the input and its token count, true = cut it."""
    max_batch: int = Field(default=2048, ge=1)
    """Inputs per request."""
    sub_batch: int = Field(default=8, ge=0)
    """Run a request length-sorted in sub-batches of this many inputs; 0 = one padded batch."""
    sub_batch_tokens: int = Field(default=512, ge=0)
    """A sub-batch's padded tokens at most (inputs x its longest; one input always fits), so a run's
    memory stays bounded: attention grows with inputs x length^2. 0 = no cap."""


SettingsT = TypeVar("SettingsT", bound=TextSettings)
InputsT = TypeVar("InputsT")
ResultT = TypeVar("ResultT")


class TextTask(Task[InputsT, ResultT, SettingsT]):
    """Base of the text tasks: tokenizer, thread sizing, and the sub-batched run."""

    def __init__(self, settings: SettingsT, served: ServedModel) -> None:
        super().__init__(settings, served)
        self.folder = served.path.parent
        if not (self.folder / TOKENIZER_FILE).is_file():
            raise TaskConfigError(f"task {self.name}: no {TOKENIZER_FILE} beside the model in {self.folder}")
        try:
            limit = model_max_length(self.folder) if settings.max_length == "auto" else settings.max_length
            self.tokenizer = TextTokenizer.from_folder(self.folder, KNOWN_INPUTS, limit)
        except (OSError, ValueError) as exc:
            raise TaskConfigError(f"task {self.name}: cannot read the tokenizer in {self.folder}: {exc}") from None
        self._digest = hashlib.sha256((self.folder / TOKENIZER_FILE).read_bytes()).hexdigest()

    def fingerprint(self) -> str:
        return f"{TOKENIZER_FILE} sha256:{self._digest}, max_length {self.tokenizer.max_length}"

    def bind(self, model: ModelInfo) -> None:
        names = tuple(t.name for t in model.inputs)
        unknown = [name for name in names if name not in KNOWN_INPUTS]
        if unknown or INPUT_IDS not in names:
            raise TaskConfigError(
                f"task {self.name}: the model's inputs are {list(names)}; a text model takes input_ids "
                f"and optionally {', '.join(KNOWN_INPUTS[1:])}"
            )
        self.tokenizer.input_names = names  # feed exactly the model's inputs

    @staticmethod
    def output_of(model: ModelInfo, name: str, shape: str) -> TensorSpec:
        """The model output `task.output` names, of the rank `shape` describes (e.g. "[batch, classes]")."""
        output = model.output(name)
        if output is None or len(output.shape) != shape.count(",") + 1:
            known = ", ".join(f"{t.name} {list(t.shape)}" for t in model.outputs)
            raise TaskConfigError(f"task.output = {name!r}: not a {shape} output of the model (outputs: {known})")
        return output

    def start_in_worker(self, cores: int) -> None:
        configure_threads(cores)  # before this process's first encode (tokenizing.py says why)

    def encode(self, texts: Sequence[str] | None, token_ids: Sequence[Sequence[int]] | None) -> EncodedBatch:
        """The inputs as the model's arrays; a 400 naming the input that cannot be taken."""
        try:
            if token_ids is not None:
                return self.tokenizer.encode_ids(token_ids, truncate=self.settings.truncate)
            return self.tokenizer.encode(texts or [], truncate=self.settings.truncate)
        except TokenizingError as exc:
            raise BadRequest(exc.message) from None

    def run_sub_batches(
        self, encoded: EncodedBatch, runner: Runner, output: str, per_batch: Callable[[np.ndarray, EncodedBatch], Any]
    ) -> np.ndarray:
        """`per_batch(model output, sub-batch)` for each length-sorted sub-batch, rows back in input order."""
        plan = plan_sub_batches(
            encoded.lengths, self.settings.sub_batch or None, self.settings.sub_batch_tokens or None
        )
        results = []
        for rows in plan.batches:
            with runner.phase("decode"):
                part = encoded.select(rows)
            produced = runner.infer(part.feeds(), [output])[output]
            with runner.phase("encode"):
                results.append(per_batch(np.asarray(produced), part))
        return plan.restore(results)
