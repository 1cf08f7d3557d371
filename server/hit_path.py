"""Response-cache hits of the image endpoints, answered before Flask.

A hit's own work is small: read the upload, hash it, one read from the store.
Flask's work around it (request context, URL matching, before/after hooks, the
Response object) took as long again on a worker that is not hot in the CPU's
caches, so a hit of `/predict` or `/v2/models/<model>/classify` is answered by
this WSGI layer, which sits between the instrumentation (`server.instrument`:
timer, request id, metrics, Server-Timing) and Flask:

1. only a POST to one of those exact paths, with a Content-Length, while the
   cache is open and the model loaded; anything else goes straight to Flask;
2. the app's own gates (`server.gates`: body size, API key, admission), in
   their order, on a werkzeug Request (no Flask request context);
3. the route's own reader (`routes_image.read_image_request`) and the cache's
   own lookup (`ReplyCache.look_up`);
4. a hit is replied here with the headers Flask would send; a miss, a
   no-cache/no-store request and any refusal or error go on to Flask.

Nothing here decides anything on its own: every check is the one Flask runs.
Both the reading and the lookup are kept in the WSGI environ, so on a miss the
route finds the request already read and looked up: the body is parsed and the
key hashed once, and the miss counted once. A refused request is refused again
by Flask, which answers with the error.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

from werkzeug.wrappers import Request

from onnxpool.server import gates, instrument, timing
from onnxpool.server.context import ServerContext
from onnxpool.server.errors import OnnxpoolError
from onnxpool.server.routes_image import CACHE_ENDPOINT, image_paths, read_image_request

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment


log = logging.getLogger("onnxpool.cache")


class HitPath:
    """WSGI layer in front of Flask that answers the image endpoints' cache hits (see the module doc)."""

    def __init__(self, app: WSGIApplication, ctx: ServerContext, app_gates: Sequence[gates.Gate]) -> None:
        self.app = app
        self.ctx = ctx
        self.gates = app_gates
        self.model_name = ctx.settings.model.name
        self.rules = image_paths(self.model_name)  # exact PATH_INFO -> the route's rule (a metric label)

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
        timer: timing.RequestTimer | None = environ.get(timing.ENVIRON_KEY)
        try:
            gates.run(self.gates, req)
            with timer.phase("decode") if timer is not None else nullcontext():
                asked = read_image_request(req, ctx)
            looked = ctx.cache.look_up(environ, CACHE_ENDPOINT, asked.cache_params(), asked.images)
        except OnnxpoolError:  # refused: Flask meets the same refusal and renders it
            return None
        except Exception:  # a bug: logged, and the request is still served (through Flask)
            log.exception("hit path failed on %s; the request goes on to Flask", rule)
            return None
        if looked is None:
            return None
        reply = ctx.cache.hit_reply(looked)
        if reply is not None:
            asked_model: Any = self.model_name if "<model>" in rule else None
            environ[instrument.LABELS_KEY] = instrument.metric_labels(self.model_name, rule, asked_model, timer)
        return reply
