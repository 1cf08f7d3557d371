"""The front door of the task routes: gates once, the task's reading once, cache hits before Flask.

A hit's own work is small: read the request, hash it, one read from the store. Flask's
work around it (request context, URL matching, before/after hooks, the Response object)
took as long again on a worker that is not hot in the CPU's caches, so a hit is answered
by this WSGI layer, which sits between the instrumentation (`server.instrument`: the
request's state, timer, request id, metrics, Server-Timing) and Flask:

1. only a POST to one of the task's exact paths (`Task.routes` with this model's name),
   with a Content-Length, while the cache is open and the model loaded; anything else
   goes straight to Flask;
2. the app's gates (`server.gates`: body size, API key, admission), in their order, on a
   werkzeug Request (no Flask request context), once: the request's state remembers that
   they passed, or the refusal, and Flask's hook does not run them again;
3. the task's reading of the request (`routes_task.read_inputs`) and the cache's look-up,
   both kept in the request's state;
4. a hit is replied here with the headers Flask would send; a miss, a no-cache/no-store
   request and any refusal go on to Flask, which finds all of the above already done
   (a refusal is raised there and rendered by the one error handler).

It knows the task only through its routes and its canonical bytes; no route is named here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from werkzeug.wrappers import Request

from onnxpool.server import gates
from onnxpool.server.context import ServerContext
from onnxpool.server.request_state import RequestState
from onnxpool.server.routes_task import read_inputs, task_paths
from onnxpool.tasks.errors import OnnxpoolError

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment


log = logging.getLogger("onnxpool.cache")


class Front:
    """WSGI layer in front of Flask that answers the task routes' cache hits (see the module doc)."""

    def __init__(self, app: WSGIApplication, ctx: ServerContext, app_gates: Sequence[gates.Gate]) -> None:
        self.app = app
        self.ctx = ctx
        self.gates = app_gates
        self.model_name = ctx.settings.model.name
        self.rules = task_paths(ctx)  # exact PATH_INFO -> the route's rule (a metric label)

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        rule = self.rules.get(environ.get("PATH_INFO", ""))
        if rule is not None and environ.get("REQUEST_METHOD") == "POST":
            reply = self._hit(environ, rule)
            if reply is not None:
                headers, body = reply
                start_response("200 OK", headers)
                return [body]
        return self.app(environ, start_response)

    def _hit(self, environ: WSGIEnvironment, rule: str) -> tuple[list[tuple[str, str]], bytes] | None:
        ctx = self.ctx
        # Without a Content-Length (chunked) Flask's MAX_CONTENT_LENGTH bounds the read; and
        # before the model is loaded the route answers 503. Both are Flask's to handle.
        if not ctx.cache.active or ctx.backend.info is None:
            return None
        req = Request(environ)
        if req.content_length is None:
            return None
        state = RequestState.of(environ)
        task = ctx.task
        try:
            gates.run_once(self.gates, req, state)
            with state.timer.phase("decode"):
                inputs = read_inputs(req, ctx, rule)
            looked = ctx.cache.look_up(state, task.name, lambda: task.canonical(inputs), {})
        except OnnxpoolError as exc:  # refused: kept for Flask, which raises it again and renders it
            state.refusal = exc
            return None
        except Exception:  # a bug: logged, and the request is still served (through Flask)
            log.exception("front door failed on %s; the request goes on to Flask", rule)
            return None
        if looked is None:
            return None
        reply = ctx.cache.hit_reply(looked)
        if reply is not None:
            state.labels = (self.model_name, rule)
        return reply
