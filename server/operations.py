"""What the data plane runs: a task's route, or v2 infer, each as read -> key -> compute -> finish.

An operation is the request-specific part of one kind of request that runs the model; the
data plane (`server.dataplane`) does the rest in one place for all of them: the gates, the
cache look-up, the store, the errors and the reply on the wire.

- `TaskOperation`: a route of the task (`Task.routes`): `task.read` -> `task.canonical` ->
  `task.run` -> `task.reply`, rendered as JSON; errors in the task's own shape.
- `V2Infer`: `/v2/models/<m>/infer` (Open Inference Protocol v2). The model's own tensors run
  straight on the session; a task with a `tensor_signature` (text in, embeddings out) runs
  `from_tensors` -> `run` -> `to_tensors`. Binary-tensor requests are cached: the key is the
  JSON header without its echo-only `id` plus the tensor bytes; the caller's id is put into
  the reply afterwards, hit or miss (JSON-tensor requests are not cached: keying them would
  parse the whole tensor body twice).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from onnxpool.cache.key import BytesLike, v2_request_payload
from onnxpool.server import admission, classification
from onnxpool.server.inference_log_events import v2_view
from onnxpool.server.reply import Reply
from onnxpool.server.reply_cache import Payload
from onnxpool.server.request_parts import HttpRequestParts
from onnxpool.server.runner import RequestRunner
from onnxpool.server.v2codec import (
    BINARY_HEADER,
    RequestLimits,
    decode_infer_request,
    encode_infer_response,
    parse_header_length,
    parse_infer_header,
)
from onnxpool.tasks import jsonfast
from onnxpool.tasks.api import JsonDocument, Task
from onnxpool.tasks.errors import OnnxpoolError, UnsupportedMediaType
from onnxpool.tasks.media_types import accepted_by
from onnxpool.workers.model_info import ModelInfo

AnyTask = Task[Any, Any, Any]
KeyPayload = Callable[[], Payload]


class Operation(Protocol):
    """One kind of request the data plane serves (see the module doc)."""

    namespace: str
    """The response cache's namespace: the task's name, or `v2-infer`."""
    replay_headers: tuple[str, ...]
    """Reply headers that belong to the result, stored and replayed with the body."""

    def read(self, parts: HttpRequestParts) -> Any:
        """Parse and check the request (phase "decode"); 4xx errors name what is wrong."""

    def key(self, read: Any) -> KeyPayload | None:
        """The request's canonical bytes for the cache (made only when needed), or None: never cached."""

    def compute(self, read: Any, runner: RequestRunner) -> Reply:
        """Run the model for the request and render the reply (a 200)."""

    def finish(self, read: Any, reply: Reply) -> Reply:
        """What a reply gets per request, computed or replayed (v2's echoed `id`)."""

    def error_document(self, error: OnnxpoolError) -> JsonDocument:
        """The body of an error reply to this kind of request."""

    def logged(self, read: Any) -> JsonDocument | None:
        """The inference log's readable view of the request's inputs (None: the body as received)."""


VERDICTS_KEPT = 64


class TaskOperation:
    """A route of the task: read -> canonical -> run -> reply (docs/TASKS.md)."""

    replay_headers: tuple[str, ...] = ()

    def __init__(self, task: AnyTask) -> None:
        self.task = task
        self.namespace = task.name
        self._cached = task.caches_replies()
        self._content_types = task.content_types
        self._verdicts: dict[str, bool] = {}
        """Whether each media type seen is accepted (on every request's path, a cache hit's too)."""

    def read(self, parts: HttpRequestParts) -> Any:
        # `content_types` is the task's contract: what it does not declare never reaches its `read`.
        verdict = self._verdicts.get(parts.mimetype)
        if verdict is None:
            verdict = accepted_by(parts.mimetype, self._content_types)
            if len(self._verdicts) < VERDICTS_KEPT:  # the types clients send: a few, but any text
                self._verdicts[parts.mimetype] = verdict
        if not verdict:
            raise UnsupportedMediaType(self.task.not_accepted(parts))
        return self.task.read(parts)

    def key(self, read: Any) -> KeyPayload | None:
        canonical = self.task.canonical(read) if self._cached else None
        return None if canonical is None else lambda: canonical

    def compute(self, read: Any, runner: RequestRunner) -> Reply:
        result = self.task.run(read, runner)  # feeds ("decode") and inference(s) ("infer")
        with runner.phase("encode"):
            return Reply.json(self.task.reply(read, result))

    def finish(self, read: Any, reply: Reply) -> Reply:
        return reply

    def error_document(self, error: OnnxpoolError) -> JsonDocument:
        return self.task.error_document(error)

    def logged(self, read: Any) -> JsonDocument | None:
        return self.task.logged(read)


