"""The task API: a model's own pre- and post-processing, written once, beside the model.

A task turns what a client sends into the model's inputs and the model's outputs into
the reply. The server does everything around it: HTTP, gates (size, API key, shedding),
the response cache, timing and metrics, the one onnxruntime session per worker. A task
knows nothing of HTTP: it sees a request through `RequestParts` and answers a JSON
document; errors are the exceptions of `onnxpool.tasks.errors`, each carrying its status.

The life of a request to a task's route (`Task.routes`, each a POST):

    inputs = task.read(parts)          # phase "decode": parse and check what was sent
    key    = task.canonical(inputs)    # the bytes the response cache keys on
    outputs = task.run(inputs, model, runner)  # by default: ONE batched inference of
                                       #   task.feeds(inputs, model) (phase "decode") for
                                       #   task.output_names(model) (phase "infer")
    reply  = task.reply(inputs, outputs)                 # phase "encode": a JSON document

Process rules (docs/TASKS.md): a task object is built in the gunicorn master, once per
generation, from the validated settings, and inherited by every worker through fork.
`check(model)` runs there too, before any fork, against the model's inputs and outputs
as the preflight subprocess read them (the master never imports onnxruntime, and
neither does a task). Anything that must not cross fork (a thread pool, a socket) is
made in `start_in_worker`, which each worker calls after fork, with its core count.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from onnxpool.config.loader import ConfigError
from onnxpool.config.settings import Settings
from onnxpool.tasks.errors import OnnxpoolError
from onnxpool.workers.model_info import ModelInfo

BytesLike = bytes | bytearray | memoryview
Feeds = Mapping[str, np.ndarray]
Outputs = Mapping[str, np.ndarray]
JsonDocument = Any
"""What `json.dumps`/orjson can write: dicts, lists, str, numbers, bools, None, numpy arrays."""


class TaskSettings(BaseModel):
    """Base of a task's `[task]` table: unknown keys are errors, values checked strictly."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class TaskConfigError(ConfigError):
    """The task and the settings or the model do not fit; one line for an operator (exit 1 at start)."""


class RequestParts(Protocol):
    """What a task may read of one request; the server provides it, HTTP stays out of the task."""

    @property
    def route(self) -> str:
        """The route that took the request, as declared in `Task.routes` (e.g. "/predict")."""

    @property
    def content_type(self) -> str:
        """The whole Content-Type header ("" when absent), parameters included."""

    @property
    def mimetype(self) -> str:
        """The Content-Type's media type alone, lower-cased ("" when absent)."""

    @property
    def query(self) -> Mapping[str, str]:
        """Query parameters (the first value of a repeated name)."""

    def body(self) -> bytes:
        """The body, read on first call (413 past `[server] max_body_bytes`)."""


class Runner(Protocol):
    """What the server hands `Task.run`: the worker's session, and the request's phase timer."""

    def infer(self, feeds: Feeds, output_names: Sequence[str] | None = None) -> Outputs:
        """One inference on the worker's session (phase "infer"); None: every output."""

    def phase(self, name: str) -> AbstractContextManager[None]:
        """Time a block as phase `name` of the request (`Server-Timing`, the phase histogram)."""


InputsT = TypeVar("InputsT")
SettingsT = TypeVar("SettingsT", bound=TaskSettings)


