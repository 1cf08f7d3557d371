"""One request, one state: everything the layers learn about a request, in one object.

The instrumentation middleware (`server.instrument`) makes it first, as the request
arrives, and keeps it in the WSGI environ under one key; every later layer (the gates,
the response cache's front door `server.front`, Flask's routes, the metrics on the way
out) reads and adds to the same object, so nothing is parsed, hashed, checked or
counted twice: the body is read once, the gates run once, the task reads the request
once, the cache is looked up once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from flask import has_request_context, request

from onnxpool.cache.policy import Lookup
from onnxpool.server.timing import RequestTimer
from onnxpool.tasks.errors import OnnxpoolError

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIEnvironment

ENVIRON_KEY = "onnxpool.request"

# Values of the `cache` metric label: replayed, computed after a look-up, or not looked up at all.
HIT, MISS, NOT_LOOKED_UP = "hit", "miss", "none"


@dataclass(slots=True, eq=False)
class RequestState:
    """What is known about one request so far (see the module doc)."""

    timer: RequestTimer
    """Phases and total; carries the proxy's X-Request-Start for admission control."""
    request_id: str = ""
    cache_control: str | None = None
    pragma: str | None = None
    """The request's Cache-Control and Pragma, straight from the WSGI environ: the server has
    already joined repeated header lines with commas (RFC 9110 5.3), and werkzeug's
    `headers.getlist` would walk the whole environ."""
    body: bytes | None = None
    """The body once read (`server.context.read_body`)."""
    gates_passed: bool = False
    """The app's gates ran and let the request through (they never run twice)."""
    refusal: OnnxpoolError | None = None
    """A gate's or the task reader's refusal met before Flask, which renders it."""
    inputs: Any = None
    """What the task read from the request (`Task.read`), once."""
    lookup: Lookup | None = None
    """The response cache's look-up of this request, once."""
    labels: tuple[str, str] | None = None
    """Bounded (model, endpoint) metric labels, set by whoever answers."""
    cache: str = NOT_LOOKED_UP
    """The `cache` metric label: hit, miss or none."""
    extra: dict[str, Any] = field(default_factory=dict)

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
        return state


def current_timer() -> RequestTimer | None:
    """The timer of the request Flask is serving, if any."""
    if not has_request_context():
        return None
    state: RequestState | None = request.environ.get(ENVIRON_KEY)
    return state.timer if state is not None else None


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Time the block as phase `name` of the current request (no-op outside one, so library code may use it)."""
    timer = current_timer()
    if timer is None:
        yield
        return
    with timer.phase(name):
        yield