@dataclass(frozen=True, slots=True)
class V2Request:
    """A v2 infer request as read: its body, the binary extension's header length, its JSON header."""

    body: bytes
    header_length: int | None
    header: dict[str, Any]

    @property
    def keyed(self) -> bool:
        """Cached (binary tensors with a string `id` or none): the reply is made without the id."""
        return self.header_length is not None and isinstance(self.header.get("id", ""), str)


class V2Infer:
    """`/v2/models/<m>/infer` (see the module doc)."""

    namespace = "v2-infer"
    replay_headers: tuple[str, ...] = (BINARY_HEADER,)

    def __init__(
        self,
        task: AnyTask,
        model: ModelInfo,
        name: str,
        version: str,
        limits: RequestLimits,
        log_elements: int | None = None,
    ) -> None:
        self.task = task
        self.signature = task.tensor_signature()
        """The task's own tensors, or None: the model's."""
        self.tensors = self.signature or model
        self.name, self.version = name, version
        self.limits = limits
        self.log_elements = log_elements
        """The inference log's files: tensors larger than this are recorded by their digest ([inference_log])."""

    def read(self, parts: HttpRequestParts) -> V2Request:
        body = parts.body()  # first: an oversized body is a 413 even when the binary header is bad too
        header_length = parse_header_length(parts.header(BINARY_HEADER))
        return V2Request(body, header_length, parse_infer_header(body, self.limits, header_length))

    def key(self, read: V2Request) -> KeyPayload | None:
        if not read.keyed:
            return None
        assert read.header_length is not None
        payload: list[BytesLike] = [v2_request_payload(read.header), memoryview(read.body)[read.header_length :]]
        return lambda: payload

    def compute(self, read: V2Request, runner: RequestRunner) -> Reply:
        task, signature = self.task, self.signature
        with runner.phase("decode"):
            decoded = decode_infer_request(
                read.body, self.tensors, self.limits, read.header_length, signature is not None, read.header
            )
        admission.check_infer_timeout(decoded.parameters, runner.timer)
        if signature is None:
            outputs = runner.infer(decoded.inputs, decoded.output_names)
        else:  # the task's own tensors: through the task, like its routes
            with runner.phase("decode"):
                inputs = task.from_tensors(decoded.inputs)
            result = task.run(inputs, runner)
            with runner.phase("encode"):
                tensors = task.to_tensors(inputs, result)
                wanted = decoded.output_names
                outputs = {name: tensors[name] for name in wanted} if wanted is not None else tensors
        if decoded.classification:
            with runner.phase("encode"):
                outputs = classification.apply(outputs, decoded.classification, task.class_names())
        with runner.phase("encode"):
            encoded = encode_infer_response(
                self.name, self.version, None if read.keyed else decoded.id, outputs, decoded.binary_outputs
            )
            return Reply(200, list(encoded.headers.items()), encoded.body)

    def finish(self, read: V2Request, reply: Reply) -> Reply:
        request_id = read.header.get("id")
        if read.keyed and isinstance(request_id, str) and reply.status == 200:
            return with_v2_id(reply, request_id)
        return reply

    def error_document(self, error: OnnxpoolError) -> JsonDocument:
        return {"error": error.message}

    def logged(self, read: V2Request) -> JsonDocument | None:
        # Named tensors with shape, datatype and their data inline (binary tensors decoded; large ones digested).
        return v2_view(read.body, read.header_length, self.log_elements)


def with_v2_id(reply: Reply, request_id: str) -> Reply:
    """A v2 reply encoded without the request's echoed `id`, with it (hit or computed alike).

    The v2 encoder writes `"id"` as the last member of the reply's JSON document, so this
    gives the bytes it would have written with the id (tests/test_cache_http.py checks it);
    the binary extension's header-length header grows with it.
    """
    body = reply.body
    raw_length = reply.header(BINARY_HEADER)
    length = int(raw_length) if raw_length is not None else len(body)
    member = b',"id":' + jsonfast.dumps(request_id)
    headers = [(name, str(length + len(member)) if name == BINARY_HEADER else value) for name, value in reply.headers]
    return Reply(reply.status, headers, body[: length - 1] + member + body[length - 1 :])
