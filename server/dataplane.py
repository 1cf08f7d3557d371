"""The data plane: the one path of every request that runs the model, hit or miss.

    gates -> read -> cache look-up -> run -> reply -> store -> render

A WSGI layer between the instrumentation (`server.instrument`: the request's state, timer,
request id, metrics, Server-Timing) and Flask. It takes a POST to one of this model's exact
operation paths: each of the task's routes (`Task.routes` with the model's name) and v2
infer (`/v2/models/<m>/infer`, with and without `/versions/<v>`), and answers it here, in
order, in one function:

1. the app's gates (`server.gates`: body size, API key, admission), on a werkzeug Request;
2. 503 while this worker's model is not loaded;
3. the operation reads the request (phase "decode");
4. the response cache looks it up when the operation gives it a key; a hit is rendered by
   the cache (`ReplyCache.replay`) and is done;
5. otherwise the operation runs the model through ONE per-request runner (`server.runner`)
   and renders its reply; a 200 is stored;
6. any refusal (`OnnxpoolError`, 4xx/5xx) is rendered in the operation's error shape (the
   task's: OpenAI's for embeddings); anything else is a logged 500 and the worker lives on.

Everything else (metadata, health, metrics, OpenAPI, a URL naming another model: 404) is
Flask's. Flask's request context, URL matching and Response objects cost as much again as a
cache hit's own work; this path needs none of them.

Endpoints do transport; the operations (`server.operations`) say what a kind of request
means; the task (`onnxpool.tasks.api.Task`) does the model's pre- and post-processing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from werkzeug.exceptions import HTTPException
from werkzeug.wrappers import Request

from onnxpool.server import gates
from onnxpool.server.context import ServerContext
from onnxpool.server.operations import Operation, V2Infer
from onnxpool.server.reply import Reply
from onnxpool.server.request_parts import HttpRequestParts
from onnxpool.server.request_state import RequestState
from onnxpool.server.runner import RequestRunner
from onnxpool.server.served import loaded_model
from onnxpool.tasks.errors import OnnxpoolError

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

log = logging.getLogger("onnxpool.server")


@dataclass(frozen=True)
class Route:
    """An operation at one exact path; `rule` is its route template (the `endpoint` metric label)."""

    rule: str
    operation: Operation


class DataPlane:
    """WSGI layer that serves the model's operations, before Flask (see the module doc)."""

    def __init__(
        self, app: WSGIApplication, ctx: ServerContext, app_gates: Sequence[gates.Gate], routes: Mapping[str, Route]
    ) -> None:
        self.app = app
        self.ctx = ctx
        self.gates = app_gates
        self.routes = dict(routes)
        self.model_name = ctx.settings.model.name
        self.max_body = ctx.settings.server.max_body_bytes
        self.record_metrics = ctx.settings.metrics.enabled

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        route = self.routes.get(environ.get("PATH_INFO", ""))
        if route is None or environ.get("REQUEST_METHOD") != "POST":
            return self.app(environ, start_response)
        reply = self.serve(environ, route)
        start_response(reply.status_line(), reply.wsgi_headers())
        return [reply.body]

    def serve(self, environ: WSGIEnvironment, route: Route) -> Reply:
        """The reply to one request of `route`'s operation, whatever becomes of it."""
        state = RequestState.of(environ)
        state.labels = (self.model_name, route.rule)
        operation = route.operation
        # What the inference log keeps of the request (its parts as read): only while it is on in this worker.
        seen = _Seen() if self.ctx.inference_log.shipper is not None else None
        try:
            # The whole request marks this worker working (its decoding and encoding use its core too):
            # no other worker of the model starts a wide run on its cores meanwhile (workers/wide.py).
            with self.ctx.backend.occupied():
                reply = self._answer(environ, state, operation, route.rule, seen)
        except OnnxpoolError as exc:
            reply = _error_reply(operation, exc)
        except HTTPException as exc:  # werkzeug's own, e.g. a malformed header it parsed for us
            message = exc.description or exc.name
            reply = _error_reply(operation, OnnxpoolError(message, status=exc.code or 400))
        except Exception:  # a bug, not bad input: logged whole, a JSON 500, the worker lives on
            log.exception("unhandled error on POST %s", environ.get("PATH_INFO", ""))
            reply = _error_reply(operation, OnnxpoolError("internal server error", status=500))
        if seen is not None:
            self._keep_for_log(environ, state, operation, seen, reply)
        return reply

    def _keep_for_log(
        self, environ: WSGIEnvironment, state: RequestState, operation: Operation, seen: _Seen, reply: Reply
    ) -> None:
        # References only: the log's events are made after the reply has left (server.inference_log).
        parts, read = seen.parts, seen.read
        body = parts.body_read if parts is not None else None
        inputs = None if read is None else (lambda: operation.logged(read))
        v2 = operation.namespace == V2Infer.namespace  # its inputs view is its tensors: no body repeated
        try:
            self.ctx.inference_log.capture(environ, body, reply, inputs, state.timer.wall_ns, v2)
        except Exception:  # the log never fails a request: a bug here is a logged line, the reply goes out
            log.exception("inference log: request not logged")

    def _answer(
        self, environ: WSGIEnvironment, state: RequestState, operation: Operation, rule: str, seen: _Seen | None
    ) -> Reply:
        ctx = self.ctx
        req = Request(environ)
        # A body without Content-Length (chunked) ends one byte past the limit: `read_body` then says 413.
        req.max_content_length = self.max_body + 1
        parts = HttpRequestParts(req, rule, self.max_body)
        if seen is not None:
            seen.parts = parts
        gates.run(self.gates, req)
        loaded_model(ctx)
        timer = state.timer
        with timer.phase("decode"):
            read = operation.read(parts)
        if seen is not None:
            seen.read = read
        key = operation.key(read)
        looked = ctx.cache.look_up(state, operation.namespace, key) if key is not None else None
        if looked is not None and looked.reply is not None:
            reply = ctx.cache.replay(looked.reply)
        else:
            reply = operation.compute(read, RequestRunner(ctx.backend, timer, self.model_name, self.record_metrics))
            if looked is not None:
                ctx.cache.store(looked, reply, operation.replay_headers)
        reply = operation.finish(read, reply)
        if looked is not None:
            reply.headers.extend(ctx.cache.outcome_headers(looked))
        return reply


class _Seen:
    """What one request's parts and reading were, for the inference log (set as the data plane gets them)."""

    __slots__ = ("parts", "read")

    def __init__(self) -> None:
        self.parts: HttpRequestParts | None = None
        self.read: Any = None


def _error_reply(operation: Operation, error: OnnxpoolError) -> Reply:
    return Reply.json(operation.error_document(error), error.status, error.headers or None)
