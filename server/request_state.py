"""One request, one state: what the request is and what happened to it, in one object.

The instrumentation middleware (`server.instrument`) makes it as the request arrives and
keeps it in the WSGI environ under one key; the data plane (`server.dataplane`) or Flask's
routes record what became of the request (its metric labels, whether the response cache
answered it), and the middleware reads it again as the reply leaves. It holds facts, not
hand-offs between layers: each request takes exactly one path, so nothing here says who
already did what. No Flask: the state is plain data over the WSGI environ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from onnxpool.server.timing import RequestTimer

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIEnvironment

ENVIRON_KEY = "onnxpool.request"

PROTOCOL_KEY = "onnxpool.protocol"
"""Environ key of a request that did not come over HTTP: its transport (the `protocol` metric label)."""
HTTP, GRPC = "http", "grpc"

# Values of the `cache` metric label: replayed, computed after a look-up, or not looked up at all.
HIT, MISS, NOT_LOOKED_UP = "hit", "miss", "none"


@dataclass(slots=True, eq=False)
class RequestState:
    """What is known about one request (see the module doc)."""

    timer: RequestTimer
    """Phases and total; carries the proxy's X-Request-Start for admission control."""
    request_id: str = ""
    cache_control: str | None = None
    pragma: str | None = None
    """The request's Cache-Control and Pragma, straight from the WSGI environ: the server has
    already joined repeated header lines with commas (RFC 9110 5.3), and werkzeug's
    `headers.getlist` would walk the whole environ."""
    labels: tuple[str, str] | None = None
    """Bounded (model, endpoint) metric labels, set by whoever answers."""
    cache: str = NOT_LOOKED_UP
    """The `cache` metric label: hit, miss or none."""
    caller: str | None = None
    """The caller (config/callers.py) when callers are told apart: a bounded metric label."""
    protocol: str = HTTP
    """The transport it came by (`http`, or `grpc`: server.grpc_service): a metric label."""

    @classmethod
    def of(cls, environ: WSGIEnvironment) -> RequestState:
        """The request's state (made here, without a proxy stamp, if no middleware made one)."""
        state: RequestState | None = environ.get(ENVIRON_KEY)
        if state is None:
            state = environ[ENVIRON_KEY] = cls.arriving(environ, RequestTimer())
        return state

    @classmethod
    def arriving(cls, environ: WSGIEnvironment, timer: RequestTimer, request_id: str = "") -> RequestState:
        """The state of a request seen now (kept in `environ`)."""
        state = environ[ENVIRON_KEY] = cls(
            timer, request_id, environ.get("HTTP_CACHE_CONTROL"), environ.get("HTTP_PRAGMA")
        )
        protocol = environ.get(PROTOCOL_KEY)
        if protocol is not None:
            state.protocol = protocol
        return state
