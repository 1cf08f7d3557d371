"""The task API (second version): a model's own pre- and post-processing, written once, beside the model.

A task turns what a client sends into the model's inputs and the model's outputs into
the reply. The server does everything around it: HTTP, gates (size, API key, shedding),
the response cache, timing and metrics, the one onnxruntime session per worker. A task
knows nothing of HTTP: it sees a request through `RequestParts` and answers a JSON
document; errors are the exceptions of `onnxpool.tasks.errors`, each carrying its status.

The life of a request to a task's route (`Task.routes`, each a POST), in the server's one
request path (`onnxpool.server.dataplane`):

    inputs = task.read(parts)              # phase "decode": parse and check what was sent
    key    = task.canonical(inputs)        # the bytes the response cache keys on (None: never cached)
    result = task.run(inputs, runner)      # by default: ONE batched inference of
                                           #   task.feeds(inputs) (phase "decode") for
                                           #   task.output_names() (phase "infer")
    reply  = task.reply(inputs, result)    # phase "encode": a JSON document

`run` returns whatever the task wants `reply` to get (by default the model's outputs by
name): per-request facts that are no tensor, such as the original image sizes a detector
rescales its boxes to or the token count of an embeddings reply, travel in it.

Process rules (docs/TASKS.md): a task object is built in the gunicorn master, once per
generation, from its validated `[task]` table, and inherited by every worker through fork.
`bind(model)` runs there too, before any fork, with the model's inputs and outputs as the
preflight subprocess read them (the master never imports onnxruntime, and neither does a
task): it checks that the model fits and keeps what requests need of it; afterwards
`self.model` is the model. Anything that must not cross fork (a thread pool, a socket) is
made in `start_in_worker`, which each worker calls after fork, with its core count.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

from onnxpool.config.loader import ConfigError
from onnxpool.config.settings import LimitsSettings
from onnxpool.tasks import jsonfast
from onnxpool.tasks.describe import default_operation
from onnxpool.tasks.errors import OnnxpoolError
from onnxpool.tasks.media_types import not_accepted
from onnxpool.workers.model_info import ModelInfo

BytesLike = bytes | bytearray | memoryview
Feeds = Mapping[str, np.ndarray]
Outputs = Mapping[str, np.ndarray]
JsonDocument = Any
"""What `json.dumps`/orjson can write: dicts, lists, str, numbers, bools, None, numpy arrays."""


PATH_BASE = "onnxpool.path_bases"
"""Validation-context key: per `[task]` key, the folder a relative path in it resolves against (the
settings file's, or the current directory for a value from the environment)."""


class TaskSettings(BaseModel):
    """Base of a task's `[task]` table: unknown keys are errors, values checked strictly.

    A field typed `Path` (or `Path | None`, or a tuple of paths) given as a relative path is
    resolved against the folder of the settings file it came from, like `[model] path`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    @field_validator("*", mode="after")
    @classmethod
    def _resolve_relative_paths(cls, value: Any, info: ValidationInfo) -> Any:
        bases = (info.context or {}).get(PATH_BASE) or {}
        base = bases.get(info.field_name) if info.field_name else None
        if base is None:
            return value
        if isinstance(value, Path):
            return _resolved(value, base)
        if isinstance(value, tuple) and value and all(isinstance(item, Path) for item in value):
            return tuple(_resolved(item, base) for item in value)
        return value


def _resolved(path: Path, base: Path) -> Path:
    path = path.expanduser()
    return path if path.is_absolute() or not str(path) else (base / path).resolve()


class TaskConfigError(ConfigError):
    """The task and the settings or the model do not fit; one line for an operator (exit 1 at start)."""


@dataclass(frozen=True)
class ServedModel:
    """What a task knows of the model it serves besides its tensors: from the settings, in the master."""

    name: str
    """`[model] name`: the name in URLs, replies and metrics."""
    version: str
    path: Path
    """The model file as configured (its folder holds a text model's tokenizer.json, config.json...).
    Workers run a validated copy of it; read files beside it at start, never per request."""
    limits: LimitsSettings
    """`[limits]`: max_batch, max_json_depth, the image limits... for `read` to enforce."""
    aliases: tuple[str, ...] = ()
    """`[model] aliases`: other names clients may use (a request body naming the model may say one)."""

    def known_as(self, name: str) -> bool:
        """`name` is this model's name or one of its aliases."""
        return name == self.name or name in self.aliases


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

    @property
    def headers(self) -> Mapping[str, str]:
        """The request's headers, read-only, names case-insensitive (`headers.get("X-Tenant")`)."""

    def body(self) -> bytes:
        """The body, read on first call (413 past `[server] max_body_bytes`, naming that setting)."""


@dataclass(frozen=True)
class SampleRequest:
    """A request a task makes for itself (`Task.sample_request`): `RequestParts` without HTTP."""

    route: str
    """One of the task's routes, `<model>` filled in (e.g. "/predict")."""
    content_type: str
    data: bytes
    query: Mapping[str, str] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def mimetype(self) -> str:
        return self.content_type.split(";", 1)[0].strip().lower()

    def body(self) -> bytes:
        return self.data


class Runner(Protocol):
    """What the server hands `Task.run`: the worker's session, and the request's phase timer."""

    def infer(self, feeds: Feeds, output_names: Sequence[str] | None = None) -> Outputs:
        """One inference on the worker's session (phase "infer"); None: every output."""

    def phase(self, name: str) -> AbstractContextManager[None]:
        """Time a block as phase `name` of the request (`Server-Timing`, the phase histogram)."""

    def span(self, name: str, attributes: Mapping[str, Any] | None = None) -> AbstractContextManager[dict[str, Any]]:
        """A step of your own as a span of the request's trace, when it is traced (`[tracing]`):

            with runner.span("tokenize", {"onnxpool.texts": len(texts)}) as span:
                encoded = tokenizer.encode(texts)
                span["onnxpool.tokens"] = encoded.token_count

        Nested in whatever phase or span it runs in; the dict it yields takes attributes learnt in the
        block (str, bool, int, float). Not a phase: Server-Timing and the metrics are unchanged. Untraced
        it times nothing and costs next to nothing (docs/TASKS.md)."""


InputsT = TypeVar("InputsT")
ResultT = TypeVar("ResultT")
SettingsT = TypeVar("SettingsT", bound=TaskSettings)


class Task(ABC, Generic[InputsT, ResultT, SettingsT]):
    """Base of every task, built-in or the user's; subclass it and name it in `[model] task`.

    Type parameters: what `read` returns, what `run` returns (the model's `Outputs` by
    default), and the `[task]` table's model. Class attributes declare what the server
    needs to know before any request: `name`, the `[task]` table's model, the routes and the
    content types (checked when the task is loaded: a bad one is one line at start).
    """

    name: ClassVar[str]
    """Short name, shown in metrics (`task` label), logs and `/v2/models/<m>` metadata."""
    settings_model: ClassVar[type[TaskSettings]] = TaskSettings
    """The pydantic model of this task's `[task]` table (validated in the master at load)."""
    routes: ClassVar[tuple[str, ...]] = ("/predict",)
    """POST routes that run this task (werkzeug rules; `<model>` must name the served model)."""
    content_types: ClassVar[tuple[str, ...]] = ("application/json",)
    """Media types `read` takes (`image/*` a wildcard): the server answers any other Content-Type with a
    415 before `read` (`not_accepted`), and the default `openapi` describes them. Where JSON is taken,
    so is a request without a Content-Type or with `curl -d`'s form type (the body must parse)."""

    model: ModelInfo
    """The model's inputs and outputs (and onnxpool.* metadata), set before `bind` is called."""

    def __init__(self, settings: SettingsT, served: ServedModel) -> None:
        """Built in the master once per generation: read files here (labels...), not per request."""
        self.settings = settings
        """The `[task]` table, validated by `settings_model`."""
        self.served = served

    def fingerprint(self) -> str:
        """What this task read at start that shapes its replies (labels, a vocabulary...), as text.

        Part of every response-cache key, with the settings: a changed labels file must not
        be answered from replies made with the old one. "" when the task reads no files.
        """
        return ""

    def bind(self, model: ModelInfo) -> None:
        """Master, before fork: check the model fits (TaskConfigError if not) and keep what requests need of it.

        `self.model` is already `model` here; per-request methods read it (or what this
        method worked out from it), never a model passed per call.
        """

    def sample_request(self) -> SampleRequest | None:
        """Master, after `bind`: a request this task must answer for this model (a photo, a row, a sentence).

        Before any worker is forked, the master runs it end to end on the model file workers will
        load (`onnxpool.tasks.rehearsal`): `read`, `run` (on the model, in a child process), `rehearsed`,
        `reply`. Any failure stops the start (or a HUP, which keeps the last good model) with one line,
        and the feeds the sample made are what every worker warms up with. None: no rehearsal (workers
        warm up on zeros).

        By default: the JSON example of the first route's OpenAPI operation (`openapi`, `describe(...,
        example=...)`), the body /docs offers callers, which therefore must work; None without one.
        """
        for route in self.routes:
            path = route.replace("<model>", self.served.name)
            try:
                content = self.openapi(path)["requestBody"]["content"]
                example = content["application/json"]["example"]
            except (KeyError, TypeError):
                continue
            return SampleRequest(route=path, content_type="application/json", data=jsonfast.dumps(example))
        return None

    def rehearsed(self, inputs: InputsT, result: ResultT) -> None:
        """Master, after the sample request's `run`, before its `reply`: settle what only real outputs tell
        (scores that already are probabilities, a ZipMap's class names), or raise TaskConfigError naming what
        does not fit and which setting fixes it."""

    def startup_lines(self) -> Sequence[str]:
        """Master, after `bind` and the rehearsal: what this task settled from the model, one line each, for
        the start-up log (`task <name>: <line>`): the scores it applies and why, the layout it feeds."""
        return ()

    def start_in_worker(self, cores: int) -> None:
        """Worker, after fork, before traffic: make what must not cross fork (thread pools), sized to `cores`."""

    def finish(self) -> None:
        """Worker, when it stops (graceful exit, HUP replacement): release what start_in_worker made; errors are
        logged, never raised."""

    @abstractmethod
    def read(self, request: RequestParts) -> InputsT:
        """Parse and check one request; raise an `onnxpool.tasks.errors` exception naming what is wrong."""

    def canonical(self, inputs: InputsT) -> Sequence[BytesLike] | None:
        """The bytes that identify the reply: equal bytes <=> the same reply (the response cache's key).

        Include every parameter that changes the reply; leave out what does not (framing,
        file names, key order). The server adds the model's digest and the settings. None:
        this request's reply is not cached; a task that does not override this method never
        has its replies cached (said once at start).
        """
        return None

    def feeds(self, inputs: InputsT) -> Feeds:
        """The model's inputs, by name, batched (first dimension = items of this request).

        Needed by the default `run` only.
        """
        raise NotImplementedError(f"task {self.name} overrides neither feeds nor run")

    def output_names(self) -> Sequence[str] | None:
        """The outputs the default `run` asks the session for (None: all of them)."""
        return None

    def run(self, inputs: InputsT, runner: Runner) -> ResultT:
        """What `reply` needs for these inputs: by default the model's outputs by name, from ONE
        inference of `feeds` (all items as one batch).

        `runner.infer` runs the worker's session (timed as phase "infer", batch size counted);
        `runner.phase(name)` times a block of your own; `runner.span(name)` traces one. Override to
        return your own result (the outputs plus what only decoding learns, such as the images' original sizes), or
        to run several smaller batches (inputs of very different lengths sorted into
        sub-batches, so that short ones are not padded to the longest).
        """
        with runner.phase("decode"):
            feeds = self.feeds(inputs)
        outputs: Any = runner.infer(feeds, self.output_names())
        return outputs  # type: ignore[no-any-return]

    @abstractmethod
    def reply(self, inputs: InputsT, result: ResultT) -> JsonDocument:
        """The reply document (sent as JSON, status 200)."""

    def logged(self, inputs: InputsT) -> JsonDocument | None:
        """What the inference log (`[inference_log]`, files) records of one request's inputs: what they mean
        for whoever reads the log later (features, strings, an image's digest), never a credential.

        Called in the worker's inference-log thread after the reply has left (read `self` only: the next
        request is served meanwhile), only for a request the log keeps; `onnxpool.tasks.logged`
        has the pieces (`tensors`, `digest`). None (the default): the body as received, its JSON document (any
        other body as its sha256 and size).
        """
        return None

    def class_names(self) -> Sequence[str] | None:
        """Names of a classifier's classes in output-index order, or None. The v2 `classification`
        output parameter (Open Inference Protocol's classification extension) labels its top classes
        with them."""
        return None

    def tensor_signature(self) -> ModelInfo | None:
        """The tensors v2 clients see (`/v2/models/<m>` metadata and infer); None: the model's own.

        A task whose callers send what the model does not take (text, where the model takes
        token ids) returns the tensors of its own interface, e.g. a `text` input of strings
        (`tensor(string)`, BYTES on the wire) and an `embedding` output. v2 infer then
        decodes against it and runs `from_tensors` -> `run` -> `to_tensors`.
        """
        return None

    def from_tensors(self, tensors: Mapping[str, np.ndarray]) -> InputsT:
        """v2 infer with a `tensor_signature`: the decoded tensors as this task's inputs."""
        raise NotImplementedError(f"task {self.name} has a tensor signature but no from_tensors")

    def to_tensors(self, inputs: InputsT, result: ResultT) -> dict[str, np.ndarray]:
        """v2 infer with a `tensor_signature`: `run`'s result as the signature's outputs."""
        raise NotImplementedError(f"task {self.name} has a tensor signature but no to_tensors")

    def not_accepted(self, request: RequestParts) -> str:
        """The message of the 415 the server answers, before `read`, to a request whose Content-Type
        is none of `content_types` (by default it names them)."""
        return not_accepted(request.mimetype, request.route, self.content_types)

    def error_document(self, error: OnnxpoolError) -> JsonDocument:
        """The body of an error reply on this task's routes (status and headers are the error's).

        onnxpool's shape by default, `{"error": message}`; a task that speaks another API
        answers in that API's shape (OpenAI's `{"error": {"message", "type", ...}}`), so its
        clients' own error handling works, for the API key and shedding refusals too.
        """
        return {"error": error.message}

    def openapi(self, route: str) -> dict[str, Any]:
        """The OpenAPI operation of `route` (summary, requestBody, responses): by default a body of each
        of `content_types`; `onnxpool.tasks.describe.describe` writes the common shapes in a line or two."""
        return default_operation(self.name, self.content_types)

    @classmethod
    def caches_replies(cls) -> bool:
        """Whether this task keys its replies (`canonical` overridden); the server says so once at start."""
        return cls.canonical is not Task.canonical
