"""Who is calling: the request's caller, and the 403 for a model that caller may not use.

With keys (`[callers] identify = "key"`) the auth gate has already named the caller from its key.
Otherwise the caller is the value of `[callers] header` (set by the calling backend or a gateway),
or the one nginx found for the client's address (`X-Onnxpool-Caller`: onnxpool's nginx always
sets it, replacing a client's own). A name that is no known caller is `anonymous`, so the metric
labels stay bounded. Nothing here when callers are not told apart: behaviour is as without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flask import Flask
from werkzeug.wrappers import Request

from onnxpool.config.callers import ANONYMOUS, CALLER_HEADER, CallerBook
from onnxpool.server import gates
from onnxpool.server.auth import METRICS_PATH, OPEN_PREFIXES, bearer_token
from onnxpool.server.gates import Gate
from onnxpool.server.request_state import RequestState
from onnxpool.tasks.errors import Forbidden

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIEnvironment


def gate(book: CallerBook, model: str, aliases: tuple[str, ...]) -> Gate:
    """The check (server.gates, after auth): name the caller; 403 when it may not use this model."""
    header = CALLER_HEADER if book.settings.identify == "address" else book.settings.header

    def check_caller(req: Request) -> None:
        path = req.path
        if path.startswith(OPEN_PREFIXES) or path == METRICS_PATH:
            return
        state = RequestState.of(req.environ)
        name = state.caller if book.settings.identify == "key" else req.headers.get(header)
        caller = book.get(name) if name else None
        state.caller = caller.name if caller is not None else ANONYMOUS
        if caller is not None and not caller.may_use(model, aliases):
            raise Forbidden(
                f"caller {caller.name} may not use model {model} (its [caller.{caller.name}] models: "
                f"{', '.join(caller.settings.models)})"
            )

    return check_caller


def lane_of(book: CallerBook, bound: int, environ: WSGIEnvironment) -> int:
    """The lane of a request that came by no lane socket (a gRPC call): its caller's, named as the gates
    name it (its key, or the caller header: onnxpool's nginx sets it); 0 for no known caller, or a lane
    past the `bound` ones (workers/lanes.py, where a worker chooses between lanes)."""
    if not book.enabled:
        return 0
    if book.settings.identify == "key":
        token = bearer_token(environ.get("HTTP_AUTHORIZATION"))
        name = book.caller_of_key(token) if token is not None else None
    else:
        header = CALLER_HEADER if book.settings.identify == "address" else book.settings.header
        name = environ.get("HTTP_" + header.upper().replace("-", "_"))
    caller = book.get(name) if name else None
    return caller.lane if caller is not None and caller.lane <= bound else 0


def install(app: Flask, book: CallerBook, model: str, aliases: tuple[str, ...]) -> None:
    """Add the check to the app's gates when callers are told apart."""
    if book.enabled:
        gates.add(app, gate(book, model, aliases))