class Task(ABC, Generic[InputsT, SettingsT]):
    """Base of every task, built-in or the user's; subclass it and name it in `[model] task`.

    Class attributes declare what the server needs to know before any request:
    `name`, the `[task]` table's model, the routes and the content types.
    """

    name: ClassVar[str]
    """Short name, shown in metrics (`task` label), logs and `/v2/models/<m>` metadata."""
    settings_model: ClassVar[type[TaskSettings]] = TaskSettings
    """The pydantic model of this task's `[task]` table (validated in the master at load)."""
    routes: ClassVar[tuple[str, ...]] = ("/predict",)
    """POST routes that run this task (werkzeug rules; `<model>` must name the served model)."""
    content_types: ClassVar[tuple[str, ...]] = ("application/json",)
    """Media types `read` accepts (documentation and OpenAPI; `read` enforces them)."""

    def __init__(self, settings: Settings, options: SettingsT) -> None:
        """Built in the master once per generation: read files here (labels...), not per request."""
        self.settings = settings
        self.options = options

    def fingerprint(self) -> str:
        """What this task read at start that shapes its replies (labels, a vocabulary...), as text.

        Part of every response-cache key, with the settings: a changed labels file must not
        be answered from replies made with the old one. "" when the task reads no files.
        """
        return ""

    def check(self, model: ModelInfo) -> None:
        """Master, before fork: raise TaskConfigError if this model cannot serve this task."""

    def start_in_worker(self, cores: int) -> None:
        """Worker, after fork, before traffic: make what must not cross fork (thread pools), sized to `cores`."""

    @abstractmethod
    def read(self, request: RequestParts) -> InputsT:
        """Parse and check one request; raise an `onnxpool.tasks.errors` exception naming what is wrong."""

    @abstractmethod
    def canonical(self, inputs: InputsT) -> Sequence[BytesLike]:
        """The bytes that identify the reply: equal bytes <=> the same reply (the response cache's key).

        Include every parameter that changes the reply; leave out what does not (framing,
        file names, key order). The server adds the model's digest and the settings.
        """

    @abstractmethod
    def feeds(self, inputs: InputsT, model: ModelInfo) -> Feeds:
        """The model's inputs, by name, batched (first dimension = items of this request)."""

    def output_names(self, model: ModelInfo) -> Sequence[str] | None:
        """The outputs `reply` needs (None: all of them)."""
        return None

    def run(self, inputs: InputsT, model: ModelInfo, runner: Runner) -> Outputs:
        """The model's outputs for these inputs: by default ONE inference of `feeds` (all items as one batch).

        `runner.infer` runs the worker's session (timed as phase "infer", batch size counted);
        `runner.phase(name)` times a block of your own. Override to run several smaller
        batches, e.g. inputs of very different lengths sorted into sub-batches so that short
        ones are not padded to the longest; keep the outputs in the order of the inputs.
        """
        with runner.phase("decode"):
            feeds = self.feeds(inputs, model)
        return runner.infer(feeds, self.output_names(model))

    @abstractmethod
    def reply(self, inputs: InputsT, outputs: Outputs) -> JsonDocument:
        """The reply document (sent as JSON, status 200)."""

    def tensor_signature(self, model: ModelInfo) -> ModelInfo | None:
        """The tensors v2 clients see (`/v2/models/<m>` metadata and infer); None: the model's own.

        A task whose callers send what the model does not take (text, where the model takes
        token ids) returns the tensors of its own interface, e.g. a `text` input of strings
        (`tensor(string)`, BYTES on the wire) and an `embedding` output. v2 infer then
        decodes against it and runs `from_tensors` -> `feeds` -> the model -> `to_tensors`.
        """
        return None

    def from_tensors(self, tensors: Mapping[str, np.ndarray]) -> InputsT:
        """v2 infer with a `tensor_signature`: the decoded tensors as this task's inputs."""
        raise NotImplementedError(f"task {self.name} has a tensor signature but no from_tensors")

    def to_tensors(self, inputs: InputsT, outputs: Outputs) -> dict[str, np.ndarray]:
        """v2 infer with a `tensor_signature`: the model's outputs as the signature's outputs."""
        raise NotImplementedError(f"task {self.name} has a tensor signature but no to_tensors")

    def error_document(self, error: OnnxpoolError) -> JsonDocument:
        """The body of an error reply on this task's routes (status and headers are the error's).

        onnxpool's shape by default, `{"error": message}`; a task that speaks another API
        answers in that API's shape (OpenAI's `{"error": {"message", "type", ...}}`), so its
        clients' own error handling works, for the API key and shedding refusals too.
        """
        return {"error": error.message}

    def openapi(self, route: str) -> dict[str, Any]:
        """The OpenAPI operation of `route` (summary, requestBody, responses); a default by default."""
        return {
            "summary": f"Run the {self.name} task",
            "requestBody": {
                "required": True,
                "content": {media: {"schema": {}} for media in self.content_types},
            },
            "responses": {"200": {"description": "the task's reply", "content": {"application/json": {"schema": {}}}}},
        }
